"""Closing the leaders' ListOffsets client while a call is under way (a worker stopping): the
call fails at once instead of waiting out aiokafka's request timeout (40 s) for metadata that
the stopped client never fetches, which held the stopping worker's last stream event, and with
it the shutdown and its coordinator's answers (found by the rolling-upgrade test)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.errors import KafkaConnectionError
from inprocess_helpers import run

from queueflow.kafka.config import KafkaClientConfig
from queueflow.server.log_offsets import LogOffsets
from queueflow.structs import TopicPartition

TP = TopicPartition("jobs", 0)


class StuckConsumer:
    """An aiokafka consumer whose ListOffsets never completes (its metadata never comes)."""

    def __init__(self) -> None:
        self.stopped = False

    async def end_offsets(self, partitions: list[object]) -> dict[object, int]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        self.stopped = True


def test_a_call_under_way_fails_at_once_when_the_client_closes() -> None:
    async def scenario() -> None:
        offsets = LogOffsets(KafkaClientConfig("localhost:1"))
        consumer = StuckConsumer()
        offsets._consumer = consumer  # type: ignore[assignment]
        call = asyncio.ensure_future(offsets.log_end(TP))
        await asyncio.sleep(0.05)
        assert not call.done()
        started = time.monotonic()
        await offsets.close()
        with pytest.raises(KafkaConnectionError, match="the worker is stopping"):
            await asyncio.wait_for(call, 2.0)
        assert time.monotonic() - started < 1.0
        assert consumer.stopped

    run(scenario())


def test_a_caller_cancelled_otherwise_is_still_cancelled() -> None:
    async def scenario() -> None:
        offsets = LogOffsets(KafkaClientConfig("localhost:1"))
        offsets._consumer = StuckConsumer()  # type: ignore[assignment]
        call = asyncio.ensure_future(offsets.log_end(TP))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert not offsets._asking
        await offsets.close()

    run(scenario())
