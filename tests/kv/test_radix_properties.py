"""Property: the radix prefix cache only ever hands out KV that holds the prompt's own tokens, and leaks nothing.

Random admissions (prefix hits of any length, two partitions), chunked advances, forks, frees and
evictions over one manager with a radix cache, against a model of the KV memory: each slot records
which tokens (and partition) its key/value was computed from. After every operation:
- every token a cached prefix offers is held, in the block the prefix names, as computed from the
  prompt's own tokens before it and under the prompt's partition;
- every running sequence's computed tokens are still in its blocks (nothing it reads was reused);
- each block's ref count equals the tables (and copy sources) holding it, the free list holds exactly
  the unreferenced blocks, and the tree names only attached nodes.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from ember.kv.cache_manager import BlockCopy, KVCacheManager

BLOCK_SIZE = 4
NUM_BLOCKS = 24

# (what, which sequence / partition, tokens: a prompt or an advance; two token values give shared prefixes of every length)
operations = st.lists(
    st.tuples(st.sampled_from(["admit", "admit", "advance", "fork", "free"]), st.integers(0, 3),
              st.lists(st.integers(0, 1), min_size=1, max_size=14)),
    max_size=40,
)


class Memory:
    """What each KV slot was computed from: (partition, the tokens up to and including its own)."""

    def __init__(self) -> None:
        self.slots: dict[tuple[int, int], tuple] = {}

    def copy(self, copies: list[BlockCopy]) -> None:
        contents = [{s: v for (b, s), v in self.slots.items() if b == c.source} for c in copies]
        for c, content in zip(copies, contents, strict=True):
            for slot in range(BLOCK_SIZE):
                self.slots.pop((c.destination, slot), None)
            self.slots.update({(c.destination, s): v for s, v in content.items()})

    def compute(self, block_ids: list[int], tokens: list[int], start: int, end: int, partition: tuple) -> None:
        for position in range(start, min(end, len(tokens))):
            self.slots[(block_ids[position // BLOCK_SIZE], position % BLOCK_SIZE)] = (partition, tuple(tokens[: position + 1]))

    def holds(self, block_id: int, tokens: list[int], position: int, partition: tuple) -> bool:
        return self.slots.get((block_id, position % BLOCK_SIZE)) == (partition, tuple(tokens[: position + 1]))


def _check_prefix(kv: KVCacheManager, memory: Memory, prompt: list[int], prefix, partition: tuple) -> None:
    if prefix.num_tokens == 0:
        return
    for group, window in enumerate(kv.group_windows):
        blocks = prefix.blocks if group == 0 else prefix.other_groups[group - 1]
        first = 0 if window is None else max(0, prefix.num_tokens - window + 1)
        for position in range(first, prefix.num_tokens):
            block = blocks[position // BLOCK_SIZE]
            assert memory.holds(block.block_id, prompt, position, partition), (group, position)


def _check_pool(kv: KVCacheManager, tokens: dict, computed: dict, partitions: dict, memory: Memory) -> None:
    holders: Counter[int] = Counter()
    for group, window in enumerate(kv.group_windows):
        for seq_id, table in kv.group_tables[group].items():
            holders.update(block.block_id for block in table.blocks if block is not kv.null_block)
            holders.update(block.block_id for block in table.copy_sources.values())
            first = 0 if window is None else max(0, computed[seq_id] - window + 1)
            for position in range(first, computed[seq_id]):
                block = table.blocks[position // BLOCK_SIZE]
                assert memory.holds(block.block_id, tokens[seq_id], position, partitions[seq_id]), (seq_id, position)
    for block in kv.pool.blocks:
        assert block.ref_count == holders[block.block_id]
    assert kv.num_free_blocks == sum(1 for block in kv.pool.blocks if block.ref_count == 0)
    assert kv.radix is not None
    assert all(node.is_attached for nodes in kv.radix.owners.values() for node in nodes)


@settings(max_examples=150, deadline=None)
@given(windows=st.sampled_from([(None,), (None, 6)]), ops=operations)
def test_cached_prefixes_hold_their_own_tokens_and_no_block_leaks(windows, ops):
    kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, group_windows=windows, prefix_cache="radix")
    memory = Memory()
    tokens: dict[str, list[int]] = {}
    computed: dict[str, int] = {}
    partitions: dict[str, tuple] = {}

    def step(seq_id: str, start: int, count: int, copies: list[BlockCopy]) -> None:
        memory.copy(copies)
        for group in range(len(windows)):
            memory.compute(kv.group_tables[group][seq_id].block_ids, tokens[seq_id], start, start + count, partitions[seq_id])

    for index, (kind, which, new_tokens) in enumerate(ops):
        live = sorted(tokens)
        if kind == "admit":
            seq_id, partition = f"s{index}", ("salt",) if which == 3 else ()
            prompt = [2] + new_tokens
            prefix = kv.find_cached_prefix(prompt, len(prompt) - 1, partition)
            _check_prefix(kv, memory, prompt, prefix, partition)
            copies = kv.allocate_slots(seq_id, prompt, prefix.num_tokens, len(prompt) - prefix.num_tokens, prefix, partition)
            if copies is not None:
                tokens[seq_id], partitions[seq_id], computed[seq_id] = prompt, partition, len(prompt)
                step(seq_id, prefix.num_tokens, len(prompt) - prefix.num_tokens, copies)
        elif live and kind == "advance":
            seq_id = live[which % len(live)]
            count = len(new_tokens)
            tokens[seq_id].extend(new_tokens)
            copies = kv.allocate_slots(seq_id, tokens[seq_id], computed[seq_id], count, extra_keys=partitions[seq_id])
            if copies is None:
                del tokens[seq_id][computed[seq_id] :]
            else:
                step(seq_id, computed[seq_id], count, copies)
                computed[seq_id] += count
        elif live and kind == "fork":
            parent = live[which % len(live)]
            child = f"{parent}/{index}"
            kv.fork(parent, child)
            tokens[child], computed[child], partitions[child] = list(tokens[parent]), computed[parent], partitions[parent]
        elif live and kind == "free":
            seq_id = live[which % len(live)]
            kv.free(seq_id, tokens[seq_id][: computed[seq_id]], partitions[seq_id])
            del tokens[seq_id], computed[seq_id], partitions[seq_id]
        _check_pool(kv, tokens, computed, partitions, memory)
    for seq_id in list(tokens):
        kv.free(seq_id, tokens[seq_id][: computed[seq_id]], partitions[seq_id])
    assert kv.num_free_blocks == NUM_BLOCKS
