"""The admin API's write side: ``alter_share_group_offsets``,
``delete_share_group_offsets`` and ``delete_share_groups`` through the real coordinator and
leaders of an ``InProcessCluster``, the join race, and the offset helpers (datetimes, ISO-8601
durations)."""

from __future__ import annotations

import asyncio
import calendar
import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, cluster_with, produce, run, settle

import queueflow
from queueflow.admin import OffsetSpec, ShareGroupAdmin, parse_datetime, parse_duration
from queueflow.engine.group_config import GroupConfig
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.server.durable import DurableSharePartition
from queueflow.server.group_configs import engine_config
from queueflow.structs import TopicPartition
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


async def finish(cluster: InProcessCluster, group: str = "g") -> list[tuple[int, int]]:
    """A member of ``group`` ACCEPTs everything there is, then leaves; returns what it got as
    ``(partition, offset)``."""
    consumer = cluster.consumer(group)
    await consumer.subscribe([TOPIC])
    got: list[tuple[int, int]] = []
    while batch := await consumer.poll(timeout_ms=0):
        got += [(r.partition, r.offset) for r in batch]
    await consumer.commit_sync()
    await consumer.close()
    await settle(cluster)
    return got


async def first_poll(cluster: InProcessCluster, group: str = "g") -> list[tuple[int, int, int]]:
    """A new member's first poll: ``(partition, offset, delivery count)``; it leaves after."""
    consumer = cluster.consumer(group, acknowledgement_mode="explicit")
    await consumer.subscribe([TOPIC])
    records = await consumer.poll(timeout_ms=0)
    for r in records:
        consumer.acknowledge(r, queueflow.RELEASE)
    await consumer.close()
    await settle(cluster)
    return [(r.partition, r.offset, r.delivery_count) for r in records]


def durable_spso(cluster: InProcessCluster, partition: int, group: str = "g") -> int | None:
    """The SPSO a new leader would restore from the table (None: no state)."""
    settings = cluster.settings
    config = engine_config(settings, GroupConfig.resolve(settings))
    durable = DurableSharePartition.load(
        dict(cluster.tables[TOPIC]), group, TOPIC, partition, config, 10
    )
    return None if durable is None else durable.engine.start_offset


def tables(cluster: InProcessCluster) -> dict[str, dict[bytes, bytes]]:
    return {name: dict(table) for name, table in cluster.tables.items()}


# -- alter offsets ---------------------------------------------------------------------------


def test_reset_on_an_empty_group_moves_the_spso_and_the_next_member_starts_there() -> None:
    async def scenario() -> None:
        async with cluster_with(8, partitions=2) as cluster:
            assert len(await finish(cluster)) == 8
            assert cluster.share_partition("g", TOPIC, 0).start_offset == 4
            admin = cluster.admin()
            # back to offset 1 on partition 0 (re-deliver 3 records), forward past the end on 1
            done = await admin.alter_share_group_offsets("g", {TP0: 1, TP1: 6})
            assert done == {TP0: 1, TP1: 6}
            engine = cluster.share_partition("g", TOPIC, 0)
            assert (engine.start_offset, engine.end_offset, engine.in_flight_count) == (1, 1, 0)
            assert durable_spso(cluster, 0) == 1 and durable_spso(cluster, 1) == 6
            # The next member gets partition 0 from offset 1, as first deliveries; nothing of 1.
            got = await first_poll(cluster)
            assert got == [(0, 1, 1), (0, 2, 1), (0, 3, 1)]
            produce(cluster, 4, partitions=2)  # partition 1 reaches offsets 4, 5 (below 6)...
            produce(cluster, 4, partitions=2)  # ...and 6, 7
            got = [(p, o) for p, o, _ in await first_poll(cluster) if p == 1]
            assert got == [(1, 6), (1, 7)]

    run(scenario())


def test_reset_of_a_share_partition_without_state_initialises_it_at_the_offset() -> None:
    async def scenario() -> None:
        async with cluster_with(6, partitions=2) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])  # the group knows the topic
            await consumer.close()
            await settle(cluster)
            # never fetched from: the leave's ReleaseMember does not initialise it
            assert ("g", 1) not in cluster.leaders[TOPIC].partitions
            assert durable_spso(cluster, 1) is None
            admin = cluster.admin()
            assert await admin.alter_share_group_offsets("g", {TP1: 2}) == {TP1: 2}
            assert durable_spso(cluster, 1) == 2
            # partition 1 holds offsets 0..2: from 2 on, only 2; partition 0 starts at earliest
            got = [(p, o) for p, o, _ in await first_poll(cluster)]
            assert sorted(got) == [(0, 0), (0, 1), (0, 2), (1, 2)]

    run(scenario())


