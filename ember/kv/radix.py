"""A token-granular radix tree over prompt token ids whose nodes own the KV blocks holding them.

The hash prefix cache (`ember.kv.hashing`) names whole blocks, so a prompt that leaves a cached one
mid-block reuses nothing of that block. Here an edge is any run of tokens: a match walks token by
token and may end inside a block, whose first tokens the new sequence then copies into a block of
its own (copy-on-write, see `KVCacheManager.allocate_slots`).

Ownership: a node names, per layer group, the blocks under its tokens; the block pool keeps their
reference counts. A block no sequence holds stays in the pool's LRU free list with its contents, and
the pool tells the tree when it hands that block out again (`evict`). Sequences release their blocks
last block first and hold every block of their path in a full-attention group, so the free list
reaches a node's blocks only after its descendants': the least recently used leaves go first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ember.kv.block_pool import KVBlock


@dataclass(eq=False)
class RadixNode:
    """Tokens `start` .. `end` of every prompt through this node, and the blocks that hold their KV.

    `blocks[g]` holds group g's blocks for block indices `start // block_size` .. `(end - 1) // block_size`
    (None where a windowed group's block was handed out again). A node that starts mid-block names
    its own block for that index: it holds the parent's tokens of the block too (written by the
    same sequence, or copied from the parent's block).
    """

    token_ids: list[int]
    start: int
    blocks: list[list[KVBlock | None]]
    parent: RadixNode | None = None
    children: dict[int, RadixNode] = field(default_factory=dict)
    is_attached: bool = True

    @property
    def end(self) -> int:
        """Position after the node's last token."""
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class RadixMatch:
    """The longest cached run of a prompt's first tokens: `num_tokens`, and each group's blocks under them.

    `blocks[g][i]` is the block of block index i (None: group g no longer has it).
    """

    num_tokens: int
    blocks: tuple[tuple[KVBlock | None, ...], ...]


class RadixTree:
    """Radix trees of token ids, one per partition (adapter, cache salt), over one block pool's blocks.

    Invariants: children of a node start with distinct tokens; a child starts where its parent
    ends; `owners[block]` is exactly the set of attached nodes naming `block`.
    """

    def __init__(self, block_size: int, num_groups: int, windowed_groups: frozenset[int] = frozenset()) -> None:
        self.block_size = block_size
        self.num_groups = num_groups
        self.windowed_groups = windowed_groups
        self.roots: dict[tuple, RadixNode] = {}
        self.owners: dict[KVBlock, set[RadixNode]] = {}

    def match(self, token_ids: Sequence[int], max_tokens: int, partition: tuple = ()) -> RadixMatch:
        """Walk `token_ids[:max_tokens]` down the tree token by token; the blocks of the deepest node touching each block index."""
        root = self.roots.get(partition)
        found: list[list[KVBlock | None]] = [[] for _ in range(self.num_groups)]
        position = 0
        node = root
        while node is not None and position < max_tokens:
            child = node.children.get(token_ids[position])
            if child is None:
                break
            matched = _common_length(child.token_ids, token_ids, position, max_tokens)
            first = child.start // self.block_size
            last = -(-(position + matched) // self.block_size)
            for group in range(self.num_groups):
                del found[group][first:]
                found[group].extend(child.blocks[group][: last - first])
            position += matched
            node = child if matched == len(child.token_ids) else None
        return RadixMatch(position, tuple(tuple(blocks) for blocks in found))

    def insert(self, token_ids: Sequence[int], num_tokens: int, group_blocks: Sequence[Sequence[KVBlock | None]],
               partition: tuple = ()) -> None:
        """Record that `group_blocks` (a sequence's block tables, one per group) hold `token_ids[:num_tokens]`.

        Tokens the tree has already keep the blocks they have (the same tokens, cached first), but a
        windowed group's hole is filled from the sequence's block.
        """
        node = self.roots.setdefault(partition, RadixNode([], 0, [[] for _ in range(self.num_groups)]))
        position = 0
        while position < num_tokens:
            child = node.children.get(token_ids[position])
            if child is None:
                self._add_leaf(node, token_ids, position, num_tokens, group_blocks)
                return
            matched = _common_length(child.token_ids, token_ids, position, num_tokens)
            if matched < len(child.token_ids):
                if position + matched == num_tokens:
                    self._fill_holes(child, group_blocks, position + matched)
                    return
                child = self._split(child, matched)
            self._fill_holes(child, group_blocks, child.end)
            position = child.end
            node = child

    def evict(self, block: KVBlock) -> None:
        """`block` is being handed out again: every node naming it forgets the tokens it held.

        A full-attention group's block ends its nodes' runs where the block starts (descendants go
        with it); a windowed group's block leaves a hole that matches must not need.
        """
        for node in list(self.owners.pop(block, ())):
            if node.is_attached:
                self._forget(node, block)

    def _add_leaf(self, parent: RadixNode, token_ids: Sequence[int], start: int, end: int,
                  group_blocks: Sequence[Sequence[KVBlock | None]]) -> None:
        first, last = start // self.block_size, -(-end // self.block_size)
        blocks = [list(blocks[first:last]) for blocks in group_blocks]
        leaf = RadixNode(list(token_ids[start:end]), start, blocks, parent)
        parent.children[leaf.token_ids[0]] = leaf
        self._own(leaf)

    def _split(self, node: RadixNode, length: int) -> RadixNode:
        """Cut `node` after its first `length` tokens; the new upper node is returned, `node` keeps the rest."""
        assert node.parent is not None
        split_at = node.start + length
        first = node.start // self.block_size
        upper_last = -(-split_at // self.block_size)
        lower_first = split_at // self.block_size
        upper = RadixNode(node.token_ids[:length], node.start, [blocks[: upper_last - first] for blocks in node.blocks],
                          node.parent, {node.token_ids[length]: node})
        node.parent.children[upper.token_ids[0]] = upper
        self._disown(node)
        node.parent = upper
        node.token_ids = node.token_ids[length:]
        node.start = split_at
        node.blocks = [blocks[lower_first - first :] for blocks in node.blocks]
        self._own(node)
        self._own(upper)
        return upper

    def _fill_holes(self, node: RadixNode, group_blocks: Sequence[Sequence[KVBlock | None]], end: int) -> None:
        """Give a windowed group's evicted blocks of `node` (before `end`) the sequence's blocks for them."""
        first = node.start // self.block_size
        for group in self.windowed_groups:
            held, offered = node.blocks[group], group_blocks[group]
            for index in range(min(-(-end // self.block_size), len(offered)) - first):
                if held[index] is None and offered[first + index] is not None:
                    held[index] = offered[first + index]
                    self.owners.setdefault(held[index], set()).add(node)

    def _forget(self, node: RadixNode, block: KVBlock) -> None:
        first = node.start // self.block_size
        for group in range(self.num_groups):
            if block in node.blocks[group]:
                index = node.blocks[group].index(block)
                if group in self.windowed_groups:
                    node.blocks[group][index] = None
                else:
                    self._truncate(node, max(node.start, (first + index) * self.block_size))
                return

    def _truncate(self, node: RadixNode, end: int) -> None:
        """Keep `node`'s tokens before `end` (all of them go when `end` is its start), and none of its descendants."""
        for child in list(node.children.values()):
            self._detach(child)
        node.children.clear()
        if end <= node.start:
            assert node.parent is not None
            del node.parent.children[node.token_ids[0]]
            self._detach(node)
            return
        self._disown(node)
        num_kept = -(-end // self.block_size) - node.start // self.block_size
        node.token_ids = node.token_ids[: end - node.start]
        node.blocks = [blocks[:num_kept] for blocks in node.blocks]
        self._own(node)

    def _detach(self, node: RadixNode) -> None:
        stack = [node]
        while stack:
            current = stack.pop()
            current.is_attached = False
            self._disown(current)
            stack.extend(current.children.values())

    def _own(self, node: RadixNode) -> None:
        for blocks in node.blocks:
            for block in blocks:
                if block is not None:
                    self.owners.setdefault(block, set()).add(node)

    def _disown(self, node: RadixNode) -> None:
        for blocks in node.blocks:
            for block in blocks:
                holders = self.owners.get(block) if block is not None else None
                if holders is not None:
                    holders.discard(node)
                    if not holders:
                        del self.owners[block]


def _common_length(edge: list[int], token_ids: Sequence[int], position: int, limit: int) -> int:
    """How many of `edge`'s tokens equal `token_ids` from `position` (never past `limit`)."""
    length = min(len(edge), limit - position)
    if list(token_ids[position : position + length]) == edge[:length]:
        return length
    return next(i for i in range(length) if edge[i] != token_ids[position + i])
