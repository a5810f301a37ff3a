"""The share-group coordinator and the share-partition leaders through ``InProcessCluster``:
the real server code on in-memory topics and tables, driven by hand-written wire requests
(a :class:`RawMember` has no heartbeat loop, so it stays silent unless the test speaks for it)
and a :class:`~queueflow.testing.FakeClock`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest
from inprocess_helpers import TOPIC, RawMember, cluster_with, events, eventually, run, settle
from structlog.testing import capture_logs

from queueflow.engine.partition import RecordState
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.server.coordinator import ShareGroupCoordinator
from queueflow.server.durable import snapshot_key
from queueflow.server.leader import ShareLeader
from queueflow.structs import AcknowledgeType
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

ACCEPT, RELEASE = int(AcknowledgeType.ACCEPT), int(AcknowledgeType.RELEASE)


def states(cluster: InProcessCluster, offsets: Iterable[int], group: str = "g") -> list[Any]:
    engine = cluster.share_partition(group, TOPIC, 0)
    return [(engine.record(o).state, engine.record(o).delivery_count) for o in offsets]


# -- coordinator ---------------------------------------------------------------------------


def test_join_gives_a_member_epoch_and_the_partitions_are_divided() -> None:
    """KIP-932 ShareGroupHeartbeat: epoch 0 joins; every membership change bumps the group
    epoch, and the members learn their share of the partitions on their next heartbeat."""

    async def scenario() -> tuple[Any, ...]:
        async with cluster_with(0, partitions=2) as cluster:
            a, b = RawMember(cluster, "m-a"), RawMember(cluster, "m-b")
            joined_a = await a.heartbeat(0)
            joined_b = await b.heartbeat(0)
            again_a = await a.heartbeat(joined_a.member_epoch)
            return joined_a, joined_b, again_a

    with capture_logs() as logs:
        joined_a, joined_b, again_a = run(scenario())
    assert joined_a.error == "NONE" and joined_a.member_epoch == 1
    assert joined_a.assignment == {TOPIC: [0, 1]}
    assert joined_a.heartbeat_interval_ms == 200
    assert joined_b.error == "NONE" and joined_b.member_epoch == 2
    assert again_a.member_epoch == 2
    parts_a, parts_b = set(again_a.assignment[TOPIC]), set(joined_b.assignment[TOPIC])
    assert parts_a | parts_b == {0, 1} and not parts_a & parts_b
    epochs = events(logs, "share_group_epoch")
    assert [(e["group_epoch"], e["members"]) for e in epochs] == [(1, 1), (2, 2)]


def test_a_heartbeat_from_an_unknown_member_is_told_to_rejoin() -> None:
    """A heartbeat with epoch > 0 from a member the group doesn't know (never joined, or timed
    out) is answered UNKNOWN_MEMBER_ID and changes nothing; it must rejoin with epoch 0."""

    async def scenario() -> tuple[Any, Any, int]:
        async with cluster_with(0) as cluster:
            member = RawMember(cluster, "m-ghost")
            refused = await member.heartbeat(3)
            group_epoch = cluster.coordinator.groups["g"].group_epoch
            rejoined = await member.heartbeat(0)
            return refused, rejoined, group_epoch

    refused, rejoined, group_epoch_after_refusal = run(scenario())
    assert refused.error == ErrorCode.UNKNOWN_MEMBER_ID.value
    assert "rejoin with member epoch 0" in refused.error_message
    assert refused.assignment == {}
    assert group_epoch_after_refusal == 0
    assert rejoined.error == "NONE" and rejoined.member_epoch == 1


def test_a_known_member_with_a_stale_epoch_is_not_fenced() -> None:
    """Pins a documented gap (docs/index.md "Member checks"): FENCED_MEMBER_EPOCH is never
    returned, a known member heartbeating with an old epoch gets the current one back."""

    async def scenario() -> Any:
        async with cluster_with(0, partitions=2) as cluster:
            a, b = RawMember(cluster, "m-a"), RawMember(cluster, "m-b")
            await a.heartbeat(0)
            await b.heartbeat(0)  # group epoch 2
            return await a.heartbeat(1)

    stale = run(scenario())
    assert stale.error == "NONE" and stale.member_epoch == 2


def test_a_member_the_coordinator_dropped_rejoins_on_its_next_heartbeat() -> None:
    """Membership: a heartbeat answered UNKNOWN_MEMBER_ID (the coordinator removed the member)
    makes the member rejoin with epoch 0 at once (``member_rejoining``) and get its share
    of the partitions back."""

    async def scenario(logs: list[dict[str, Any]]) -> None:
        async with cluster_with(2) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            assert consumer.assignment() == {(TOPIC, 0)}
            member_id = consumer.member_id
            assert member_id is not None
            # A leave on the member's behalf: the coordinator forgets it (its answer goes to
            # the member, which ignores a reply to a request it didn't send).
            ghost = RawMember(cluster, "unused")
            ghost.member_id = member_id
            ghost._request_id = 1_000_000  # no request of the member's has this id
            leave = ghost.heartbeat_request(-1)
            await cluster.bus.send(
                topics.coordinator_topic(cluster.app_id), 0, protocol.encode(leave)
            )
            await cluster.bus.drain()
            group = cluster.coordinator.groups["g"]
            assert member_id not in group.members
            await eventually(lambda: bool(events(logs, "member_rejoining")), "a rejoin")
            await eventually(lambda: member_id in group.members, "the member back in the group")
            assert consumer.assignment() == {(TOPIC, 0)}
            assert len(await consumer.poll(timeout_ms=0)) == 2
            await consumer.close()

    with capture_logs() as logs:
        run(scenario(logs))
    rejoining = events(logs, "member_rejoining")
    assert len(rejoining) == 1 and "rejoin with member epoch 0" in rejoining[0]["reason"]


def test_a_silent_member_expires_and_its_records_are_released() -> None:
    """KIP-932 "Share group membership": a member silent for longer than
    group.share.session.timeout.ms is removed on a tick, the leaders release the records it
    held (Available again, delivery count kept), and its next heartbeat is refused."""
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(3, clock=clock, session_timeout_ms=1000) as cluster:
            silent, live = RawMember(cluster, "m-silent"), RawMember(cluster, "m-live")
            await silent.heartbeat(0)
            assert (await silent.fetch(0, 10)).acquired == [(0, 2, 1)]
            epoch = (await live.heartbeat(0)).member_epoch
            group = cluster.coordinator.groups["g"]
            for step in range(3):  # ticks 400 ms apart, the live member heartbeating between
                clock.advance(400)
                epoch = (await live.heartbeat(epoch)).member_epoch
                await cluster.tick()
                await settle(cluster)
                if step < 2:  # 800 ms of silence: still a member
                    assert set(group.members) == {"m-silent", "m-live"}
            assert set(group.members) == {"m-live"}
            assert states(cluster, range(3)) == [(RecordState.AVAILABLE, 1)] * 3
            assert cluster.share_partition("g", TOPIC, 0).acquired_count == 0
            assert (await silent.heartbeat(epoch)).error == ErrorCode.UNKNOWN_MEMBER_ID.value
            assert (await live.fetch(0, 10)).acquired == [(0, 2, 2)]

    with capture_logs() as logs:
        run(scenario())
    expired = events(logs, "member_session_expired")
    assert [(e["member_id"], e["session_timeout_ms"]) for e in expired] == [("m-silent", 1000)]
    released = events(logs, "member_records_released")
    assert [(e["member_id"], e["records"], e["reason"]) for e in released] == [
        ("m-silent", 3, "session timeout")
    ]


def test_a_clock_jump_without_coordinator_events_gives_every_member_a_fresh_session() -> None:
    """Pins the coordinator's outage rule: more than two heartbeat intervals without any
    coordinator event means members could not heartbeat either, so that time does not count
    against their sessions (a FakeClock jumped past the session timeout expires nobody)."""
    clock = FakeClock()

    async def scenario() -> set[str]:
        async with cluster_with(0, clock=clock, session_timeout_ms=1000) as cluster:
            await RawMember(cluster, "m-silent").heartbeat(0)
            clock.advance(5000)
            await cluster.tick()
            return set(cluster.coordinator.groups["g"].members)

    with capture_logs() as logs:
        members = run(scenario())
    assert members == {"m-silent"}
    assert not events(logs, "member_session_expired")


def test_a_silent_member_expires_when_ticks_come_at_the_lock_check_interval() -> None:
    """Valid settings (heartbeat 100 ms, lock check 250 ms, session 1000 ms): ticks every
    250 ms for 2 s must expire a member silent all along."""
    clock = FakeClock()
    config = {"heartbeat_interval_ms": 100, "session_timeout_ms": 1000}

    async def scenario() -> set[str]:
        async with cluster_with(0, clock=clock, **config) as cluster:
            interval = cluster.settings.lock_check_interval_ms
            assert interval == 250
            await RawMember(cluster, "m-silent").heartbeat(0)
            for _ in range(8):
                clock.advance(interval)
                await cluster.tick()
            return set(cluster.coordinator.groups["g"].members)

    assert run(scenario()) == set()


def test_tick_waits_for_the_records_a_session_expiry_releases() -> None:
    """The ticker's order forced to fetch partition first, then the coordinator: after the
    drain, the expired member's records must be Available."""
    clock = FakeClock()

    async def scenario() -> int:
        async with cluster_with(3, clock=clock, session_timeout_ms=1000) as cluster:
            silent = RawMember(cluster, "m-silent")
            await silent.heartbeat(0)
            await silent.fetch(0, 10)
            tick = protocol.encode(protocol.Tick(sent_ms=clock.now_ms()))
            for _ in range(3):
                clock.advance(400)
                await cluster.bus.send(topics.request_topic(cluster.app_id, TOPIC), 0, tick)
                await cluster.bus.send(topics.coordinator_topic(cluster.app_id), 0, tick)
                await cluster.bus.drain()
            assert not cluster.coordinator.groups["g"].members  # the member did expire
            return int(cluster.share_partition("g", TOPIC, 0).acquired_count)

    assert run(scenario()) == 0


