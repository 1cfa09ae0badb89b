"""The merge loop: the scan, heap and compiled versions compute the same ids (property test
over random merge tables and inputs), ties go to the leftmost pair, and the compiled core
agrees with Python on every distinct piece of the parity corpus for cl100k and o200k."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tok_corpus import build_corpus

from ember.tokenizers.bpe.merges import BytePairMerger, pair_key, pair_value
from ember.tokenizers.formats.tiktoken_files import load_tiktoken


def toy_merger(merge_list, use_native=True):
    """Bytes 0..3 are tokens 0..3; merge i joins a listed pair into token 4 + i."""
    table = {}
    for rank, (left, right) in enumerate(merge_list):
        table.setdefault(pair_key(left, right), pair_value(rank, 4 + rank))
    return BytePairMerger([*range(4), *([None] * 252)], table, use_native=use_native)


merge_lists = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=12)
# Byte 4 has no token (it is skipped); inputs beyond 256 bytes take the compiled heap merge.
inputs = st.one_of(st.binary(max_size=120), st.binary(min_size=250, max_size=700)).map(
    lambda data: bytes(b % 5 for b in data)
)


@settings(max_examples=300, deadline=None)
@given(merge_lists, inputs)
def test_scan_heap_and_native_merges_agree(merge_list, data):
    merger = toy_merger(merge_list)
    ids = [byte for byte in data if byte != 4]
    by_scan = merger._merge_by_scan(list(ids)) if len(ids) > 1 else ids
    by_heap = merger._merge_by_heap(list(ids)) if len(ids) > 1 else ids
    assert by_scan == by_heap
    assert merger.merge_uncached(data) == by_scan
    assert merger.merge_python(data) == by_scan


def test_equal_priorities_merge_the_leftmost_pair_first():
    merger = toy_merger([(0, 0)], use_native=False)
    assert merger.merge_python(bytes([0, 0, 0])) == [4, 0]


def test_a_byte_without_a_token_is_skipped_and_its_neighbours_may_merge():
    # As HF's BPE (no unknown token) does: the byte is dropped before merging.
    for use_native in (True, False):
        merger = toy_merger([(1, 1)], use_native=use_native)
        assert merger.merge_uncached(bytes([9])) == []
        assert merger.merge_uncached(bytes([1, 9, 1, 2])) == [4, 2]
        assert merger.merge_uncached(bytes([1, 9]) * 200) == [4] * 100


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_compiled_core_matches_python_on_corpus_pieces(shared_dir, name):
    tokenizer = load_tiktoken(shared_dir / "tokenizers" / "tiktoken" / f"{name}.tiktoken")
    merger = tokenizer._merger
    if not merger.is_native:
        pytest.skip("no C compiler here: the compiled core is not in use")
    pieces = {
        piece.encode()
        for text in build_corpus(shared_dir, count=2000, seed=50)
        for piece in tokenizer._pre_tokenizer.split(text)
    }
    for piece in pieces:
        assert merger.merge_uncached(piece) == merger.merge_python(piece), piece
