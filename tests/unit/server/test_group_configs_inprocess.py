"""Group configs per share group through the real coordinator, leaders,
members and admin, in process: a config set for group A changes A's behaviour and not B's, is
stored durably with the group, and bad input is refused clearly without changing anything."""

from __future__ import annotations

from typing import Any

import pytest
from inprocess_helpers import TOPIC, cluster_with, produce, run, settle
from structlog.testing import capture_logs

import queueflow
from queueflow.engine.state import RecordState
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import group_codec
from queueflow.server import group_configs
from queueflow.server.coordinator import ShareGroupCoordinator
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

LIMIT = "share.delivery.count.limit"
LOCK = "share.record.lock.duration.ms"


async def create_group(cluster: InProcessCluster, group: str) -> None:
    """Make ``group`` exist (a member joins and leaves), as admin calls need."""
    member = cluster.consumer(group)
    await member.subscribe([TOPIC])
    await member.close()
    await settle(cluster)


async def release_twice(cluster: InProcessCluster, group: str) -> list[int]:
    """Deliver record 0 to a member of ``group`` twice, releasing it each time; its delivery
    counts."""
    consumer = cluster.consumer(group, acknowledgement_mode="explicit")
    await consumer.subscribe([TOPIC])
    counts = []
    for _ in range(2):
        (record,) = await consumer.poll(timeout_ms=2000)
        counts.append(record.delivery_count)
        consumer.acknowledge(record, queueflow.RELEASE)
        await consumer.commit_sync()
    await consumer.close()
    await settle(cluster)
    return counts


def test_a_delivery_count_limit_set_for_group_a_archives_only_a_s_records() -> None:
    async def scenario() -> None:
        async with cluster_with(1) as cluster:
            admin = cluster.admin()
            await create_group(cluster, "A")
            await create_group(cluster, "B")
            entries = await admin.alter_group_configs("A", {LIMIT: 2})
            assert {e.name: (e.value, e.source) for e in entries}[LIMIT] == (
                "2",
                "DYNAMIC_GROUP_CONFIG",
            )
            assert await release_twice(cluster, "A") == [1, 2]
            assert await release_twice(cluster, "B") == [1, 2]
            a = cluster.share_partition("A", TOPIC, 0)
            b = cluster.share_partition("B", TOPIC, 0)
            assert a.start_offset == 1  # archived after 2 deliveries: the SPSO moved past it
            assert a.config.delivery_count_limit == 2
            assert b.start_offset == 0 and b.record(0).state is RecordState.AVAILABLE
            assert b.config.delivery_count_limit == cluster.settings.delivery_count_limit
            (b_entry,) = [e for e in await admin.describe_group_configs("B") if e.name == LIMIT]
            assert (b_entry.value, b_entry.source) == ("5", "DEFAULT_CONFIG")

    run(scenario())


def test_a_lock_duration_set_for_group_a_applies_to_a_s_acquisitions_only() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(2, clock=clock) as cluster:
            await create_group(cluster, "A")
            await cluster.admin().alter_group_configs("A", {LOCK: 5000})
            now = clock.now_ms()
            for group in ("A", "B"):
                consumer = cluster.consumer(group, acknowledgement_mode="explicit")
                await consumer.subscribe([TOPIC])
                assert len(await consumer.poll(timeout_ms=2000)) == 2
            a = cluster.share_partition("A", TOPIC, 0).record(0)
            b = cluster.share_partition("B", TOPIC, 0).record(0)
            assert a.lock_deadline_ms == now + 5000
            assert b.lock_deadline_ms == now + cluster.settings.record_lock_duration_ms
            clock.advance(5001)
            await cluster.tick()
            assert cluster.share_partition("A", TOPIC, 0).record(0).state is RecordState.AVAILABLE
            assert cluster.share_partition("B", TOPIC, 0).record(0).state is RecordState.ACQUIRED

    run(scenario())


