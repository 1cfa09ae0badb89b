"""Driving engine requests for HTTP: admission, abort on exit, metrics and the log line at the end."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request

from ember.engine.client import EngineDeadError
from ember.engine.engine_request import EngineRequest
from ember.engine.outputs import OutputAccumulator, RequestOutput
from ember.engine.sampling_params import SamplingParams
from ember.server.common.admission import AdmissionTicket
from ember.server.common.errors import ApiError, engine_rejections, engine_unavailable
from ember.server.common.metrics import FinishedRequest
from ember.server.openai.engine_requests import PreparedPrompt, engine_request
from ember.server.openai.protocol import SamplingFields
from ember.server.serving.context import ServingContext

T = TypeVar("T")


class _RequestTracker:
    """Counts what one engine request produced, to report it when it ends."""

    def __init__(self, request_id: str, num_prompt_tokens: int) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.num_cached_tokens = 0
        self.tokens_per_completion: dict[int, int] = {}
        self.finish_reasons: dict[int, str] = {}
        self.is_finished = False
        self.is_rejected = False

    def add(self, delta: RequestOutput) -> None:
        now = time.monotonic()
        self.num_cached_tokens = delta.num_cached_tokens
        for part in delta.outputs:
            if part.token_ids and self.first_token_time is None:
                self.first_token_time = now
            self.tokens_per_completion[part.index] = self.tokens_per_completion.get(part.index, 0) + len(
                part.token_ids
            )
            if part.finish_reason is not None:
                self.finish_reasons[part.index] = part.finish_reason
        self.is_finished = delta.finished

    def finished(self) -> FinishedRequest:
        end_time = time.monotonic()
        reasons = set(self.finish_reasons.values())
        if self.is_rejected:
            finish_reason = "rejected"
        elif not self.is_finished or "abort" in reasons:
            finish_reason = "abort"
        else:
            finish_reason = "length" if "length" in reasons else "stop"
        time_to_first_token_s = None
        time_per_output_token_s = None
        if self.first_token_time is not None:
            time_to_first_token_s = self.first_token_time - self.arrival_time
            longest = max(self.tokens_per_completion.values(), default=0)
            if longest > 1:
                time_per_output_token_s = (end_time - self.first_token_time) / (longest - 1)
        return FinishedRequest(
            request_id=self.request_id,
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=sum(self.tokens_per_completion.values()),
            cached_tokens=self.num_cached_tokens,
            finish_reason=finish_reason,
            time_to_first_token_s=time_to_first_token_s,
            time_per_output_token_s=time_per_output_token_s,
            latency_s=end_time - self.arrival_time,
        )


def tracked_generate(
    context: ServingContext,
    request_id: str,
    prompt: PreparedPrompt,
    params: SamplingParams,
    fields: SamplingFields | None,
    ticket: AdmissionTicket,
    names: dict[str, str] | None = None,
) -> AsyncIterator[RequestOutput]:
    """The engine's deltas for one prompt of an API request (`fields`, None for one without engine extras), which
    is checked and handed over to the engine now: a request the engine refuses is a 400 naming the field (as `names`
    spells it) and a stopped engine a 503, both before any response starts.

    The request holds its waiting-room slot until its first delta shows the engine running it.
    However the caller stops (finished, closed early, cancelled by a disconnect), the engine
    request is aborted unless it finished, and one metrics observation and one log line are written.
    """
    with engine_rejections(names):
        adapter = None if fields is None or fields.model is None else context.adapters.get(fields.model)
        request = engine_request(request_id, prompt, params, fields, adapter)
        try:
            stream = context.engine.generate(request)
        except EngineDeadError as error:
            raise engine_unavailable(str(error)) from error
    return _tracked_stream(context, request, stream, ticket)


async def _tracked_stream(
    context: ServingContext, request: EngineRequest, stream: AsyncIterator[RequestOutput], ticket: AdmissionTicket,
) -> AsyncIterator[RequestOutput]:
    tracker = _RequestTracker(request.request_id, len(request.prompt_token_ids))
    try:
        is_started = False
        async for delta in stream:
            if not is_started:
                ticket.mark_started()
                is_started = True
            tracker.add(delta)
            yield delta
    except EngineDeadError as error:
        tracker.is_rejected = True
        raise engine_unavailable(str(error)) from error
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()
        if not tracker.is_finished:
            context.engine.abort(request.request_id)
        finished = tracker.finished()
        if not tracker.is_rejected:
            context.metrics.observe_finished(finished)
        context.request_logger.log_finished(finished, request.prompt)


async def merge_streams(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several async iterators as they come, tagged with the iterator's index.

    Closing the merged iterator cancels and closes every source.
    """
    if len(streams) == 1:
        source = streams[0]
        try:
            async for item in source:
                yield 0, item
        finally:
            await source.aclose()
        return
    queue: asyncio.Queue[tuple[int, object, BaseException | None, bool]] = asyncio.Queue()

    async def pump(index: int, source: AsyncIterator[T]) -> None:
        try:
            async for item in source:
                await queue.put((index, item, None, False))
        except Exception as error:
            await queue.put((index, None, error, True))
            return
        finally:
            await source.aclose()
        await queue.put((index, None, None, True))

    tasks = [asyncio.create_task(pump(index, source)) for index, source in enumerate(streams)]
    try:
        num_open = len(tasks)
        while num_open:
            index, item, error, is_done = await queue.get()
            if error is not None:
                raise error
            if is_done:
                num_open -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(streams: list[AsyncIterator[RequestOutput]], n: int) -> list[RequestOutput]:
    """The accumulated final output of each stream (non-streaming requests). A rejection the engine makes once it
    reads the request (an adapter it cannot serve on this model) is the same 400 as one made at the door."""
    accumulators = [OutputAccumulator(f"prompt-{index}", n) for index in range(len(streams))]
    merged = merge_streams(streams)
    try:
        with engine_rejections({"lora_request": "model"}):  # the adapter a request's model names
            async for index, delta in merged:
                accumulators[index].add(delta)
    finally:
        await merged.aclose()
    return [accumulator.result() for accumulator in accumulators]


async def cancel_on_disconnect(context: ServingContext, request: Request, work: Awaitable[T]) -> T:
    """Run `work` (a whole-answer request), cancelling it if the HTTP client goes away first or
    the shutdown grace period ends."""

    async def check_client() -> None:
        if await request.is_disconnected():
            raise ApiError("The client disconnected.", status_code=499, code="client_disconnected")

    return await context.drain.run_until_expired(work, check_client, context.config.disconnect_poll_s)
