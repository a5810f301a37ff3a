"""The sharded coordinator (docs/architecture.md "Coordinator sharding"): share groups hashed to
coordinator partitions as Kafka's group coordinator does, members, the admin and leaders routing
by it, the coordinator refusing requests sent to another partition, the partition count read
from existing topics."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import pytest
from inprocess_helpers import TOPIC, RawMember, produce, run, settings, settle
from structlog.testing import capture_logs

import queueflow
from queueflow.errors import ConfigurationError
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

#: ``(group, String.hashCode(), [Utils.abs(hashCode) % n for n in (1, 3, 8, 50)])``, computed
#: by the JVM (OpenJDK 17, ``org.apache.kafka.common.utils.Utils`` of kafka-clients 4.3.1, the
#: expression of ``GroupCoordinatorService.partitionFor``). ``polygenelubricants`` hashes to
#: ``Integer.MIN_VALUE``, which ``Utils.abs`` maps to 0; the emoji is two UTF-16 surrogates.
JAVA_VECTORS = [
    ("", 0, [0, 0, 0, 0]),
    ("a", 97, [0, 1, 1, 47]),
    ("hello", 99162322, [0, 1, 2, 22]),
    ("my-group", -1906497762, [0, 0, 2, 12]),
    ("orders", -1008770331, [0, 0, 3, 31]),
    ("polygenelubricants", -2147483648, [0, 0, 0, 0]),
    ("Aa", 2112, [0, 0, 0, 12]),
    ("BB", 2112, [0, 0, 0, 12]),
    ("g-199", 96512171, [0, 2, 3, 21]),
    ("\u00e9t\u00e9", 227742, [0, 0, 6, 42]),
    ("\u7ec4", 32452, [0, 1, 4, 2]),
    ("\U0001f600", 1772899, [0, 1, 3, 49]),
    ("share-group-with-a-rather-long-name-0001", -712897704, [0, 0, 0, 4]),
]


@pytest.mark.parametrize(("group", "java_hash", "partitions"), JAVA_VECTORS)
def test_groups_hash_to_the_partition_kafka_gives_them(
    group: str, java_hash: int, partitions: list[int]
) -> None:
    assert topics.java_string_hash(group) == java_hash
    assert [topics.coordinator_partition(group, n) for n in (1, 3, 8, 50)] == partitions


def test_a_coordinator_topic_has_at_least_one_partition() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        topics.coordinator_partition("g", 0)


def test_two_hundred_groups_spread_over_every_partition() -> None:
    counts = [0] * 8
    for i in range(200):
        counts[topics.coordinator_partition(f"group-{i}", 8)] += 1
    assert sum(counts) == 200 and min(counts) >= 15, counts


# -- the partition count: the existing topics win ------------------------------------------


@pytest.mark.parametrize(
    ("topic", "changelog", "expected"),
    [
        (None, None, 8),  # a new app: the setting
        (1, 1, 1),  # an app made before sharding keeps its one partition
        (1, None, 1),  # the coordinator topic exists, the table never wrote
        (None, 3, 3),  # the state is there: its count, whatever the setting
        (12, 12, 12),
    ],
)
def test_the_count_is_the_existing_topics_else_the_setting(
    topic: int | None, changelog: int | None, expected: int
) -> None:
    assert topics.resolve_coordinator_partitions("app", 8, topic, changelog) == expected


def test_a_coordinator_topic_and_changelog_of_different_counts_are_refused() -> None:
    with pytest.raises(ConfigurationError) as info:
        topics.resolve_coordinator_partitions("app", 8, 8, 1)
    message = str(info.value)
    assert "app-share-coordinator" in message and "app-share-groups-changelog" in message
    assert "8 partitions" in message and "has 1" in message


# -- routing in process --------------------------------------------------------------------


def sharded(partitions: int = 8, **overrides: Any) -> InProcessCluster:
    cluster = InProcessCluster(
        {TOPIC: 2},
        clock=FakeClock(),
        settings=settings(**overrides),
        coordinator_partitions=partitions,
    )
    produce(cluster, 4, partitions=2)
    return cluster


def coordinator_sends(cluster: InProcessCluster) -> list[tuple[int, Any]]:
    """Every message sent to the coordinator topic from now on, as ``(partition, message)``."""
    seen: list[tuple[int, Any]] = []
    bus, send = cluster.bus, cluster.bus.send
    name = topics.coordinator_topic(cluster.app_id)

    async def tapped(topic: str, partition: int, value: bytes, key: bytes | None = None) -> None:
        if topic == name:
            seen.append((partition, protocol.decode(value)))
        await send(topic, partition, value, key)

    bus.send = tapped  # type: ignore[method-assign]
    return seen


def test_members_of_many_groups_heartbeat_to_their_groups_partitions_and_consume() -> None:
    groups = [f"group-{i}" for i in range(24)]
    expected = {g: topics.coordinator_partition(g, 8) for g in groups}
    assert len(set(expected.values())) == 8  # every partition coordinates some of them

    async def scenario() -> tuple[list[tuple[int, Any]], dict[str, set[int]]]:
        async with sharded() as cluster:
            sent = coordinator_sends(cluster)
            got: dict[str, set[int]] = {}
            for group in groups:
                consumer = cluster.consumer(group)
                await consumer.subscribe([TOPIC])
                records: list[Any] = []
                while len(records) < 4:
                    records += await consumer.poll(timeout_ms=100)
                    cluster.clock.advance(10)
                got[group] = {r.offset + 10 * r.partition for r in records}
                await consumer.close()
            await settle(cluster)
            return sent, got

    sent, got = run(scenario())
    assert got == {g: {0, 1, 10, 11} for g in groups}
    heartbeats = [(p, m) for p, m in sent if isinstance(m, protocol.HeartbeatRequest)]
    assert {m.group for _, m in heartbeats} == set(groups)
    assert all(p == expected[m.group] for p, m in heartbeats)


def test_a_request_on_another_partition_than_its_groups_is_skipped_and_logged() -> None:
    group = "orders"  # partition 3 of 8
    assert topics.coordinator_partition(group, 8) == 3

    async def scenario() -> tuple[list[dict[str, Any]], Any, float]:
        async with sharded() as cluster:
            member = RawMember(cluster, "m-1", group)
            cluster_topic = topics.coordinator_topic(cluster.app_id)
            with capture_logs() as logs:
                await cluster.bus.send(
                    cluster_topic, 0, protocol.encode(member.heartbeat_request(0)), b"m-1"
                )
                await settle(cluster)
                await asyncio.sleep(0.05)
            assert member.replies == []  # never served: partition 3's coordinator owns it
            assert group not in cluster.coordinator.groups
            answer = await member.call(cluster_topic, 3, member.heartbeat_request(0))
            unserved = cluster.metrics.coordinator_unserved.labels("misrouted")._value.get()
            return logs, answer, unserved

    logs, answer, unserved = run(scenario())
    misrouted = [e for e in logs if e["event"] == "coordinator_request_misrouted"]
    assert len(misrouted) == 1, logs
    assert misrouted[0]["partition"] == 0 and misrouted[0]["expected_partition"] == 3
    assert misrouted[0]["log_level"] == "error" and misrouted[0]["group"] == group
    assert isinstance(answer, protocol.HeartbeatResponse) and answer.member_epoch == 1
    assert unserved == 1


def test_a_revoked_coordinator_partition_forgets_only_its_own_groups() -> None:
    groups = [f"group-{i}" for i in range(16)]

    async def scenario() -> tuple[set[str], set[str]]:
        async with sharded() as cluster:
            for i, group in enumerate(groups):
                member = RawMember(cluster, f"m-{i}", group)
                topic = topics.coordinator_topic(cluster.app_id)
                await member.call(
                    topic, topics.coordinator_partition(group, 8), member.heartbeat_request(0)
                )
            before = set(cluster.coordinator.groups)
            cluster.coordinator.revoke({topics.coordinator_partition("group-0", 8)})
            return before, set(cluster.coordinator.groups)

    before, after = run(scenario())
    assert before == set(groups)
    revoked = topics.coordinator_partition("group-0", 8)
    moved = {g for g in groups if topics.coordinator_partition(g, 8) == revoked}
    assert after == set(groups) - moved and moved


class ScopedTable(dict[bytes, bytes]):
    """The groups table of a Faust host, as far as partitions go: a write goes to the
    partition of the current state scope (Faust's current event), recorded as
    ``(partition or None, key)``."""

    def __init__(self, scope: ContextVar[int | None]) -> None:
        super().__init__()
        self.scope = scope
        self.writes: list[tuple[int | None, bytes]] = []

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.writes.append((self.scope.get(), key))
        super().__setitem__(key, value)


def test_each_group_is_written_in_its_own_coordinator_partition() -> None:
    """A Tick arrives on every coordinator partition the worker owns and touches every group
    it coordinates: each group's record must still go to its own partition of the groups
    changelog, or the admin (and the group's next coordinator) read a stale copy from
    another partition."""
    scope: ContextVar[int | None] = ContextVar("partition", default=None)

    @contextlib.contextmanager
    def state_scope(topic: str, partition: int) -> Iterator[None]:
        token = scope.set(partition)
        try:
            yield
        finally:
            scope.reset(token)

    groups = {"orders": 3, "a": 1}

    async def scenario() -> list[tuple[int | None, bytes]]:
        async with sharded() as cluster:
            table = ScopedTable(scope)
            cluster.server.state_scope = state_scope
            cluster.coordinator.table = cluster.coordinator.state.table = table
            for i, group in enumerate(groups):
                member = RawMember(cluster, f"m-{i}", group)
                topic = topics.coordinator_topic(cluster.app_id)
                answer = await member.call(topic, groups[group], member.heartbeat_request(0))
                assert answer.error == "NONE", answer
            cluster.clock.advance(60_000)  # every session lapses: the ticks expire them
            await cluster.tick()
            await settle(cluster)
            return table.writes

    writes = run(scenario())
    assert {key for _, key in writes} == {b"orders", b"a"}
    assert len(writes) >= 4  # joined, then expired by a tick
    assert all(partition == groups[key.decode()] for partition, key in writes), writes


def test_the_admin_reaches_the_coordinator_of_a_group_on_any_partition() -> None:
    async def scenario() -> list[str]:
        async with sharded() as cluster:
            for group in ("orders", "a", "my-group"):  # partitions 3, 1, 2 of 8
                consumer = cluster.consumer(group)
                await consumer.subscribe([TOPIC])
                while not await consumer.poll(timeout_ms=100):
                    cluster.clock.advance(10)
                await consumer.close()
            await settle(cluster)
            admin = cluster.admin()
            await admin.delete_share_groups(["orders", "my-group"])
            return [g.group_id for g in await admin.list_groups()]

    assert run(scenario()) == ["a"]


def test_a_member_finds_its_groups_coordinator_partition_before_it_joins() -> None:
    async def scenario() -> int:
        async with sharded() as cluster:
            consumer = cluster.consumer("orders")
            await consumer.subscribe([TOPIC])
            session = consumer._session
            assert session is not None
            partition = session._membership.coordinator_partition
            await consumer.close()
            return partition

    assert run(scenario()) == 3


def test_the_in_process_cluster_refuses_a_coordinator_topic_without_partitions() -> None:
    with pytest.raises(ValueError, match="coordinator_partitions=0"):
        InProcessCluster({TOPIC: 1}, coordinator_partitions=0)


def test_share_agent_harness_and_default_clusters_keep_one_partition() -> None:
    cluster = InProcessCluster({TOPIC: 1})
    assert cluster.server.coordinator_partitions == 1
    assert queueflow.ShareGroupSettings().coordinator_topic_partitions == 8