def test_a_group_at_its_max_size_refuses_another_member() -> None:
    """group.share.max.size: a join beyond it is refused with GROUP_MAX_SIZE_REACHED, which
    the joining consumer raises; the members already in the group are not disturbed."""

    async def scenario() -> None:
        async with cluster_with(0, partitions=2, max_size=1) as cluster:
            first = cluster.consumer("g")
            await first.subscribe([TOPIC])
            # It counts toward the limit once it follows its join up (not provisional).
            joined = cluster.coordinator.groups["g"].members[first.member_id]
            await eventually(lambda: not joined.provisional, "the member's follow-up heartbeat")
            second = cluster.consumer("g")
            with pytest.raises(ShareGroupError) as refused:
                await second.subscribe([TOPIC])
            assert refused.value.code is ErrorCode.GROUP_MAX_SIZE_REACHED
            assert "group.share.max.size" in refused.value.message
            group = cluster.coordinator.groups["g"]
            assert list(group.members) == [first.member_id]
            assert first.assignment() == {(TOPIC, 0), (TOPIC, 1)}
            other = RawMember(cluster, "m-other", group="h")  # another group is not affected
            assert (await other.heartbeat(0)).error == "NONE"
            await first.close()

    run(scenario())


def test_group_metadata_is_persisted_and_a_new_coordinator_restores_it() -> None:
    """Group metadata lives in the ``share-groups`` table; a new coordinator on the same table
    loads the group on its first heartbeat: members, epochs and assignment carry on."""

    async def scenario() -> None:
        async with cluster_with(0, partitions=2) as cluster:
            a, b = RawMember(cluster, "m-a"), RawMember(cluster, "m-b")
            await a.heartbeat(0)
            await b.heartbeat(0)
            before = await a.heartbeat(2)
            assert set(cluster.tables["groups"]) == {b"g"}
            fresh = ShareGroupCoordinator(cluster.server, cluster.tables["groups"])
            fresh.assign({0}, cluster.server.runtime.generation)
            assert fresh.groups == {}
            # Straight to the new coordinator (the bus still feeds the old one).
            after = await a.heartbeat(2, handler=fresh.handle, offset=100)
            assert (after.error, after.member_epoch, after.assignment) == (
                "NONE",
                2,
                before.assignment,
            )
            group = fresh.groups["g"]
            assert group.group_epoch == 2 and set(group.members) == {"m-a", "m-b"}
            ghost = RawMember(cluster, "m-ghost")
            refused = await ghost.heartbeat(2, handler=fresh.handle, offset=101)
            assert refused.error == ErrorCode.UNKNOWN_MEMBER_ID.value

    run(scenario())


