"""The shared memory exchange: sums and gathers equal their references, in every rank, through both slot sets."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ember.parallel.communicator import Communicator
from ember.parallel.group import map_offered_segment, offer_segment
from ember.parallel.shared_exchange import (
    SLOT_BYTES,
    ExchangeFailed,
    SharedExchange,
    exchange_library,
)

WORLD = 3


@pytest.fixture
def exchanges(tmp_path: Path) -> list[SharedExchange]:
    """Three ranks' views of one segment (threads stand in for processes: the mapping is the same memory)."""
    library = exchange_library()
    if library is None:
        pytest.skip("no C compiler: the group keeps gloo")
    path = tmp_path / "segment"
    first = SharedExchange(path, 0, WORLD, library, create=True)
    return [first, *(SharedExchange(path, rank, WORLD, library, create=False) for rank in range(1, WORLD))]


def _on_every_rank(exchanges: list[SharedExchange], work) -> list:
    """`work(exchange)` on each rank at once; each rank's result (or the exception it raised)."""
    results: list = [None] * len(exchanges)

    def run(rank: int) -> None:
        try:
            results[rank] = work(exchanges[rank])
        except Exception as error:  # noqa: BLE001 - the test reads it
            results[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(exchanges))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_many_all_reduces_give_every_rank_the_same_sums_in_rank_order(exchanges):
    inputs = [[torch.randn(7, 13, generator=torch.Generator().manual_seed(100 * step + rank)) for rank in range(WORLD)]
              for step in range(50)]  # fmt: skip

    def work(exchange: SharedExchange) -> list[torch.Tensor]:
        outs = []
        for step in range(50):  # alternate slot sets, ranks racing ahead of each other
            tensor = inputs[step][exchange.rank].clone()
            exchange.all_reduce(tensor, 10.0, lambda: None)
            outs.append(tensor)
        return outs

    results = _on_every_rank(exchanges, work)
    for step in range(50):
        expected = (inputs[step][0] + inputs[step][1]) + inputs[step][2]
        for rank in range(WORLD):
            assert torch.equal(results[rank][step], expected)


def test_a_tensor_larger_than_a_slot_goes_in_pieces(exchanges):
    numel = SLOT_BYTES // 4 * 2 + 5  # two whole slots and a tail
    inputs = [torch.full((numel,), float(rank + 1)) for rank in range(WORLD)]
    results = _on_every_rank(exchanges, lambda e: e.all_reduce(t := inputs[e.rank].clone(), 10.0, lambda: None) or t)
    assert all(torch.equal(result, torch.full((numel,), 6.0)) for result in results)


def test_all_gather_stacks_every_ranks_block_in_rank_order(exchanges):
    blocks = [torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank for rank in range(WORLD)]
    results = _on_every_rank(exchanges, lambda e: e.all_gather(blocks[e.rank], 10.0, lambda: None))
    assert all(torch.equal(result, torch.cat(blocks)) for result in results)


def test_a_rank_that_never_comes_fails_the_exchange_naming_it(exchanges):
    with pytest.raises(ExchangeFailed, match="rank 1 did not take part within 0.2 s"):
        exchanges[0].all_reduce(torch.ones(4), 0.2, lambda: None)
    with pytest.raises(ExchangeFailed, match="worker rank 2 exited"):
        exchanges[0].all_reduce(torch.ones(4), 10.0, lambda: "worker rank 2 exited with status -9")


def test_a_worker_maps_the_offered_segment_only_when_it_holds_rank_0s_token(tmp_path):
    library = exchange_library()
    if library is None:
        pytest.skip("no C compiler: the group keeps gloo")
    store = dist.HashStore()
    offered = offer_segment(store, tmp_path / "segment", 2, library)
    assert offered is not None
    worker = map_offered_segment(store, 1, 2, library)
    assert worker is not None and worker.token == offered.token
    store.set("ember/shared/token", bytes(16).hex())  # another machine's rank 0 wrote a different token
    assert map_offered_segment(store, 1, 2, library) is None
    store.set("ember/shared/path", "")  # rank 0 could not create one
    assert map_offered_segment(store, 1, 2, library) is None


def test_the_communicator_gets_the_same_numbers_through_shared_memory_as_through_gloo(tmp_path):
    """Two ranks (threads) on one gloo group: each collective with and without the exchange gives the same bits."""
    library = exchange_library()
    if library is None:
        pytest.skip("no C compiler: the group keeps gloo")
    two = [SharedExchange(tmp_path / "segment", rank, 2, library, create=rank == 0) for rank in range(2)]
    store = dist.HashStore()
    groups = _on_every_rank(two, lambda e: dist.ProcessGroupGloo(store, e.rank, 2, datetime.timedelta(seconds=30)))
    inputs = [torch.randn(6, 5, generator=torch.Generator().manual_seed(rank)) for rank in range(2)]

    def collectives(exchange: SharedExchange, shared: bool) -> list[torch.Tensor]:
        communicator = Communicator(groups[exchange.rank], exchange.rank, 2, 30.0, store, exchange if shared else None)
        own = inputs[exchange.rank]
        return [communicator.all_reduce(own.clone()), communicator.reduce_scatter(own), communicator.all_gather(own)]

    through_gloo = _on_every_rank(two, lambda e: collectives(e, shared=False))
    through_memory = _on_every_rank(two, lambda e: collectives(e, shared=True))
    for rank in range(2):
        assert all(torch.equal(a, b) for a, b in zip(through_gloo[rank], through_memory[rank], strict=True))
    assert torch.equal(through_memory[0][0], inputs[0] + inputs[1])
