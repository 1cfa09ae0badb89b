"""DataParallelEngine: D engine processes (replicas) behind one EngineClient (`ember serve --data-parallel-size D`).

Each replica is an `EngineProcessClient`: its own process holding the whole model (and, with tensor or pipeline
parallelism, its own ranks). A request goes to the replica that the prefix-aware rule (`ember.prefix_routing`, the
gateway's) names for its prompt tokens, unless that replica is loaded beyond its share: prompts sharing a prefix meet
one replica's prefix cache while the load stays even.

When a replica's process dies, nothing is lost silently:
- its requests that had not yet streamed anything are sent again to a live replica (the client saw nothing, so
  the retry is invisible and a greedy answer is the one it would have had);
- its requests that had streamed tokens end with `EngineDeadError` (the server answers 503, or an error event on a
  stream): a retry would repeat or contradict text the client already holds;
- the replica is restarted in the background, up to `max_restarts` times; after that (or when a restart fails)
  it is taken out for good. Meanwhile the others take its share and `replica_health()` (the server's /health)
  names it. The engine as a whole reads as dead (`dead_reason`) only when no replica is up or coming back.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import threading
from collections.abc import AsyncIterator

from ember.engine.client import EngineDeadError, ReplicaHealth
from ember.engine.config import EngineConfig
from ember.engine.data_parallel_config import DataParallelConfig, replica_cores
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import EngineStats, StepRecord
from ember.engine.outputs import RequestOutput
from ember.engine.process_client import EngineProcessClient
from ember.prefix_routing import PrefixAware

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.2
# Prefix routing over prompt tokens: the first 4 blocks of 16 tokens pick the replica, a replica takes requests while
# under 1.25x the mean load (the gateway's defaults, in tokens rather than characters).
PREFIX_BLOCK_TOKENS = 16
PREFIX_NUM_BLOCKS = 4
PREFIX_LOAD_FACTOR = 1.25
PREFIX_VIRTUAL_NODES = 64


class _Replica:
    """One engine process and what the router knows of it."""

    def __init__(self, index: int, client: EngineProcessClient) -> None:
        self.name = str(index)
        self.index = index
        self.client: EngineProcessClient | None = client
        self.outstanding = 0
        self.restarts = 0
        self.down_reason: str | None = None
        self.is_restarting = False

    @property
    def is_up(self) -> bool:
        return self.live_client is not None

    @property
    def live_client(self) -> EngineProcessClient | None:
        """The replica's client while its process runs (read once: the watcher thread may swap it meanwhile)."""
        client = self.client
        return client if client is not None and client.dead_reason is None else None