def test_a_group_with_members_is_refused_and_nothing_changes() -> None:
    async def scenario() -> None:
        async with cluster_with(4) as cluster:
            holder = cluster.consumer("g", acknowledgement_mode="explicit")
            await holder.subscribe([TOPIC])
            held = await holder.poll(timeout_ms=0)
            assert held
            await settle(cluster)
            before = tables(cluster)
            engine = cluster.share_partition("g", TOPIC, 0)
            acquired = engine.acquired_count
            admin = cluster.admin()
            with pytest.raises(ShareGroupError) as info:
                await admin.alter_share_group_offsets("g", {TP0: 3})
            assert info.value.code is ErrorCode.NON_EMPTY_GROUP
            assert "share group 'g' is not empty" in info.value.message
            for delete in (
                admin.delete_share_group_offsets("g", [TOPIC]),
                admin.delete_share_groups(["g"]),
            ):
                outcome: Any = None
                try:
                    outcome = await delete
                except ShareGroupError as exc:
                    outcome = {"g": exc}
                assert outcome["g"].code is ErrorCode.NON_EMPTY_GROUP
            await settle(cluster)
            assert tables(cluster) == before
            assert cluster.share_partition("g", TOPIC, 0) is engine
            assert (engine.start_offset, engine.acquired_count) == (0, acquired)
            # the holder is unaffected: its acknowledgements still count
            for r in held:
                holder.acknowledge(r, queueflow.ACCEPT)
            assert all(e is None for e in (await holder.commit_sync()).values())
            await holder.close()

    run(scenario())


def test_unknown_group_topic_or_partition_and_bad_offsets_are_refused() -> None:
    async def scenario() -> None:
        async with cluster_with(4, partitions=2) as cluster:
            await finish(cluster)
            before = tables(cluster)
            admin = cluster.admin()
            cases = [
                ("nope", {TP0: 0}, ErrorCode.GROUP_ID_NOT_FOUND, "'nope' does not exist"),
                (
                    "g",
                    {TopicPartition("other", 0): 0},
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    "no share-partitions of topic(s) other",
                ),
                (
                    "g",
                    {TopicPartition(TOPIC, 2): 0},
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    "has no partition 2",
                ),
                ("g", {TP0: 0, TP1: -1}, ErrorCode.INVALID_REQUEST, "must be >= 0"),
            ]
            for group, offsets, code, text in cases:
                with pytest.raises(ShareGroupError) as info:
                    await admin.alter_share_group_offsets(group, offsets)
                assert info.value.code is code and text in info.value.message, info.value
            with pytest.raises(ShareGroupError) as info:
                await admin.delete_share_group_offsets("g", ["other"])
            assert info.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            (refused,) = (await admin.delete_share_groups(["nope"])).values()
            assert refused is not None and refused.code is ErrorCode.GROUP_ID_NOT_FOUND
            await settle(cluster)
            assert tables(cluster) == before

    run(scenario())


# -- delete offsets / groups -----------------------------------------------------------------


