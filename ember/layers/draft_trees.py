"""How many drafted tokens one tree may hold: the attention op masks a tree's rows with 64-bit words
(`PagedBatch.span_masks`), which must cover the tree's rows and the sequence's newest token.

Kept free of torch, so the engine's config can validate `medusa_tree_nodes` against it cheaply.
"""

MAX_TREE_NODES = 62  # a tree's rows and their newest token fit the attention op's 64-bit masks
