"""Drain.until_expired: the end of the grace period ends a waiting stream with the shutdown error and closes its
source; any other cancellation stays a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from ember.server.common.admission import AdmissionGate
from ember.server.common.drain import Drain
from ember.server.common.errors import ApiError


class _IdleEngine:
    def stats(self):  # the gate reads the engine's queue only when admitting
        raise AssertionError("not used")


def _drain(grace_s: float) -> Drain:
    gate = AdmissionGate(_IdleEngine(), max_waiting=4, retry_after_s=3, on_reject=lambda: None)
    return Drain(gate, grace_s=grace_s, retry_after_s=3)


class _Source:
    """Yields `ready` items at once, then waits forever; records whether it was closed."""

    def __init__(self, ready: int) -> None:
        self.ready = ready
        self.closed = False

    async def items(self):
        try:
            for index in range(self.ready):
                yield index
            await asyncio.Event().wait()
        finally:
            self.closed = True


def test_a_stream_waiting_when_the_grace_period_ends_gets_the_shutdown_error_and_its_source_closes():
    drain, source = _drain(grace_s=60), _Source(ready=2)

    async def main():
        received = []
        consumer = asyncio.ensure_future(_consume(drain, source, received))
        await asyncio.sleep(0.05)  # the consumer has both items and waits for a third
        await drain.run()  # nothing was admitted, so the grace period ends at once
        return await consumer, received

    error, received = asyncio.run(asyncio.wait_for(main(), timeout=10))
    assert received == [0, 1]
    assert isinstance(error, ApiError) and error.code == "server_shutting_down"
    assert source.closed


def test_a_stream_asking_after_the_grace_period_ended_gets_the_shutdown_error_without_asking_its_source():
    drain, source = _drain(grace_s=0.0), _Source(ready=5)

    async def main():
        await drain.run()
        received = []
        return await _consume(drain, source, received), received

    error, received = asyncio.run(main())
    assert received == [] and isinstance(error, ApiError) and error.code == "server_shutting_down"


def test_another_cancellation_of_a_waiting_stream_stays_a_cancellation():
    drain, source = _drain(grace_s=60), _Source(ready=1)

    async def main():
        received = []
        consumer = asyncio.ensure_future(_consume(drain, source, received))
        await asyncio.sleep(0.05)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        return received

    assert asyncio.run(main()) == [0]
    assert source.closed


def test_a_finished_source_ends_the_stream_normally():
    drain = _drain(grace_s=60)

    async def finite():
        for index in range(3):
            yield index

    async def main():
        return [item async for item in drain.until_expired(finite())]

    assert asyncio.run(main()) == [0, 1, 2]


async def _consume(drain: Drain, source: _Source, received: list) -> ApiError | None:
    events = source.items()
    try:
        async for item in drain.until_expired(events):
            received.append(item)
    except ApiError as error:
        return error
    finally:
        await events.aclose()
    return None