def test_delete_offsets_removes_the_state_and_the_next_member_starts_afresh() -> None:
    async def scenario() -> None:
        async with cluster_with(4, partitions=2) as cluster:
            await finish(cluster)
            assert durable_spso(cluster, 0) == 2
            await cluster.admin().delete_share_group_offsets("g", [TOPIC])
            assert durable_spso(cluster, 0) is None and durable_spso(cluster, 1) is None
            assert not [k for k in cluster.tables[TOPIC] if b"/g/" in k]  # snapshots and deltas
            assert cluster.share_partition("g", TOPIC, 0) is None
            assert TOPIC not in cluster.coordinator.groups["g"].partitions
            # share.auto.offset.reset=earliest: everything is delivered again
            got = await first_poll(cluster)
            assert sorted((p, o) for p, o, _ in got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
            assert {c for _, _, c in got} == {1}

    run(scenario())


def test_delete_group_removes_its_metadata_and_state() -> None:
    async def scenario() -> None:
        async with cluster_with(4, partitions=2) as cluster:
            await finish(cluster, "g")
            await finish(cluster, "other")
            result = await cluster.admin().delete_share_groups(["g", "nope"])
            assert result["g"] is None
            assert (
                result["nope"] is not None and result["nope"].code is ErrorCode.GROUP_ID_NOT_FOUND
            )
            assert b"g" not in cluster.tables["groups"] and "g" not in cluster.coordinator.groups
            assert durable_spso(cluster, 0) is None and durable_spso(cluster, 1) is None
            assert durable_spso(cluster, 0, "other") == 2  # another group is untouched
            with pytest.raises(ShareGroupError) as info:
                await cluster.admin().alter_share_group_offsets("g", {TP0: 0})
            assert info.value.code is ErrorCode.GROUP_ID_NOT_FOUND
            # the group id can be used again: a new group, from share.auto.offset.reset
            assert len(await first_poll(cluster, "g")) == 4

    run(scenario())


# -- the join race -----------------------------------------------------------------------------


def heartbeat(group: str, member_id: str, reply_partition: int = 0) -> bytes:
    return protocol.encode(
        protocol.HeartbeatRequest(
            group=group,
            member_id=member_id,
            member_epoch=0,
            subscribed_topics=[TOPIC],
            reply_partition=reply_partition,
            request_id=1,
        )
    )


def test_joins_are_refused_while_a_reset_is_pending_and_allowed_after() -> None:
    """The coordinator holds joins of the group back from the emptiness check until every
    leader has answered: a member can't acquire records that the reset then discards."""

    async def scenario() -> None:
        async with cluster_with(4) as cluster:
            await finish(cluster)
            replies: list[protocol.Message] = []
            cluster.bus.members[b"joiner"] = lambda data: replies.append(protocol.decode(data))
            cluster.bus.members[b"admin-x"] = lambda data: replies.append(protocol.decode(data))
            request = protocol.AlterShareGroupOffsetsRequest(
                group="g",
                admin_id="admin-x",
                request_id=7,
                reply_partition=0,
                offsets=[(TOPIC, 0, 0)],
                deadline_ms=cluster.clock.now_ms() + 10_000,
            )
            coordinator = cluster.coordinator
            # Handled directly, with nothing in between: the leader has not read the reset yet.
            await coordinator.handle(0, 100, protocol.encode(request))
            assert "g" in coordinator.pending
            await coordinator.handle(0, 101, heartbeat("g", "joiner"))
            await asyncio.sleep(0)
            (refused,) = replies
            assert isinstance(refused, protocol.HeartbeatResponse)
            assert refused.error == ErrorCode.REQUEST_TIMED_OUT.value  # retriable: joins retry
            assert "being changed by an admin request" in refused.error_message
            assert "joiner" not in coordinator.groups["g"].members
            await settle(cluster)  # the leader resets and answers; the coordinator answers
            await asyncio.sleep(0)
            answer = replies[-1]
            assert isinstance(answer, protocol.AdminResponse) and answer.request_id == 7
            assert answer.error == ErrorCode.NONE.value
            assert answer.results == [(TOPIC, 0, ErrorCode.NONE.value, "", 0)]
            assert "g" not in coordinator.pending
            await coordinator.handle(0, 102, heartbeat("g", "joiner"))
            await asyncio.sleep(0)
            joined = replies[-1]
            assert isinstance(joined, protocol.HeartbeatResponse)
            assert joined.error == ErrorCode.NONE.value and joined.member_epoch > 0

    run(scenario())


def test_a_pending_request_past_its_deadline_lets_joins_in_again() -> None:
    """No leader answers (none leads the partition): at the deadline the coordinator lets joins
    in again and tells the admin which leaders did not answer; nothing was deleted. A request
    read after its deadline (replayed after a restart) is dropped, not applied."""
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(2, clock=clock) as cluster:
            await finish(cluster)
            cluster.bus.handlers[topics.request_topic(cluster.app_id, TOPIC)] = _ignore
            replies: list[protocol.Message] = []
            cluster.bus.members[b"a"] = lambda data: replies.append(protocol.decode(data))
            request = protocol.DeleteShareGroupRequest(
                group="g",
                admin_id="a",
                request_id=1,
                reply_partition=0,
                deadline_ms=clock.now_ms() + 1000,
            )
            await cluster.coordinator.handle(0, 100, protocol.encode(request))
            assert "g" in cluster.coordinator.pending
            clock.advance(1001)
            await cluster.tick()
            await asyncio.sleep(0)
            assert "g" not in cluster.coordinator.pending
            assert "g" in cluster.coordinator.groups  # not deleted: no leader answered
            (answer,) = replies
            assert isinstance(answer, protocol.AdminResponse)
            assert answer.error == ErrorCode.REQUEST_TIMED_OUT.value
            assert f"leaders of {TOPIC}[0] did not answer" in answer.error_message
            assert "Nothing was applied" in answer.error_message
            sent = len(cluster.bus.sent)
            await cluster.coordinator.handle(0, 100, protocol.encode(request))  # replayed
            await settle(cluster)
            assert "g" not in cluster.coordinator.pending and len(cluster.bus.sent) == sent
            assert len(replies) == 1

    run(scenario())


async def _ignore(partition: int, offset: int, value: bytes) -> None:
    return None


def test_the_leader_refuses_a_reset_while_records_are_acquired() -> None:
    """The backstop (a coordinator failover lost the pending request, or a member fetched
    meanwhile): a share-partition with Acquired records is not reset, and says why."""

    async def scenario() -> None:
        async with cluster_with(3) as cluster:
            holder = cluster.consumer("g", acknowledgement_mode="explicit")
            await holder.subscribe([TOPIC])
            assert await holder.poll(timeout_ms=0)
            await settle(cluster)
            engine = cluster.share_partition("g", TOPIC, 0)
            state = (engine.start_offset, engine.end_offset, engine.acquired_count)
            for start, deadline, code in (
                (0, 0, ErrorCode.NON_EMPTY_GROUP),
                (None, 0, ErrorCode.NON_EMPTY_GROUP),
                (0, cluster.clock.now_ms() - 1, ErrorCode.REQUEST_TIMED_OUT),
            ):
                reset = protocol.ResetSharePartition(
                    group="g",
                    topic=TOPIC,
                    partition=0,
                    admin_id="a",
                    request_id=1,
                    start_offset=start,
                    deadline_ms=deadline,
                )
                sent = len(cluster.bus.sent)
                await cluster.bus.send(
                    topics.request_topic(cluster.app_id, TOPIC), 0, protocol.encode(reset)
                )
                await settle(cluster)
                (result,) = [
                    protocol.decode(v)
                    for t, _, v in cluster.bus.sent[sent:]
                    if t == topics.coordinator_topic(cluster.app_id)
                ]
                assert isinstance(result, protocol.ResetSharePartitionResult)
                assert result.error == code.value, result
                assert cluster.share_partition("g", TOPIC, 0) is engine
                assert (engine.start_offset, engine.end_offset, engine.acquired_count) == state
            await holder.close()

    run(scenario())


def test_no_coordinator_answer_is_a_timeout_naming_the_coordinator_topic() -> None:
    class Nowhere:
        reply_partition = 0

        async def start(self, on_reply: Any) -> None:
            pass

        async def send(self, topic: str, partition: int, payload: bytes) -> None:
            pass

        async def close(self) -> None:
            pass

    admin = ShareGroupAdmin(
        "app",
        KafkaClientConfig("x:1"),
        100,
        transport=lambda _: Nowhere(),
        coordinator_partitions=1,
    )
    with pytest.raises(ShareGroupError) as info:
        run(admin.alter_share_group_offsets("g", {TP0: 0}))
    assert info.value.code is ErrorCode.REQUEST_TIMED_OUT
    assert "app-share-coordinator[0]" in info.value.message and "100 ms" in info.value.message


def test_signed_admin_requests_work_under_hmac() -> None:
    async def scenario() -> None:
        from inprocess_helpers import settings

        cluster = InProcessCluster(
            {TOPIC: 1},
            clock=FakeClock(),
            settings=settings(
                auth_mode="hmac", auth_secret="kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0"
            ),
        )
        produce(cluster, 2)
        async with cluster:
            await finish(cluster)
            assert await cluster.admin().alter_share_group_offsets("g", {TP0: 1}) == {TP0: 1}

    run(scenario())


# -- resolving offsets -------------------------------------------------------------------------


def test_resolve_offsets_like_kafka_share_groups() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        cluster = InProcessCluster({TOPIC: 1}, clock=clock)
        for _ in range(5):  # offsets 0..4 at t0, t0+1 s, ... t0+4 s
            cluster.produce(TOPIC, b"x")
            clock.advance(1000)
        t0 = clock.now_ms() - 5000
        admin = cluster.admin()

        async def resolve(spec: OffsetSpec) -> int:
            return (await admin.resolve_offsets([TP0], spec))[TP0]

        assert await resolve(OffsetSpec.earliest()) == 0
        assert await resolve(OffsetSpec.latest()) == 5
        assert await resolve(OffsetSpec.exact(3)) == 3
        assert await resolve(OffsetSpec.exact(99)) == 5  # clamped to the log end
        assert await resolve(OffsetSpec.at(t0 + 2000)) == 2
        assert await resolve(OffsetSpec.at(t0 + 1500)) == 2  # first at or after
        assert await resolve(OffsetSpec.at(t0 + 60_000)) == 5  # none after: the log end
        when = dt.datetime.fromtimestamp((t0 + 3000) / 1000, tz=dt.timezone.utc)
        assert await resolve(OffsetSpec.at(when)) == 3
        assert await resolve(OffsetSpec.ago("PT2S")) == 3  # now = t0 + 5 s
        assert await resolve(OffsetSpec.ago(dt.timedelta(hours=1))) == 0

    run(scenario())


def test_parse_datetime_as_kafka_does() -> None:
    assert parse_datetime("2026-11-25T10:00:00.000") == 1_795_600_800_000
    assert parse_datetime("2026-11-25T10:00:00.5") == 1_795_600_800_500
    assert parse_datetime("2026-11-25T10:00:00") == 1_795_600_800_000
    assert parse_datetime("2026-11-25T10:00:00.000Z") == 1_795_600_800_000
    assert parse_datetime("2026-11-25T12:00:00.000+02:00") == 1_795_600_800_000
    assert parse_datetime("2026-11-25T09:30:00.000-0030") == 1_795_600_800_000
    for bad in (
        "2026-11-25",
        "2026-11-25 10:00:00",
        "2026-13-01T00:00:00",
        "yesterday",
        "2026-11-25T10:00:00+25:00",
        "2026-02-30T00:00:00.000",
    ):
        with pytest.raises(ConfigurationError, match="cannot parse datetime"):
            parse_datetime(bad)


def test_parse_duration_as_java_duration_parse() -> None:
    assert parse_duration("PT1H") == 3_600_000
    assert parse_duration("pt30m") == 1_800_000
    assert parse_duration("P1D") == 86_400_000
    assert parse_duration("P1DT2H3M4.5S") == 93_784_500
    assert parse_duration("PT0.0015S") == 1
    assert parse_duration("-PT1M") == -60_000
    assert parse_duration("PT-1M30S") == -30_000
    assert parse_duration("PT-0.5S") == -500
    for bad in ("", "P", "PT", "1H", "PT1", "P1H", "PT1H1D", "P1Y", "PT1.S5", "PTH"):
        with pytest.raises(ConfigurationError, match="cannot parse duration"):
            parse_duration(bad)
    with pytest.raises(ConfigurationError, match="negative"):
        OffsetSpec.ago("-PT1H")


@given(
    days=st.integers(0, 10_000),
    hours=st.integers(0, 100),
    minutes=st.integers(0, 1000),
    millis=st.integers(0, 10**6),
    parts=st.sets(st.sampled_from("DHMS"), min_size=1),
)
def test_parse_duration_round_trips_timedelta(
    days: int, hours: int, minutes: int, millis: int, parts: set[str]
) -> None:
    values = {"D": days, "H": hours, "M": minutes}
    text = "P" + (f"{days}D" if "D" in parts else "")
    time_part = "".join(f"{values[p]}{p}" for p in "HM" if p in parts)
    if "S" in parts:
        time_part += f"{millis // 1000}.{millis % 1000:03d}S"
    text += f"T{time_part}" if time_part else ""
    expected = dt.timedelta(
        days=days if "D" in parts else 0,
        hours=hours if "H" in parts else 0,
        minutes=minutes if "M" in parts else 0,
        milliseconds=millis if "S" in parts else 0,
    )
    assert parse_duration(text) == expected // dt.timedelta(milliseconds=1)


@given(st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(9999, 1, 1)))
def test_parse_datetime_round_trips_utc_datetimes(when: dt.datetime) -> None:
    millis = when.microsecond // 1000
    text = f"{when:%Y-%m-%dT%H:%M:%S}.{millis:03d}"
    expected = calendar.timegm(when.timetuple()) * 1000 + millis
    assert parse_datetime(text) == expected
    assert parse_datetime(text + "Z") == parse_datetime(text + "+00:00") == expected