def test_garbage_on_the_coordinator_topic_is_logged_and_skipped() -> None:
    """A record of the coordinator topic that is not a queueflow message is logged as
    ``undecodable_coordinator_request`` and skipped; the coordinator keeps serving."""

    async def scenario() -> Any:
        async with cluster_with(0) as cluster:
            coordinator_topic = topics.coordinator_topic(cluster.app_id)
            await cluster.bus.send(coordinator_topic, 0, b"\x00not json")
            await cluster.bus.send(coordinator_topic, 0, b'{"kind": "martian"}')
            await cluster.bus.drain()
            return await RawMember(cluster, "m").heartbeat(0)

    with capture_logs() as logs:
        joined = run(scenario())
    assert joined.error == "NONE" and joined.member_epoch == 1
    # Not JSON: dropped by its first byte; JSON of an unknown kind: refused by the decoder.
    dropped = events(logs, "control_message_dropped")
    assert [e["reason"] for e in dropped] == ["unknown_format"]
    undecodable = events(logs, "undecodable_coordinator_request")
    assert len(undecodable) == 1
    assert all("undecodable queueflow control message" in e["error"] for e in undecodable)
    assert not events(logs, "coordinator_request_failed")


# -- leader --------------------------------------------------------------------------------


def test_an_expired_lock_makes_the_records_available_with_their_delivery_count() -> None:
    """KIP-932 "Acquisition lock": when the lock elapses (on the next tick) Acquired records
    go back to Available, keeping their delivery count; the next acquisition counts 2."""
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(3, clock=clock) as cluster:
            a, b = RawMember(cluster, "m-a"), RawMember(cluster, "m-b")
            assert (await a.fetch(0, 10)).acquired == [(0, 2, 1)]
            clock.advance(cluster.settings.record_lock_duration_ms - 1)
            await cluster.tick()
            assert states(cluster, range(3)) == [(RecordState.ACQUIRED, 1)] * 3
            clock.advance(1)
            assert states(cluster, range(3)) == [(RecordState.ACQUIRED, 1)] * 3  # until a tick
            await cluster.tick()
            assert states(cluster, range(3)) == [(RecordState.AVAILABLE, 1)] * 3
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.record(0).member_id is None and engine.acquired_count == 0
            assert (await b.fetch(0, 10)).acquired == [(0, 2, 2)]
            late = await a.fetch(0, 0, acks=[(0, 2, (ACCEPT,))])
            assert late.ack_error == ErrorCode.INVALID_RECORD_STATE.value

    run(scenario())


