"""The coordinator is fenced the way leaders are: coordinator epochs, its fence on the
coordinator topic, its membership lease, and leaders and members refusing what a superseded
coordinator sends. Pure rules first, then the real coordinator, leaders and members in process.

A "zombie" here is the in-process cluster's own coordinator (coordinator epoch 1) after a second
coordinator on the same group table took over at coordinator epoch 2, as a frozen worker and its
successor meet in production.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, RawMember, cluster_with, events, run
from structlog.testing import capture_logs

from queueflow.engine.fencing import CoordinatorEpochs, FenceOutcome, PartitionFencing
from queueflow.errors import ErrorCode
from queueflow.member.membership import Membership
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import verify_ticket
from queueflow.server.coordinator import ShareGroupCoordinator
from queueflow.settings import ShareGroupSettings
from queueflow.testing.inprocess import InProcessCluster

FORGET_MS = 10_000


# -- pure rules ------------------------------------------------------------------------------


def test_the_coordinator_role_is_fenced_by_the_leaders_rules() -> None:
    f = PartitionFencing(11_000, role="coordinator")
    f.assign({0}, epoch=4)
    assert f.on_fence(0, 4) is FenceOutcome.LIVE
    assert f.on_fence(0, 5) is FenceOutcome.SUPERSEDED
    assert f.partitions[0].fenced == (
        "partition 0 was taken over by coordinator epoch 5; this worker owned it under epoch 4"
    )
    assert not f.is_live(0)


def test_an_older_coordinator_epoch_is_refused_and_a_newer_one_raises_the_floor() -> None:
    e = CoordinatorEpochs(FORGET_MS)
    assert e.admit("g", 3, 0) and e.newest("g") == 3
    assert e.admit("g", 3, 1)  # the same coordinator
    assert not e.admit("g", 2, 2)
    assert e.admit("h", 1, 2)  # groups are separate
    assert e.admit("g", 5, 3) and not e.admit("g", 3, 4)
    assert e.admit("g", -1, 5)  # unknown (an older queueflow): admitted, changes nothing
    assert e.newest("g") == 5


def test_an_older_epoch_is_admitted_only_after_the_newest_was_silent_for_the_forget_time() -> None:
    e = CoordinatorEpochs(FORGET_MS)
    e.admit("g", 7, 1_000)
    assert not e.admit("g", 2, 1_000 + FORGET_MS)
    assert e.admit("g", 2, 1_001 + FORGET_MS)  # generations started again (group recreated)
    assert e.newest("g") == 2


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("gh"), st.integers(-1, 20), st.integers(0, 3_000)),
        max_size=60,
    )
)
def test_within_the_forget_time_nothing_older_than_the_newest_is_ever_admitted(
    steps: list[tuple[str, int, int]],
) -> None:
    """Feed (group, epoch, time step): an admitted known epoch is never below the newest one
    admitted for the group within the forget time, and refusals change nothing."""
    e = CoordinatorEpochs(FORGET_MS)
    now = 0
    newest: dict[str, tuple[int, int]] = {}
    for group, epoch, step in steps:
        now += step
        before = e.newest(group)
        admitted = e.admit(group, epoch, now)
        known = newest.get(group)
        expected = epoch < 0 or known is None or epoch >= known[0] or now - known[1] > FORGET_MS
        assert admitted == expected
        if not admitted:
            assert e.newest(group) == before
        elif epoch >= 0:
            newest[group] = (epoch, now)
            assert e.newest(group) == epoch


# -- in process ------------------------------------------------------------------------------


def stale_refusals(cluster: InProcessCluster, receiver: str, kind: str) -> float:
    value = cluster.metrics.registry.get_sample_value(
        "queueflow_stale_coordinator_refusals_total", {"receiver": receiver, "kind": kind}
    )
    return value or 0.0


async def fetch(member: RawMember, max_records: int, acks: Any = None) -> Any:
    request = member.fetch_request(0, max_records, acks=acks)
    request.ticket = member.ticket
    return await member.call(topics.request_topic(member.cluster.app_id, TOPIC), 0, request)


async def take_over(cluster: InProcessCluster) -> ShareGroupCoordinator:
    """A second coordinator on the group table at coordinator epoch 2 (the zombie's successor),
    live on its own fence; the zombie has not read that fence yet."""
    successor = ShareGroupCoordinator(cluster.server, cluster.tables["groups"])
    successor.assign({0}, cluster.server.runtime.generation + 1)
    fence = protocol.encode(protocol.Fence(leader_epoch=2))
    await successor.handle(0, 1_000, fence)
    assert successor.fencing.is_live(0)
    return successor


def test_tickets_and_releases_of_a_superseded_coordinator_are_refused() -> None:
    async def scenario() -> Any:
        async with cluster_with(10) as cluster:
            zombie = cluster.coordinator
            holder = RawMember(cluster, "holder")
            await holder.heartbeat(0)  # joined at the zombie, coordinator epoch 1
            successor = await take_over(cluster)
            renewed = await holder.heartbeat(1, handler=successor.handle, offset=1_001)
            held = await fetch(holder, 3)  # the leader now knows coordinator epoch 2
            # The zombie, not yet fenced, still answers: a join and the holder's leave.
            late = RawMember(cluster, "late")
            await late.heartbeat(0, handler=zombie.handle, offset=50)
            refused = await fetch(late, 5)
            await holder.call(
                topics.coordinator_topic(cluster.app_id),
                0,
                holder.heartbeat_request(-1),
                handler=zombie.handle,
                offset=51,
            )
            await cluster.bus.drain()
            engine = cluster.share_partition("g", TOPIC, 0)
            return cluster, renewed, held, refused, engine.acquired_count

    with capture_logs() as logs:
        cluster, renewed, held, refused, acquired = run(scenario())
    ticket = verify_ticket(cluster.coordinator.ticket_key, renewed.ticket, now_ms=0)
    assert renewed.coordinator_epoch == ticket.coordinator_epoch == 2
    assert held.acquired == [(0, 2, 1)]
    # The zombie's ticket acquires nothing ...
    assert refused.error == ErrorCode.FENCED_MEMBER_EPOCH.value and refused.acquired == []
    assert "newer coordinator (epoch 2)" in refused.error_message
    # ... and its ReleaseMember of the holder's records changed nothing.
    assert acquired == 3
    assert not events(logs, "member_records_released")
    [refusal] = events(logs, "stale_coordinator_refused")
    assert (refusal["kind"], refusal["coordinator_epoch"]) == ("release_member", 1)
    assert stale_refusals(cluster, "leader", "release_member") == 1
    value = cluster.metrics.registry.get_sample_value(
        "queueflow_ticket_refusals_total", {"topic": TOPIC, "reason": "stale_coordinator"}
    )
    assert value == 1


def test_a_reset_of_a_superseded_coordinator_is_refused() -> None:
    async def scenario() -> Any:
        async with cluster_with(6) as cluster:
            a = RawMember(cluster, "a")
            await a.heartbeat(0)
            successor = await take_over(cluster)
            await a.heartbeat(1, handler=successor.handle, offset=1_001)
            await fetch(a, 2, acks=None)
            held = await fetch(a, 0, acks=[(0, 1, (1,))])  # ACCEPT: SPSO 2
            reset = protocol.ResetSharePartition(
                group="g",
                topic=TOPIC,
                partition=0,
                admin_id="admin",
                request_id=1,
                start_offset=0,
                coordinator_epoch=1,  # what the zombie sends
            )
            await cluster.bus.send(
                topics.request_topic(cluster.app_id, TOPIC), 0, protocol.encode(reset)
            )
            await cluster.bus.drain()
            return cluster, held, cluster.share_partition("g", TOPIC, 0).start_offset

    with capture_logs() as logs:
        cluster, held, start = run(scenario())
    assert held.ack_error == ErrorCode.NONE.value and start == 2  # not reset to 0
    assert [e["kind"] for e in events(logs, "stale_coordinator_refused")] == [
        "reset_share_partition"
    ]
    assert not events(logs, "share_partition_reset")
    assert stale_refusals(cluster, "leader", "reset_share_partition") == 1


def test_a_coordinator_that_reads_a_newer_fence_steps_down_and_answers_nothing() -> None:
    async def scenario() -> Any:
        async with cluster_with(0) as cluster:
            zombie = cluster.coordinator
            a = RawMember(cluster, "a")
            await a.heartbeat(0)
            assert set(zombie.groups) == {"g"}
            await zombie.handle(0, 60, protocol.encode(protocol.Fence(leader_epoch=2)))
            before = len(a.replies)
            await zombie.handle(0, 61, protocol.encode(a.heartbeat_request(1)))
            await zombie.handle(0, 62, protocol.encode(protocol.Tick(sent_ms=0)))
            return cluster, zombie, len(a.replies) - before

    with capture_logs() as logs:
        cluster, zombie, answers = run(scenario())
    assert answers == 0 and zombie.groups == {}
    [down] = events(logs, "coordinator_stepped_down")
    assert "taken over by coordinator epoch 2" in down["reason"]
    assert down["code"] == "FENCED_STATE_EPOCH"
    assert [e["reason"] for e in events(logs, "coordinator_request_unserved")] == [
        "not_owner",
        "not_owner",
    ]
    registry = cluster.metrics.registry
    assert registry.get_sample_value("queueflow_coordinator_step_downs_total") == 1
    assert (
        registry.get_sample_value("queueflow_coordinator_unserved_total", {"reason": "not_owner"})
        == 2
    )


def test_a_coordinator_whose_membership_lease_lapsed_answers_nothing_until_it_holds() -> None:
    async def scenario() -> Any:
        async with cluster_with(0) as cluster:
            coordinator = cluster.coordinator
            coordinator.lease_wait_ms = 0
            runtime: Any = cluster.server.runtime
            runtime.lease_ms = 0  # no heartbeat proves the Faust membership now
            a = RawMember(cluster, "a")
            await coordinator.handle(0, 70, protocol.encode(a.heartbeat_request(0)))
            unanswered, persisted = len(a.replies), dict(cluster.tables["groups"])
            runtime.lease_ms = 5_000
            joined = await a.heartbeat(0)
            return cluster, unanswered, persisted, joined

    with capture_logs() as logs:
        cluster, unanswered, persisted, joined = run(scenario())
    assert unanswered == 0 and persisted == {}  # the lapsed request changed nothing
    assert joined.error == ErrorCode.NONE.value and joined.coordinator_epoch == 1
    assert [e["reason"] for e in events(logs, "coordinator_request_unserved")] == ["lease"]
    assert (
        cluster.metrics.registry.get_sample_value(
            "queueflow_coordinator_unserved_total", {"reason": "lease"}
        )
        == 1
    )


def test_the_stall_guard_fences_the_coordinator_and_takes_it_back_if_membership_survived() -> None:
    async def scenario() -> Any:
        async with cluster_with(0) as cluster:
            coordinator = cluster.coordinator
            limit = cluster.server.stall_limit_ms
            await coordinator.watch_stalls(0)
            await coordinator.watch_stalls(limit + 1)  # stalled: steps down
            stalled = not coordinator.fencing.is_live(0)
            await coordinator.watch_stalls(2 * limit + 2)  # same generation: fence again
            await cluster.bus.drain()
            return stalled, coordinator.fencing.is_live(0)

    with capture_logs() as logs:
        stalled, live_again = run(scenario())
    assert stalled and live_again
    assert len(events(logs, "coordinator_stepped_down")) == 1
    assert len(events(logs, "coordinator_resumed_after_stall")) == 1


class _Requester:
    """Hands a membership the answers a test chooses, as the member's reply reader would."""

    reply_partition = 0
    reply_key = None

    def __init__(self, answers: list[protocol.HeartbeatResponse]) -> None:
        self.answers = answers

    def next_id(self) -> int:
        return 1

    async def call(
        self, topic: str, partition: int, rid: int, payload: bytes, accept: Any, **_: Any
    ) -> Any:
        for answer in self.answers:  # both coordinators answer; the first accepted one wins
            if accept(answer):
                return answer
        raise AssertionError("no answer accepted")


def test_a_member_ignores_heartbeat_answers_of_a_superseded_coordinator() -> None:
    def answer(epoch: int, assignment: list[int]) -> protocol.HeartbeatResponse:
        return protocol.HeartbeatResponse(
            member_id="m",
            request_id=1,
            member_epoch=3,
            assignment={TOPIC: assignment},
            ticket=b"t%d" % epoch,
            coordinator_epoch=epoch,
        )

    async def scenario() -> Any:
        cluster = InProcessCluster({TOPIC: 2})
        s = ShareGroupSettings()
        membership = Membership(
            _Requester([answer(2, [0, 1])]),
            "app",
            "g",
            [TOPIC],
            s,
            "c",
            "m",
            metrics=cluster.metrics,
        )
        await membership._heartbeat(join=True)
        membership.requester = _Requester([answer(1, []), answer(2, [1])])  # type: ignore[assignment]
        await membership._heartbeat()
        return cluster, membership

    with capture_logs() as logs:
        cluster, membership = run(scenario())
    assert membership.ticket == b"t2" and {tp.partition for tp in membership.assignment} == {1}
    [refused] = events(logs, "stale_coordinator_answer_refused")
    assert (refused["coordinator_epoch"], refused["newest_coordinator_epoch"]) == (1, 2)
    assert stale_refusals(cluster, "member", "heartbeat_response") == 1
