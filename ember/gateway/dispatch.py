"""Sending one request to a backend: routing, retries with backoff, fallbacks, circuit breakers.

Guarantees:
- Attempts go through the model's routed backends, then each fallback model's, skipping
  backends whose breaker is open and backends that do not serve the endpoint (Anthropic
  Messages backends serve chat only), at most `retry.max_attempts` in all, with exponential
  backoff between attempts.
- Only failures another backend might not have are retried: connection errors, timeouts,
  429 and 5xx. A 4xx about the request itself goes back to the client unchanged.
- A stream is retried only until its first token: `open_stream` returns once a chunk with
  content (or a finish, or usage; in the Responses API any event past the openings) has
  arrived, and everything after that belongs to that backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable

from ember.gateway.backend_state import BackendState, CircuitBreaker
from ember.gateway.config import GatewayConfig, ModelConfig
from ember.gateway.responses import RESPONSES_ENDPOINT, carries_output
from ember.gateway.routing import RoutingPolicy, make_policy
from ember.gateway.upstream import Upstream, UpstreamError


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One try: which model of the fallback chain, on which backend, under which upstream name."""

    model: ModelConfig
    backend: BackendState
    upstream_model: str


class AttemptObserver:
    """Hooks the app uses for traces and metrics; the default does nothing."""

    def attempt_started(self, attempt: Attempt) -> object:
        return None

    def attempt_ended(self, handle: object, attempt: Attempt, error: UpstreamError | None) -> None:
        return None


@dataclasses.dataclass
class OpenedStream:
    """A stream that has produced its first token: the chunks so far and the rest to come."""

    attempt: Attempt
    first_chunks: list[dict]
    rest: AsyncIterator[dict]
    release: Callable[[UpstreamError | None], None]

    is_closed: bool = False

    async def chunks(self) -> AsyncIterator[dict]:
        """Every chunk, first ones included; releases the backend when done, failed or closed."""
        error: UpstreamError | None = None
        try:
            for chunk in self.first_chunks:
                yield chunk
            async for chunk in self.rest:
                yield chunk
        except UpstreamError as failure:
            error = failure
            raise
        finally:
            await self.close(error)

    async def close(self, error: UpstreamError | None = None) -> None:
        """Close the upstream response and release the backend, once (also when never read)."""
        if self.is_closed:
            return
        self.is_closed = True
        with contextlib.suppress(Exception):
            await self.rest.aclose()
        self.release(error)