def test_a_record_released_up_to_the_delivery_count_limit_is_archived() -> None:
    """group.share.delivery.count.limit: a record RELEASEd on its last allowed delivery is
    Archived, never delivered again, and the SPSO moves past it."""

    async def scenario() -> None:
        async with cluster_with(2, delivery_count_limit=2) as cluster:
            m = RawMember(cluster, "m")
            assert (await m.fetch(0, 1)).acquired == [(0, 0, 1)]
            assert (await m.fetch(0, 0, acks=[(0, 0, (RELEASE,))])).ack_error == "NONE"
            assert states(cluster, [0]) == [(RecordState.AVAILABLE, 1)]
            assert (await m.fetch(0, 1)).acquired == [(0, 0, 2)]
            assert (await m.fetch(0, 0, acks=[(0, 0, (RELEASE,))])).ack_error == "NONE"
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.start_offset == 1  # 0 Archived: the SPSO moved past it
            assert (await m.fetch(0, 10)).acquired == [(1, 1, 1)]
            assert (await m.fetch(0, 10, acks=[(1, 1, (ACCEPT,))])).acquired == []
            assert engine.start_offset == 2 and engine.in_flight_count == 0

    run(scenario())


def test_garbage_on_a_request_topic_is_logged_and_skipped() -> None:
    """A request record that is not a queueflow message is logged as ``undecodable_request``
    (naming the partition) and skipped; the leader keeps serving that partition."""

    async def scenario() -> Any:
        async with cluster_with(2) as cluster:
            request_topic = topics.request_topic(cluster.app_id, TOPIC)
            await cluster.bus.send(request_topic, 0, b"garbage")
            await cluster.bus.send(request_topic, 0, b'{"kind": "fetch", "group": 7}')
            await cluster.bus.drain()
            return await RawMember(cluster, "m").fetch(0, 10)

    with capture_logs() as logs:
        response = run(scenario())
    assert response.error == "NONE" and response.acquired == [(0, 1, 1)]
    dropped = events(logs, "control_message_dropped")
    assert [(e["partition"], e["reason"]) for e in dropped] == [(0, "unknown_format")]
    undecodable = events(logs, "undecodable_request")
    assert [e["partition"] for e in undecodable] == [0]
    assert "$.group" in undecodable[0]["error"]
    assert not events(logs, "leader_request_failed")


