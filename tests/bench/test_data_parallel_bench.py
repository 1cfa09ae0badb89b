"""How `ember bench serve --data-parallel-size D` shares the cores: one engine gets one replica's share, the D
replicas get D such shares (the run itself: `ember bench serve --data-parallel-size 2`)."""

from __future__ import annotations

import pytest

from ember.bench.data_parallel import replica_shares


def test_one_engine_gets_one_replicas_share_of_the_cores():
    assert replica_shares(2, [0, 1]) == ("0", "0,1")
    assert replica_shares(2, [0, 1, 2, 3, 4]) == ("0,1", "0,1,2,3")
    assert replica_shares(3, [2, 3, 4, 5, 6, 7]) == ("2,3", "2,3,4,5,6,7")


def test_more_replicas_than_cores_is_refused_with_the_count():
    with pytest.raises(ValueError, match="needs 3 cores to give each replica its own; this process has 2"):
        replica_shares(3, [0, 1])
