"""The shared admin client of :class:`queueflow.kafka.admin.TopicMetadata`: one that failed is
replaced by a fresh one on the next call (after a broker restart an aiokafka admin client can
stay on ``NodeNotReadyError``, node id None, for good: a leader's DLQ writer then held its
records until the end of a ``make chaos`` run)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
import stamina
from aiokafka.errors import NodeNotReadyError

from queueflow.kafka import admin as admin_module
from queueflow.kafka.admin import TopicMetadata
from queueflow.kafka.config import KafkaClientConfig


class _Admin:
    """An admin client that fails every request once it is broken."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken
        self.closed = False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True


def test_a_failed_admin_client_is_closed_and_the_next_call_starts_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[_Admin] = []

    def make(_config: KafkaClientConfig) -> _Admin:
        made.append(_Admin(broken=not made))  # the first client is broken for good
        return made[-1]

    async def counts(admin: _Admin, names: Iterable[str]) -> dict[str, int]:
        if admin.broken:
            raise NodeNotReadyError("Attempt to send a request to node which is not ready")
        return {n: 3 for n in names}

    monkeypatch.setattr(admin_module, "admin_client", make)
    monkeypatch.setattr(admin_module, "existing_partition_counts", counts)
    metadata = TopicMetadata(KafkaClientConfig("127.0.0.1:1"))

    async def scenario() -> dict[str, int]:
        with pytest.raises(NodeNotReadyError):
            await metadata.partition_counts(["orders-dlq"])
        return await metadata.partition_counts(["orders-dlq"])

    assert asyncio.run(scenario()) == {"orders-dlq": 3}
    assert len(made) == 2 and made[0].closed and not made[1].closed


class _FlakyAdmin:
    """An admin client whose requests go to a dead broker the first ``failures`` times (as
    aiokafka's do, to a random known broker, until the controller fences the dead one)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def list_topics(self) -> list[str]:
        self.calls += 1
        if self.calls <= self.failures:
            raise NodeNotReadyError("Attempt to send a request to node which is not ready (3)")
        return ["orders", "other"]

    async def describe_topics(self, names: list[str]) -> list[dict[str, object]]:
        return [{"topic": n, "error_code": 0, "partitions": [{}, {}, {}]} for n in names]


def test_a_metadata_lookup_that_reached_a_dead_broker_is_retried() -> None:
    stamina.set_testing(True, attempts=admin_module.METADATA_ATTEMPTS)  # no back-off waits
    try:
        flaky = _FlakyAdmin(failures=2)
        counts = asyncio.run(admin_module.existing_partition_counts(flaky, ["orders"]))
        assert (counts, flaky.calls) == ({"orders": 3}, 3)
        broken = _FlakyAdmin(failures=admin_module.METADATA_ATTEMPTS)
        with pytest.raises(NodeNotReadyError):
            asyncio.run(admin_module.existing_partition_counts(broken, ["orders"]))
        assert broken.calls == admin_module.METADATA_ATTEMPTS
    finally:
        stamina.set_testing(False)


def test_a_topic_declaration_that_reached_a_dead_broker_is_retried() -> None:
    calls: list[int] = []

    async def declare() -> None:  # Faust's Topic.maybe_declare, sent to a random broker
        calls.append(1)
        if len(calls) == 1:
            raise NodeNotReadyError("Attempt to send a request to node which is not ready (2)")

    stamina.set_testing(True, attempts=admin_module.METADATA_ATTEMPTS)
    try:
        asyncio.run(admin_module.retry_unready(declare))
    finally:
        stamina.set_testing(False)
    assert len(calls) == 2