def test_a_request_already_handled_is_ignored() -> None:
    """A request record at an offset the leader has handled (Faust redelivers from its
    committed offset) is ignored: an old RELEASE must not release the record acquired since.
    The same bytes at a new offset are a new request and are applied."""

    async def scenario() -> None:
        async with cluster_with(3) as cluster:
            leader = cluster.leaders[TOPIC]
            request_topic = topics.request_topic(cluster.app_id, TOPIC)
            m = RawMember(cluster, "m")
            await m.fetch(0, 10)
            await m.fetch(0, 0, acks=[(0, 0, (RELEASE,))])
            sent = [value for t, p, value in cluster.bus.sent if (t, p) == (request_topic, 0)]
            release_offset, release = len(sent) - 1, sent[-1]
            assert protocol.decode(release).acks == [(0, 0, (RELEASE,))]
            assert (await m.fetch(0, 1)).acquired == [(0, 0, 2)]
            table_before = dict(cluster.tables[TOPIC])
            await leader.handle(0, release_offset, release)  # redelivered: ignored
            assert states(cluster, [0]) == [(RecordState.ACQUIRED, 2)]
            assert cluster.tables[TOPIC] == table_before
            await cluster.bus.send(request_topic, 0, release)  # the same bytes, a new offset
            await cluster.bus.drain()
            assert states(cluster, [0]) == [(RecordState.AVAILABLE, 2)]

    run(scenario())


def test_corrupt_state_refuses_that_share_partition_only() -> None:
    """A share-partition whose durable state can't be decoded is refused with CORRUPT_STATE
    (``share_partition_refused``, logged once) and its state is left as found for the
    operator; another group's share-partition on the same partition is served."""

    async def scenario() -> None:
        async with cluster_with(3) as cluster:
            table = cluster.tables[TOPIC]
            table[snapshot_key("g", 0)] = b"\x00garbage"
            broken, healthy = RawMember(cluster, "m-g", "g"), RawMember(cluster, "m-h", "h")
            for _ in range(2):
                refused = await broken.fetch(0, 10)
                assert refused.error == ErrorCode.CORRUPT_STATE.value
                assert "group=g topic=jobs partition=0" in refused.error_message
                assert refused.acquired == []
            assert table[snapshot_key("g", 0)] == b"\x00garbage"
            assert cluster.share_partition("g", TOPIC, 0) is None
            served = await healthy.fetch(0, 10)
            assert served.error == "NONE" and served.acquired == [(0, 2, 1)]

    with capture_logs() as logs:
        run(scenario())
    refused = events(logs, "share_partition_refused")
    assert [(e["group"], e["partition"]) for e in refused] == [("g", 0)]
    assert [e["group"] for e in events(logs, "share_partition_initialised")] == ["h"]


def test_a_new_leader_skips_the_requests_its_predecessor_applied() -> None:
    """The offset of the last request a leader applied is persisted with the state (issue #13):
    Faust resumes a new leader's request partition from its lagging committed offset, and a
    RELEASE its predecessor applied, handled again, would release the records its member has
    acquired since (a duplicate delivery). The new leader skips it."""

    async def scenario() -> None:
        async with cluster_with(5) as cluster:
            leader = cluster.leaders[TOPIC]
            request_topic = topics.request_topic(cluster.app_id, TOPIC)
            m = RawMember(cluster, "m")
            first = await m.fetch(0, 10, handler=leader.handle, offset=200)
            assert first.acquired == [(0, 4, 1)]
            release = m.fetch_request(0, 0, acks=[(0, 4, (RELEASE,))])
            await m.call(request_topic, 0, release, handler=leader.handle, offset=201)
            again = await m.fetch(0, 10, handler=leader.handle, offset=202)
            assert again.acquired == [(0, 4, 2)]
            leader.revoke({0})  # failover: the partition moves away
            fresh = ShareLeader(cluster.server, TOPIC, cluster.tables[TOPIC])
            fresh.assign({0}, 2)
            await fresh.send_fences()
            fence = cluster.bus.sent[-1][2]
            # Read in log order from Faust's committed offset: the old RELEASE comes round
            # again before the new leader's fence. Skipped: m keeps its second delivery.
            await fresh.handle(0, 201, protocol.encode(release))
            await fresh.handle(0, 300, fence)
            assert fresh.fencing.is_live(0)
            other = RawMember(cluster, "m-other")
            response = await other.fetch(0, 10, handler=fresh.handle, offset=301)
            assert response.error == "NONE" and response.acquired == []
            engine = fresh.partitions[("g", 0)].engine
            assert [engine.record(o).state for o in range(5)] == [RecordState.ACQUIRED] * 5
            assert (engine.record(0).member_id, engine.record(0).delivery_count) == ("m", 2)

    run(scenario())