class Dispatcher:
    """Owns the per-backend state of one gateway process and sends requests through it."""

    def __init__(self, config: GatewayConfig, upstreams: dict[str, Upstream], clock=time.monotonic) -> None:
        self._config = config
        self._upstreams = upstreams
        self._clock = clock
        self.states = {
            backend.name: BackendState(backend.name, CircuitBreaker(config.breaker)) for backend in config.backends
        }
        self._policies: dict[str, RoutingPolicy] = {
            model.name: make_policy(model.routing, config.prefix_routing) for model in config.models
        }

    def serves(self, model: ModelConfig, endpoint: str) -> bool:
        """Whether any backend of the model or its fallbacks has `endpoint`, cooling down or not."""
        return any(
            self._upstreams[deployment.backend].serves(endpoint) for chain_model in self._chain(model) for deployment in chain_model.deployments
        )

    def is_cooling_down(self, name: str) -> bool:
        """Whether backend `name`'s breaker keeps it out of routing now."""
        return self.states[name].breaker.is_open(self._clock())

    def upstream(self, name: str) -> Upstream:
        return self._upstreams[name]

    def plan(self, model: ModelConfig, prompt_text: str, endpoint: str, pinned: str | None = None) -> list[Attempt]:
        """The attempts to make, in order, before the attempt budget cuts the list; only backend `pinned` where a
        request must reach the server holding its state (a continued response)."""
        attempts = []
        for chain_model in self._chain(model):
            now = self._clock()
            candidates = [
                self.states[deployment.backend]
                for deployment in chain_model.deployments
                if not self.states[deployment.backend].breaker.is_open(now) and self._upstreams[deployment.backend].serves(endpoint)
                and pinned in (None, deployment.backend)
            ]
            if not candidates:
                continue
            upstream_names = {deployment.backend: deployment.upstream_model for deployment in chain_model.deployments}
            for state in self._policies[chain_model.name].order(candidates, prompt_text):
                attempts.append(Attempt(chain_model, state, upstream_names[state.name]))
        return attempts

    async def complete(
        self, endpoint: str, body: dict, model: ModelConfig, prompt_text: str, observer: AttemptObserver, pinned: str | None = None
    ) -> tuple[dict, Attempt]:
        """The first successful non-streamed response and the attempt that produced it."""

        async def try_one(attempt: Attempt) -> tuple[dict, Attempt]:
            upstream = self._upstreams[attempt.backend.name]
            return await upstream.complete(endpoint, {**body, "model": attempt.upstream_model}), attempt

        return await self._with_retries(model, prompt_text, endpoint, observer, try_one, release_on_success=True, pinned=pinned)

    async def open_stream(
        self, endpoint: str, body: dict, model: ModelConfig, prompt_text: str, observer: AttemptObserver, pinned: str | None = None
    ) -> OpenedStream:
        """A stream that has sent its first token; the backend stays counted as busy until it ends."""

        async def try_one(attempt: Attempt) -> OpenedStream:
            upstream = self._upstreams[attempt.backend.name]
            iterator = upstream.stream(endpoint, {**body, "model": attempt.upstream_model})
            timeout_s = self._config.backend(attempt.backend.name).first_token_timeout_s
            try:
                first_chunks = await asyncio.wait_for(_until_first_token(iterator, endpoint), timeout_s)
            except asyncio.TimeoutError:
                await iterator.aclose()
                raise UpstreamError(
                    f"backend {attempt.backend.name} sent no token within {timeout_s} s", is_retryable=True, status_code=504
                ) from None
            except BaseException:
                await iterator.aclose()
                raise
            return OpenedStream(attempt, first_chunks, iterator, release=lambda error: None)

        opened, handle = await self._with_retries(model, prompt_text, endpoint, observer, try_one, release_on_success=False,
                                                  pinned=pinned)  # fmt: skip
        opened.release = lambda error: self._finish(opened.attempt, handle, observer, error)
        return opened

    async def _with_retries(self, model, prompt_text, endpoint, observer, try_one, release_on_success: bool, pinned=None):
        attempts = self.plan(model, prompt_text, endpoint, pinned)[: self._config.retry.max_attempts]
        if not attempts:
            reason = (f"backend {pinned!r}, which holds the response this one continues, is not available: it is cooling "
                      f"down after failures or does not serve model {model.name!r}") if pinned else (
                      f"no backend of model {model.name!r} (or its fallbacks) is available: all are cooling down after failures")  # fmt: skip
            raise UpstreamError(reason, is_retryable=True, status_code=503)
        last_error: UpstreamError | None = None
        for number, attempt in enumerate(attempts):
            if number:
                await asyncio.sleep(self._backoff_s(number))
            handle = self._start(attempt, observer)
            started = self._clock()
            try:
                result = await try_one(attempt)
            except UpstreamError as error:
                self._finish(attempt, handle, observer, error)
                if not error.is_retryable:
                    raise
                last_error = error
                continue
            except BaseException:
                self._finish(attempt, handle, observer, None)
                raise
            attempt.backend.observe_latency(self._clock() - started)
            if release_on_success:
                self._finish(attempt, handle, observer, None)
                return result
            return result, handle
        raise last_error

    def _start(self, attempt: Attempt, observer: AttemptObserver) -> object:
        attempt.backend.outstanding += 1
        return observer.attempt_started(attempt)

    def _finish(self, attempt: Attempt, handle: object, observer: AttemptObserver, error: UpstreamError | None) -> None:
        attempt.backend.outstanding -= 1
        if error is None:
            attempt.backend.breaker.record_success()
        elif error.is_retryable:
            attempt.backend.breaker.record_failure(self._clock())
        observer.attempt_ended(handle, attempt, error)

    def _backoff_s(self, retry_number: int) -> float:
        retry = self._config.retry
        return min(retry.backoff_base_s * 2 ** (retry_number - 1), retry.backoff_max_s)

    def _chain(self, model: ModelConfig) -> list[ModelConfig]:
        """The model, then its fallbacks (recursively, each once)."""
        chain: list[ModelConfig] = []
        pending = [model]
        while pending:
            current = pending.pop(0)
            if current in chain:
                continue
            chain.append(current)
            pending.extend(self._config.resolve_model(name) for name in current.fallbacks)
        return chain


async def _until_first_token(iterator: AsyncIterator[dict], endpoint: str) -> list[dict]:
    """Chunks up to and including the first that carries a token, a finish or usage."""
    is_past_openings = carries_output if endpoint == RESPONSES_ENDPOINT else carries_token
    chunks = []
    async for chunk in iterator:
        chunks.append(chunk)
        if is_past_openings(chunk):
            return chunks
    return chunks


def carries_token(chunk: dict) -> bool:
    """Whether a stream chunk is more than the opening role announcement."""
    if chunk.get("usage") or chunk.get("error"):
        return True
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("finish_reason") or delta.get("content") or choice.get("text"):
            return True
    return False