def test_admin_messages_round_trip_on_the_wire() -> None:
    messages: list[protocol.Message] = [
        protocol.AlterShareGroupOffsetsRequest(
            group="g",
            admin_id="a",
            request_id=1,
            reply_partition=3,
            offsets=[("t", 0, 5)],
            deadline_ms=9,
        ),
        protocol.DeleteShareGroupOffsetsRequest(
            group="g", admin_id="a", request_id=2, reply_partition=3, topics=["t"]
        ),
        protocol.DeleteShareGroupRequest(group="g", admin_id="a", request_id=3, reply_partition=3),
        protocol.AdminResponse("a", 1, results=[("t", 0, "NONE", "", 5)]),
        protocol.ResetSharePartition(
            group="g", topic="t", partition=0, admin_id="a", request_id=1, start_offset=None
        ),
        protocol.ResetSharePartitionResult(
            group="g", topic="t", partition=0, admin_id="a", request_id=1, start_offset=5
        ),
    ]
    for message in messages:
        assert protocol.decode(protocol.encode(message)) == message
        assert protocol.decode_binary(protocol.encode_binary(message)) == message


@given(
    ops=st.lists(
        st.tuples(st.integers(1, 5), st.sampled_from(["accept", "release", "reject"])), max_size=12
    ),
    target=st.integers(0, 80),
    snapshot_every=st.integers(0, 3),
)
def test_a_reset_survives_a_takeover_whatever_came_before(
    ops: list[tuple[int, str]], target: int, snapshot_every: int
) -> None:
    """Whatever records were delivered and acknowledged, a reset persisted through the durable
    state is what a new leader restores: SPSO = SPEO = target, nothing in flight."""
    from queueflow.engine.partition import AcknowledgementBatch, SharePartitionConfig
    from queueflow.structs import AcknowledgeType

    config = SharePartitionConfig(max_in_flight_records=1000, delivery_count_limit=3)
    table: dict[bytes, bytes] = {}
    durable = DurableSharePartition.create(table, "g", TOPIC, 0, config, snapshot_every, 0)
    kinds = {
        "accept": AcknowledgeType.ACCEPT,
        "release": AcknowledgeType.RELEASE,
        "reject": AcknowledgeType.REJECT,
    }
    for count, outcome in ops:
        for a in durable.engine.acquire("m", count, 50, 0):
            n = a.last_offset - a.first_offset + 1
            batch = AcknowledgementBatch(a.first_offset, a.last_offset, (kinds[outcome],) * n)
            durable.engine.acknowledge("m", [batch], 0)
        durable.persist()
    durable.engine.reset_start_offset(target)
    durable.persist()
    restored = DurableSharePartition.load(dict(table), "g", TOPIC, 0, config, snapshot_every)
    assert restored is not None
    engine = restored.engine
    assert (engine.start_offset, engine.end_offset, engine.in_flight_count) == (target, target, 0)
    got = engine.acquire("m2", 100, target + 3, 0)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in got] == [
        (target, target + 2, 1)
    ]


def test_a_revoked_coordinator_partition_forgets_its_pending_requests() -> None:
    async def scenario() -> None:
        async with cluster_with(2) as cluster:
            await finish(cluster)
            cluster.bus.handlers[topics.request_topic(cluster.app_id, TOPIC)] = _ignore
            request = protocol.DeleteShareGroupRequest(
                group="g",
                admin_id="a",
                request_id=1,
                reply_partition=0,
                deadline_ms=cluster.clock.now_ms() + 10_000,
            )
            await cluster.coordinator.handle(0, 100, protocol.encode(request))
            assert "g" in cluster.coordinator.pending
            cluster.coordinator.revoke({topics.coordinator_partition("g", 1)})
            assert cluster.coordinator.pending == {}

    run(scenario())