class DataParallelEngine:
    """An EngineClient over `config.size` engine processes of `engine_config`."""

    def __init__(self, engine_config: EngineConfig, config: DataParallelConfig, show_progress: bool = True,
                 startup_timeout_s: float | None = None) -> None:
        self._engine_config = engine_config
        self._config = config
        self._startup_timeout_s = startup_timeout_s
        self._router = PrefixAware(PREFIX_BLOCK_TOKENS, PREFIX_NUM_BLOCKS, PREFIX_LOAD_FACTOR, PREFIX_VIRTUAL_NODES)
        clients = self._start_all(show_progress)
        self._replicas = [_Replica(index, client) for index, client in enumerate(clients)]
        first = clients[0]
        self.model_name = first.model_name
        self.tokenizer = first.tokenizer
        self.max_model_len = first.max_model_len
        self.limits = first.limits
        self._last_stats = first.stats()
        self._placement: dict[str, _Replica] = {}
        self._is_stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="ember-replica-watcher", daemon=True)
        self._watcher.start()

    # -- EngineClient -----------------------------------------------------------------------

    @property
    def dead_reason(self) -> str | None:
        if any(replica.is_up or replica.is_restarting for replica in self._replicas):
            return None
        return "; ".join(f"replica {replica.name}: {replica.down_reason}" for replica in self._replicas)

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Check `request` (RequestRejected, EngineDeadError when no replica is up), then stream it from a replica."""
        self.limits.check(request)
        reason = self.dead_reason
        if reason is not None:
            raise EngineDeadError(reason)
        return self._stream(request)

    async def _stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        tried: set[int] = set()
        while True:
            replica, client = self._pick(request, tried)
            tried.add(replica.index)
            has_streamed = False
            replica.outstanding += 1
            self._placement[request.request_id] = replica
            try:
                # Closed here when the caller leaves early, so the replica aborts the request at once.
                async with contextlib.aclosing(client.generate(request)) as stream:
                    async for output in stream:
                        has_streamed = True
                        yield output
                return
            except EngineDeadError as error:
                if has_streamed:
                    raise
                logger.warning("replica %s died before request %s streamed anything (%s); sending it to another replica",
                               replica.name, request.request_id, error)
            finally:
                replica.outstanding -= 1
                self._placement.pop(request.request_id, None)

    def _pick(self, request: EngineRequest, tried: set[int]) -> tuple[_Replica, EngineProcessClient]:
        """The replica to send `request` to next, of those up and not yet tried, with its client."""
        live = {replica.index: client for replica, client in self._live() if replica.index not in tried}
        if not live:
            raise EngineDeadError(self.dead_reason or "every replica this request was sent to died before answering")
        candidates = [replica for replica in self._replicas if replica.index in live]
        replica = self._router.order(candidates, request.prompt_token_ids)[0]
        return replica, live[replica.index]

    def _live(self) -> list[tuple[_Replica, EngineProcessClient]]:
        return [(replica, client) for replica in self._replicas if (client := replica.live_client) is not None]

    def abort(self, request_id: str) -> None:
        replica = self._placement.get(request_id)
        client = replica.live_client if replica is not None else None
        if client is not None:
            client.abort(request_id)

    def stats(self) -> EngineStats:
        """The live replicas' stats added up (cache use weighted by pool size); the last such sum when none is up."""
        live = list(self.replica_stats().values())
        if live:
            self._last_stats = combined_stats(live)
        return self._last_stats

    def step_records(self) -> list[StepRecord]:
        return [record for _, client in self._live() for record in client.step_records()]

    def shutdown(self) -> None:
        self._is_stopping.set()
        self._watcher.join()
        for replica in self._replicas:
            if replica.client is not None:
                replica.client.shutdown()

    # -- replicas ---------------------------------------------------------------------------

    def replica_stats(self) -> dict[str, EngineStats]:
        """Each live replica's stats, by replica name."""
        return {replica.name: client.stats() for replica, client in self._live()}

    def replica_health(self) -> list[ReplicaHealth]:
        """Every replica, up or not, with why it is down and how often it was restarted."""
        health = []
        for replica in self._replicas:
            client = replica.live_client
            health.append(ReplicaHealth(
                replica.name,
                is_up=client is not None,
                is_restarting=replica.is_restarting,
                reason=None if client is not None else replica.down_reason,
                restarts=replica.restarts,
                pid=client.pid if client is not None else None,
            ))
        return health

    def _start_all(self, show_progress: bool) -> list[EngineProcessClient]:
        """Every replica's engine process, loaded side by side; when one fails to load, the others are stopped and
        its error raised."""
        with concurrent.futures.ThreadPoolExecutor(self._config.size) as pool:
            starting = [pool.submit(self._start, index, show_progress and index == 0) for index in range(self._config.size)]
            concurrent.futures.wait(starting)
        failed = [future.exception() for future in starting if future.exception() is not None]
        if failed:
            for future in starting:
                if future.exception() is None:
                    future.result().shutdown()
            raise failed[0]
        return [future.result() for future in starting]

    def _start(self, index: int, show_progress: bool) -> EngineProcessClient:
        """Replica `index`'s engine process, on its cores, its ranks (if any) at `--master-port` + `index`."""
        config, cores = self._engine_config, None
        if config.parallel.master_port is not None:  # each replica's ranks meet on a port of their own
            config = dataclasses.replace(config, parallel=dataclasses.replace(
                config.parallel, master_port=config.parallel.master_port + index))
        if self._config.cpus is not None:
            cores = replica_cores(index, self._config.size, list(self._config.cpus))
            if config.num_threads is None:
                config = dataclasses.replace(config, num_threads=len(cores))
        return EngineProcessClient(config, show_progress=show_progress, startup_timeout_s=self._startup_timeout_s,
                                   cpu_cores=cores)

    def _watch(self) -> None:
        """Notice a replica whose process died; restart it (or take it out) off the event loop."""
        while not self._is_stopping.wait(WATCH_INTERVAL_S):
            for replica in self._replicas:
                client = replica.client
                if client is not None and client.dead_reason is not None:
                    self._replace(replica, client)

    def _replace(self, replica: _Replica, client: EngineProcessClient) -> None:
        replica.down_reason = client.dead_reason
        replica.is_restarting = replica.restarts < self._config.max_restarts and not self._is_stopping.is_set()
        replica.client = None
        client.shutdown()  # reaps the process and closes its pipes; its streams already ended
        if not replica.is_restarting:
            logger.error("replica %s is down (%s) after %d restart(s); it is taken out", replica.name,
                         replica.down_reason, replica.restarts)
            return
        replica.restarts += 1
        logger.error("replica %s is down (%s); restarting it (restart %d of at most %d)", replica.name,
                     replica.down_reason, replica.restarts, self._config.max_restarts)
        try:
            replica.client = self._start(replica.index, show_progress=False)
        except Exception as error:  # a replica that cannot load again stays out; the others serve
            replica.down_reason = f"its restart failed: {error}"
            logger.error("replica %s could not be restarted (%s); it is taken out", replica.name, error)
        finally:
            replica.is_restarting = False
        if replica.client is not None:
            replica.down_reason = None
            logger.info("replica %s is back (pid %s)", replica.name, replica.client.pid)


def combined_stats(stats: list[EngineStats]) -> EngineStats:
    """Several engines' stats as one engine's: counts and times added, cache use weighted by each pool's size, the
    acceptance histograms added bucket by bucket."""
    total_blocks = sum(item.num_total_blocks for item in stats)
    summed = {
        field.name: sum(getattr(item, field.name) for item in stats)
        for field in dataclasses.fields(EngineStats)
        if field.name not in ("kv_cache_usage", "block_size", "spec_accepted_histogram")
    }
    return EngineStats(
        **summed,
        kv_cache_usage=sum(item.kv_cache_usage * item.num_total_blocks for item in stats) / max(total_blocks, 1),
        block_size=stats[0].block_size,
        spec_accepted_histogram=tuple(
            sum(bucket) for bucket in itertools.zip_longest(*(item.spec_accepted_histogram for item in stats), fillvalue=0)
        ),
    )
