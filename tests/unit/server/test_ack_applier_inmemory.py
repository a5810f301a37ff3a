"""The leader side of ``queueflow.processing.guarantee=exactly_once`` in memory: committed
acknowledgements read from the ack topic are applied once (their position persisted), and lock
expiries and releases by member wait for the lock clock (docs/architecture.md "Exactly-once:
transactional acknowledgements"). On the real broker: tests/integration/
test_exactly_once_leader.py."""

from __future__ import annotations

from typing import Any

from inprocess_helpers import TOPIC, RawMember, cluster_with, events, run
from structlog.testing import capture_logs

from queueflow.engine import RecordState
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.state_codec import ack_position_key, decode_request_position
from queueflow.server.leader.ack_clock import AckClock
from queueflow.server.leader.acks import AckApplier, check_ack, without_offsets
from queueflow.structs import AcknowledgeType
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

ACCEPT = int(AcknowledgeType.ACCEPT)
LOCK_MS = 30_000


def eos_cluster(records: int = 3) -> tuple[InProcessCluster, FakeClock]:
    clock = FakeClock()
    return cluster_with(records, clock=clock, processing_guarantee="exactly_once"), clock


def lock_clock(cluster: InProcessCluster) -> AckClock:
    """The lock clock an ack reader would attach, its reader not caught up yet."""
    clock = AckClock()
    clock.reset(0)
    cluster.leaders[TOPIC].fetcher.lock_clock = clock
    return clock


def ack(member: RawMember, first: int, last: int, kind: int = ACCEPT) -> bytes:
    """The ShareAcknowledge a member commits to the ack topic (envelope: none in memory)."""
    return protocol.encode(member.fetch_request(0, 0, acks=[(first, last, (kind,))]))


def engine(cluster: InProcessCluster) -> Any:
    return cluster.share_partition("g", TOPIC, 0)


def test_locks_elapse_only_as_of_the_lock_clock() -> None:
    async def scenario() -> None:
        cluster, clock = eos_cluster()
        async with cluster:
            safe = lock_clock(cluster)
            member = RawMember(cluster, "m1")
            assert (await member.fetch(0, 3)).acquired == [(0, 2, 1)]
            clock.advance(LOCK_MS + 1)
            await cluster.tick()
            assert engine(cluster).acquired_count == 3  # the reader has not caught up once
            other = RawMember(cluster, "m2")
            assert (await other.fetch(0, 3)).acquired == []
            safe.sampled(0, clock.now_ms() - 2, 0)  # caught up, but as of before the deadline
            safe.advanced(0, 0)
            await cluster.tick()
            assert engine(cluster).acquired_count == 3
            safe.sampled(0, clock.now_ms(), 0)
            safe.advanced(0, 0)
            await cluster.tick()
            assert engine(cluster).available_count == 3
            assert (await other.fetch(0, 3)).acquired == [(0, 2, 2)]

    run(scenario())


def test_a_committed_acknowledgement_is_applied_once_and_its_position_persisted() -> None:
    async def scenario() -> None:
        cluster, _clock = eos_cluster()
        async with cluster:
            lock_clock(cluster)
            leader = cluster.leaders[TOPIC]
            member = RawMember(cluster, "m1")
            await member.fetch(0, 3)
            applier = AckApplier(leader)
            with capture_logs() as logs:
                await applier.apply(0, 5, ack(member, 0, 2))
                assert engine(cluster).start_offset == 3  # all three Acknowledged
                raw = cluster.tables[TOPIC][ack_position_key(0)]
                assert decode_request_position(raw, where="test") == 5
                await applier.apply(0, 5, ack(member, 0, 2))  # read again: skipped
                successor = AckApplier(leader)  # a new leader reads the position back
                await successor.apply(0, 4, ack(member, 0, 2))
                await successor.apply(0, 5, ack(member, 0, 2))
            assert not events(logs, "transactional_ack_refused"), logs
            assert member.replies[-1].acquired  # no answer was sent for the acknowledgement
            metric = cluster.metrics.transactional_acks.labels(TOPIC)._value.get()
            assert metric == 1

    run(scenario())