def test_a_change_reaches_the_leader_with_the_members_next_heartbeat() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(3, clock=clock) as cluster:
            consumer = cluster.consumer("A", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            for record in await consumer.poll(timeout_ms=2000):
                consumer.acknowledge(record, queueflow.RELEASE)
            await consumer.commit_sync()
            engine = cluster.share_partition("A", TOPIC, 0)
            assert engine.config.record_lock_duration_ms == 30000
            with capture_logs() as logs:
                await cluster.admin().alter_group_configs("A", {LOCK: 7000, LIMIT: 3})
                # Records in flight keep their locks; the leader learns the change from the
                # ticket of the member's next heartbeat answer (forced here, not waited for).
                await consumer._session._membership.refresh()  # type: ignore[union-attr]
                again = await consumer.poll(timeout_ms=2000)
            assert [(r.offset, r.delivery_count) for r in again] == [(0, 2), (1, 2), (2, 2)]
            assert engine.config.record_lock_duration_ms == 7000
            assert engine.config.delivery_count_limit == 3
            assert engine.record(0).lock_deadline_ms == clock.now_ms() + 7000
            (applied,) = [e for e in logs if e["event"] == "share_group_configs_applied"]
            assert applied["group"] == "A" and applied["configs"][LOCK] == "7000"
            for record in again:
                consumer.acknowledge(record, queueflow.ACCEPT)
            await consumer.close()

    run(scenario())


def test_session_timeout_and_heartbeat_interval_apply_per_group() -> None:
    async def scenario() -> None:
        async with cluster_with(1) as cluster:
            await create_group(cluster, "A")
            await create_group(cluster, "B")
            await cluster.admin().alter_group_configs(
                "A", {"share.session.timeout.ms": 3000, "share.heartbeat.interval.ms": 300}
            )
            assert cluster.coordinator.groups["A"].session_timeout_ms == 3000
            assert cluster.coordinator.groups["B"].session_timeout_ms == 10_000
            members = {}
            for group in ("A", "B"):
                consumer = members[group] = cluster.consumer(group)
                await consumer.subscribe([TOPIC])
            intervals = {
                g: c._session._membership.heartbeat_interval_ms  # type: ignore[union-attr]
                for g, c in members.items()
            }
            assert intervals == {"A": 300, "B": cluster.settings.heartbeat_interval_ms}
            for consumer in members.values():
                await consumer.close()

    run(scenario())


def test_the_app_s_group_configs_apply_and_admin_set_values_win() -> None:
    async def scenario() -> None:
        cluster = InProcessCluster(
            {TOPIC: 1},
            clock=FakeClock(),
            settings=cluster_with(0).settings,
            group_configs={"A": {LIMIT: 2, "share.auto.offset.reset": "latest"}},
        )
        produce(cluster, 3)
        async with cluster:
            consumer = cluster.consumer("A", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            assert await consumer.poll(timeout_ms=0) == []  # A starts at the log end: 3
            assert cluster.share_partition("A", TOPIC, 0).start_offset == 3
            produce(cluster, 1)  # offset 3: what A's members get
            counts = []
            for _ in range(2):
                (record,) = await consumer.poll(timeout_ms=2000)
                counts.append((record.offset, record.delivery_count))
                consumer.acknowledge(record, queueflow.RELEASE)
                await consumer.commit_sync()
            assert counts == [(3, 1), (3, 2)]
            assert cluster.share_partition("A", TOPIC, 0).start_offset == 4  # archived
            await consumer.close()
            admin = cluster.admin()
            entries = {e.name: e for e in await admin.describe_group_configs("A")}
            assert (entries[LIMIT].value, entries[LIMIT].source) == ("2", "APP_GROUP_CONFIG")
            entries = {e.name: e for e in await admin.alter_group_configs("A", {LIMIT: 4})}
            assert (entries[LIMIT].value, entries[LIMIT].source) == ("4", "DYNAMIC_GROUP_CONFIG")
            entries = {e.name: e for e in await admin.alter_group_configs("A", {}, [LIMIT])}
            assert (entries[LIMIT].value, entries[LIMIT].source) == ("2", "APP_GROUP_CONFIG")

    run(scenario())


def test_by_duration_starts_at_the_first_record_at_most_that_old() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(0, clock=clock) as cluster:
            produce(cluster, 3)  # offsets 0-2 at t
            clock.advance(3_600_000)
            produce(cluster, 2)  # offsets 3-4 an hour later
            clock.advance(60_000)
            await create_group(cluster, "A")
            await cluster.admin().alter_group_configs(
                "A", {"share.auto.offset.reset": "by_duration:PT30M"}
            )
            consumer = cluster.consumer("A")
            await consumer.subscribe([TOPIC])
            records = await consumer.poll(timeout_ms=2000)
            assert [r.offset for r in records] == [3, 4]
            await consumer.close()

    run(scenario())


def test_configs_survive_a_new_coordinator() -> None:
    async def scenario() -> None:
        async with cluster_with(1) as cluster:
            await create_group(cluster, "A")
            await cluster.admin().alter_group_configs(
                "A", {LIMIT: 2, LOCK: 6000, "share.session.timeout.ms": 4000}
            )
            # A new coordinator (failover) loads the group, configs included, from its table.
            fresh = ShareGroupCoordinator(cluster.server, cluster.tables["groups"])
            group = fresh.state.group("A", cluster.clock.now_ms())
            assert group.config_version == 1 and group.session_timeout_ms == 4000
            entries = {e.name: e for e in group_configs.describe(cluster.server, group)}
            assert (entries[LIMIT].value, entries[LIMIT].source) == ("2", "DYNAMIC_GROUP_CONFIG")
            assert entries[LOCK].value == "6000"
            # A restarted leader learns them from the next ticket, before it loads the group.
            # (The same leadership, live already: only its memory is new.)
            leader = cluster.leaders[TOPIC]
            leader.cache.drop({0}, "the leader restarts")
            leader.cache.forget_retained(set())
            leader.group_configs.__init__(cluster.settings)  # type: ignore[misc]
            assert await release_twice(cluster, "A") == [1, 2]
            assert cluster.share_partition("A", TOPIC, 0).start_offset == 1

    run(scenario())


@pytest.mark.parametrize(
    ("group", "set_configs", "delete", "code", "message"),
    [
        (
            "nope",
            {LIMIT: 11},
            [],
            ErrorCode.INVALID_CONFIG,
            "share.delivery.count.limit=11 is out of range",
        ),
        (
            "A",
            {"share.isolation.level": "x"},
            [],
            ErrorCode.INVALID_CONFIG,
            "share.isolation.level='x' is not allowed: "
            "choose one of read_uncommitted, read_committed",
        ),
        ("A", {}, ["bogus"], ErrorCode.INVALID_CONFIG, "unknown group config 'bogus'"),
        (
            "A",
            {LIMIT: 11},
            [],
            ErrorCode.INVALID_CONFIG,
            "share.delivery.count.limit=11 is out of range: allowed [2..10]",
        ),
        (
            "A",
            {LIMIT: 3, LOCK: 999},
            [],
            ErrorCode.INVALID_CONFIG,
            "share.record.lock.duration.ms=999 is out of range: allowed [1000..60000]",
        ),
        (
            "A",
            {"share.heartbeat.interval.ms": 20000},
            [],
            ErrorCode.INVALID_CONFIG,
            "share.heartbeat.interval.ms=20000 is out of range",
        ),
        (
            "A",
            {"share.auto.offset.reset": "oldest"},
            [],
            ErrorCode.INVALID_CONFIG,
            "'oldest' is not allowed",
        ),
    ],
)
def test_bad_input_is_refused_clearly_and_changes_nothing(
    group: str, set_configs: dict[str, Any], delete: list[str], code: ErrorCode, message: str
) -> None:
    async def scenario() -> None:
        async with cluster_with(1) as cluster:
            await create_group(cluster, "A")
            admin = cluster.admin()
            await admin.alter_group_configs("A", {LIMIT: 4})
            before = dict(cluster.tables["groups"])
            with pytest.raises(ShareGroupError) as info:
                await admin.alter_group_configs(group, set_configs, delete)
            assert info.value.code is code
            assert message in info.value.message
            assert dict(cluster.tables["groups"]) == before
            assert cluster.coordinator.groups["A"].configs == {LIMIT: "4"}
            assert cluster.coordinator.groups["A"].config_version == 1
            if group == "nope":  # refused: the group is not kept
                assert "nope" not in cluster.coordinator.groups

    run(scenario())


def test_a_partition_added_at_runtime_is_assigned_and_starts_at_offset_0() -> None:
    """Issue #14 item 4: the group notices the new partition on a heartbeat (a change of the
    topic's partition count bumps the group epoch), and its share-partition starts at the log
    start although the group's share.auto.offset.reset is latest (as Kafka)."""

    async def scenario() -> None:
        async with cluster_with(0, auto_offset_reset="latest") as cluster:
            produce(cluster, 2)  # partition 0: offsets 0-1, before the group starts
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            assert await consumer.poll(timeout_ms=0) == []  # latest: starts at 2
            epoch = cluster.coordinator.groups["g"].group_epoch
            await cluster.add_partitions(TOPIC, 2)
            for i in range(3):  # produced before the group notices partition 1
                cluster.produce(TOPIC, f"new{i}".encode(), partition=1)
            await consumer._session._membership.refresh()  # type: ignore[union-attr]
            group = cluster.coordinator.groups["g"]
            assert group.group_epoch > epoch and group.partitions == {TOPIC: 2}
            assert group.added_partitions == {TOPIC: 1}
            assert consumer.assignment() == {(TOPIC, 0), (TOPIC, 1)}
            records = await consumer.poll(timeout_ms=2000)
            assert [(r.partition, r.offset, r.value) for r in records] == [
                (1, 0, b"new0"),
                (1, 1, b"new1"),
                (1, 2, b"new2"),
            ]
            assert cluster.share_partition("g", TOPIC, 0).start_offset == 2
            await consumer.close()
            # Durable: a new coordinator still knows partition 1 was added.
            again = group_codec.decode_group("g", cluster.tables["groups"][b"g"], 10_000, 200, 0)
            assert again.added_partitions == {TOPIC: 1}

    run(scenario())


def test_configs_set_before_the_first_join_apply_when_the_group_starts() -> None:
    """As ``kafka-configs.sh`` allows: ``share.auto.offset.reset=earliest`` set for a group no
    member has joined yet (Kafka answers no GROUP_ID_NOT_FOUND), and the records produced
    before its first join are delivered; the configs-only group is not listed until then."""

    async def scenario() -> None:
        async with cluster_with(3, auto_offset_reset="latest") as cluster:
            admin = cluster.admin()
            described = {
                e.name: (e.value, e.source) for e in await admin.describe_group_configs("early")
            }
            assert described["share.auto.offset.reset"] == ("latest", "DEFAULT_CONFIG")
            assert "early" not in cluster.coordinator.groups  # a describe keeps nothing
            entries = await admin.alter_group_configs(
                "early", {"share.auto.offset.reset": "earliest"}
            )
            assert {e.name: e.value for e in entries}["share.auto.offset.reset"] == "earliest"
            assert await admin.list_groups() == []
            consumer = cluster.consumer("early")
            await consumer.subscribe([TOPIC])
            got: list[bytes | None] = []
            for _ in range(20):
                got += [r.value for r in await consumer.poll(timeout_ms=200)]
                if len(got) == 3:
                    break
            assert got == [b"r0", b"r1", b"r2"]
            await consumer.close()
            assert [g.group_id for g in await admin.list_groups()] == ["early"]

    run(scenario())
