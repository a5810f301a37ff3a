"""Stopping Kafka clients (:func:`queueflow.kafka.lifecycle.stop_quietly`): a ``CancelledError``
raised by a client's ``stop()`` (aiokafka's producer, with the broker gone) must not look like a
cancellation of the caller; a real cancellation still goes through."""

from __future__ import annotations

import asyncio
import sys

import pytest
from structlog.testing import capture_logs

from queueflow.kafka.lifecycle import stop_quietly


async def _raises(exc: BaseException) -> None:
    await asyncio.sleep(0)
    raise exc


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is Python 3.11+")
def test_a_cancelled_error_out_of_stop_is_logged_not_raised() -> None:
    async def scenario() -> str:
        await stop_quietly("member producer", lambda: _raises(asyncio.CancelledError()))
        return "went on"

    with capture_logs() as logs:
        assert asyncio.run(scenario()) == "went on"
    assert [(e["event"], e["client"], e["error"]) for e in logs] == [
        ("client_stop_failed", "member producer", "CancelledError")
    ]


def test_other_errors_are_logged_not_raised() -> None:
    with capture_logs() as logs:
        asyncio.run(stop_quietly("member reply consumer", lambda: _raises(OSError("gone"))))
    assert [(e["event"], e["error"]) for e in logs] == [("client_stop_failed", "OSError('gone')")]


def test_a_real_cancellation_of_the_caller_goes_through() -> None:
    async def scenario() -> bool:
        stopping = asyncio.Event()

        async def slow_stop() -> None:
            stopping.set()
            await asyncio.sleep(10)

        task = asyncio.ensure_future(stop_quietly("member producer", slow_stop))
        await stopping.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(asyncio.wait_for(scenario(), 5))