def test_a_removed_member_keeps_its_records_until_their_locks_and_may_still_acknowledge() -> None:
    async def scenario() -> None:
        cluster, clock = eos_cluster()
        async with cluster:
            safe = lock_clock(cluster)
            safe.sampled(0, clock.now_ms(), 0)
            safe.advanced(0, 0)
            member = RawMember(cluster, "m1")
            await member.fetch(0, 3)
            release = protocol.ReleaseMember(
                group="g", topic=TOPIC, partition=0, member_id="m1", member_epoch=5
            )
            request_topic = topics.request_topic(cluster.app_id, TOPIC)
            clock.advance(10)
            await cluster.bus.send(request_topic, 0, protocol.encode(release))
            await cluster.bus.drain()
            sp = engine(cluster)
            deadline = sp.record(0).lock_deadline_ms
            assert sp.acquired_count == 3  # still held until their own lock deadlines
            # Its acknowledgement, committed before or after the removal, arrives after it.
            await AckApplier(cluster.leaders[TOPIC]).apply(0, 0, ack(member, 0, 1))
            assert sp.start_offset == 2  # 0 and 1 Acknowledged
            assert sp.record(2).state is RecordState.ACQUIRED
            clock.advance(LOCK_MS)  # past the lock deadline, but the lock clock is not
            await cluster.tick()
            assert sp.record(2).state is RecordState.ACQUIRED
            assert deadline is not None and clock.now_ms() >= deadline
            safe.sampled(0, clock.now_ms(), 1)
            safe.advanced(0, 1)
            await cluster.tick()
            assert sp.record(2).state is RecordState.AVAILABLE

    run(scenario())


def test_junk_and_other_messages_on_the_ack_topic_are_skipped_and_logged() -> None:
    async def scenario() -> None:
        cluster, _clock = eos_cluster()
        async with cluster:
            lock_clock(cluster)
            member = RawMember(cluster, "m1")
            await member.fetch(0, 1)
            applier = AckApplier(cluster.leaders[TOPIC])
            fetch = protocol.encode(member.fetch_request(0, 1))
            with capture_logs() as logs:
                await applier.apply(0, 0, b"\x00")
                await applier.apply(0, 1, fetch)
            assert events(logs, "control_message_dropped")
            assert events(logs, "undecodable_transactional_ack")
            assert engine(cluster).acquired_count == 1
            raw = cluster.tables[TOPIC][ack_position_key(0)]
            assert decode_request_position(raw, where="test") == 1

    run(scenario())


def test_check_ack_names_what_is_wrong() -> None:
    request = protocol.ShareFetchRequest(
        group="g",
        topic=TOPIC,
        partition=0,
        member_id="m",
        request_id=1,
        reply_partition=0,
        max_records=0,
        acks=[(0, 0, (ACCEPT,))],
    )
    assert check_ack(request, TOPIC, 0) is None
    assert "on ack partition 1" in (check_ack(request, TOPIC, 1) or "")
    assert "acquires" in (
        check_ack(
            protocol.ShareFetchRequest(
                **{**{f: getattr(request, f) for f in request.__struct_fields__}, "max_records": 1}
            ),
            TOPIC,
            0,
        )
        or ""
    )
    assert "not a ShareAcknowledge" in (check_ack(protocol.Tick(sent_ms=1), TOPIC, 0) or "")


def test_a_committed_acknowledgement_with_a_stale_offset_applies_the_others() -> None:
    """A transaction's results are published once it commits: one offset the member can no
    longer acknowledge (here acknowledged already by an earlier transaction) must not take the
    others down with it, as it would in a request (all or nothing): they are applied and the
    stale one is logged."""

    async def scenario() -> None:
        cluster, _clock = eos_cluster(4)
        async with cluster:
            lock_clock(cluster)
            member = RawMember(cluster, "m1")
            await member.fetch(0, 4)
            applier = AckApplier(leader := cluster.leaders[TOPIC])
            assert leader is not None
            with capture_logs() as logs:
                await applier.apply(0, 0, ack(member, 1, 1))  # offset 1 Acknowledged
                await applier.apply(0, 1, ack(member, 0, 3))  # 1 is stale now
            assert engine(cluster).start_offset == 4  # 0, 2 and 3 Acknowledged too
            [refused] = events(logs, "transactional_ack_refused")
            assert "(1, 1)" in refused["error"], refused

    run(scenario())


def test_without_offsets_keeps_the_others_in_ranges_of_one_type() -> None:
    acks = [(0, 3, (1,)), (5, 6, (1, 3))]
    assert without_offsets(acks, [(1, 1), (6, 6)]) == [(0, 0, (1,)), (2, 3, (1,)), (5, 5, (1,))]
    assert without_offsets(acks, []) == [(0, 3, (1,)), (5, 5, (1,)), (6, 6, (3,))]
    assert without_offsets(acks, [(0, 9)]) == []