class _RequestLog:
    """A request log the test fills: what the host wrote but never delivered."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.asked: list[tuple[str, int, int, int]] = []

    async def read(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, bytes]]:
        self.asked.append((topic, partition, start, end))
        return [(o, v) for o, v in sorted(self.records.items()) if start <= o < end]


def test_a_new_leader_reads_back_the_requests_its_host_skipped() -> None:
    """Faust can resume a new leader's request partition past requests nobody applied (a
    rebalance drops what it had fetched, and its commit moves past them; issue #13). The new
    leader reads them back from its predecessor's persisted position on: the member's
    acknowledgements are applied, not lost, and a reply nobody waits for is not sent."""

    async def scenario() -> None:
        async with cluster_with(5) as cluster:
            leader = cluster.leaders[TOPIC]
            request_topic = topics.request_topic(cluster.app_id, TOPIC)
            log = _RequestLog()
            cluster.server.request_log = log
            m = RawMember(cluster, "m")
            first = await m.fetch(0, 10, handler=leader.handle, offset=200)
            assert first.acquired == [(0, 4, 1)]
            # Written at 201, never delivered: the partition moves first.
            accept = m.fetch_request(0, 0, acks=[(0, 4, (ACCEPT,))])
            accept.deadline_ms = 0  # its member stopped waiting: no reply
            log.records[201] = protocol.encode(accept)
            leader.revoke({0})
            fresh = ShareLeader(cluster.server, TOPIC, cluster.tables[TOPIC])
            fresh.assign({0}, 2)
            await fresh.send_fences()
            replies = len(cluster.bus.sent)
            fence = cluster.bus.sent[-1][2]
            await fresh.handle(0, 202, fence)  # Faust resumes past 201
            assert log.asked == [(request_topic, 0, 201, 202)]
            assert fresh.fencing.is_live(0)
            engine = fresh.partitions[("g", 0)].engine
            assert engine.start_offset == 5  # the ACCEPT applied
            assert len(cluster.bus.sent) == replies
            # Delivered in order from here: nothing is read back again.
            await m.fetch(0, 10, handler=fresh.handle, offset=203)
            assert len(log.asked) == 1

    with capture_logs() as logs:
        run(scenario())
    replayed = events(logs, "skipped_requests_replayed")
    assert [(e["first"], e["last"], e["requests"]) for e in replayed] == [(201, 201, 1)]


def test_a_new_leader_restores_the_state_with_acquired_records_still_locked() -> None:
    """KIP-932 "Managing durable share-partition state": a new leader on the same table
    restores the SPSO and the in-flight records (``share_partition_restored``, next state
    epoch). Records that were Acquired stay Acquired by their member until their lock elapses
    (queueflow persists the locks): nobody else gets them, and the owner's acknowledgements
    of them are applied by the new leader (issue #13: a takeover redelivers nothing)."""

    async def scenario() -> None:
        async with cluster_with(5) as cluster:
            m = RawMember(cluster, "m")
            assert (await m.fetch(0, 10)).acquired == [(0, 4, 1)]
            await m.fetch(0, 0, acks=[(0, 1, (ACCEPT,))])
            cluster.leaders[TOPIC].revoke({0})  # failover: the partition moves away
            fresh = ShareLeader(cluster.server, TOPIC, cluster.tables[TOPIC])
            fresh.assign({0}, 2)
            await fresh.send_fences()
            fence = cluster.bus.sent[-1][2]
            assert isinstance(protocol.decode(fence), protocol.Fence)
            await fresh.handle(0, 100, fence)  # the fence read back: live
            assert fresh.fencing.is_live(0)
            other = RawMember(cluster, "m-other")
            response = await other.fetch(0, 10, handler=fresh.handle, offset=101)
            assert response.error == "NONE" and response.acquired == []  # 2..4 still locked
            engine = fresh.partitions[("g", 0)].engine
            assert engine.start_offset == 2
            assert engine.record(3).member_id == "m"
            kept = await m.fetch(0, 0, acks=[(2, 4, (ACCEPT,))], handler=fresh.handle, offset=102)
            assert kept.ack_error == ErrorCode.NONE.value
            assert engine.start_offset == 5

    with capture_logs() as logs:
        run(scenario())
    initialised = events(logs, "share_partition_initialised")
    restored = events(logs, "share_partition_restored")
    assert len(initialised) == 1 and len(restored) == 1
    assert (restored[0]["start_offset"], restored[0]["end_offset"]) == (2, 5)
    assert restored[0]["state_epoch"] == 1  # the first leader wrote state epoch 0


def test_max_records_bounds_each_acquisition() -> None:
    """KIP-932 ShareFetch ``max_records``: a request acquires at most that many records, and
    the next one continues where it stopped."""

    async def scenario() -> None:
        async with cluster_with(10) as cluster:
            m = RawMember(cluster, "m")
            assert (await m.fetch(0, 3)).acquired == [(0, 2, 1)]
            assert cluster.share_partition("g", TOPIC, 0).acquired_count == 3
            assert (await m.fetch(0, 4)).acquired == [(3, 6, 1)]
            assert (await m.fetch(0, 100)).acquired == [(7, 9, 1)]
            assert (await m.fetch(0, 100)).acquired == []

    run(scenario())


def test_a_request_past_its_deadline_acquires_nothing_but_acknowledges() -> None:
    """ShareFetch ``deadline_ms``: the member stopped waiting, so the leader acquires nothing
    (records locked for nobody would wait for their lock to expire), but the request's
    acknowledgements are still applied."""
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(4, clock=clock) as cluster:
            m = RawMember(cluster, "m")
            assert (await m.fetch(0, 2)).acquired == [(0, 1, 1)]
            late = await m.fetch(0, 10, acks=[(0, 1, (ACCEPT,))], deadline_ms=clock.now_ms())
            assert late.error == "NONE" and late.ack_error == "NONE"
            assert late.acquired == []
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.start_offset == 2 and engine.acquired_count == 0
            assert (await m.fetch(0, 10, deadline_ms=clock.now_ms() + 1)).acquired == [(2, 3, 1)]

    run(scenario())


def test_a_tick_that_expires_locks_counts_its_state_write() -> None:
    """``queueflow_state_writes_total`` counts every delta written, the tick's too (it used to
    count only those of ShareFetch requests and admin resets)."""
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(3, clock=clock) as cluster:
            writes = lambda: cluster.metrics.registry.get_sample_value(  # noqa: E731
                "queueflow_state_writes_total", {"topic": TOPIC}
            )
            assert (await RawMember(cluster, "m").fetch(0, 10)).acquired == [(0, 2, 1)]
            before = writes()
            clock.advance(cluster.settings.record_lock_duration_ms)
            await cluster.tick()
            assert states(cluster, range(3)) == [(RecordState.AVAILABLE, 1)] * 3
            assert writes() == before + 1

    run(scenario())


def test_a_share_partition_initialised_while_its_partition_is_revoked_is_not_written() -> None:
    """A share-partition's first request awaits the broker for its start offset; if the
    partition is revoked meanwhile, the leader neither writes its first snapshot nor acquires
    for the member (it used to do both, for a partition it no longer led)."""

    async def scenario() -> None:
        async with cluster_with(3) as cluster:
            leader = cluster.leaders[TOPIC]
            real = cluster.server.log_offsets
            entered, go_on = asyncio.Event(), asyncio.Event()

            class SlowStart:
                def __getattr__(self, name: str) -> Any:
                    return getattr(real, name)

                async def log_start(self, tp: Any) -> int:
                    entered.set()
                    await go_on.wait()
                    return await real.log_start(tp)

            cluster.server.log_offsets = SlowStart()  # type: ignore[assignment]
            m = RawMember(cluster, "m")
            request = protocol.encode(m.fetch_request(0, 10))
            handling = asyncio.ensure_future(leader.handle(0, 500, request))
            await asyncio.wait_for(entered.wait(), 5)
            leader.revoke({0})  # a Faust rebalance moves the partition away
            go_on.set()
            await asyncio.wait_for(handling, 5)
            assert ("g", 0) not in leader.partitions
            assert snapshot_key("g", 0) not in cluster.tables[TOPIC]
            assert m.replies == []

    with capture_logs() as logs:
        run(scenario())
    assert events(logs, "stale_write_refused")
