"""The coordinator's pure handlers, called directly: no asyncio, no Kafka, no in-process
cluster. The server context they get raises on any I/O (sender, metadata, runtime, clock), so a
handler that tried any would fail here. Also the transition tables of the coordinator's named
states (forwarded admin requests, owned coordinator partitions)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from queueflow.engine.fencing import PartitionFencing
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.protocol.auth import verify_ticket
from queueflow.server.context import ServerContext
from queueflow.server.coordinator import admin, membership
from queueflow.server.coordinator.admin_state import (
    ADMIN_TRANSITIONS,
    AdminState,
    PendingAdmin,
)
from queueflow.server.coordinator.announcements import (
    LEADER_ADDRESS_TTL_MS,
    handle_announcement,
)
from queueflow.server.coordinator.gate import OWNED_TRANSITIONS, CoordinatorGate, OwnedState
from queueflow.server.coordinator.results import (
    CoordinatorResult,
    DeleteGroup,
    LogEvent,
    PersistGroup,
    Reply,
    ToLeader,
)
from queueflow.server.coordinator.state import CoordinatorState
from queueflow.settings import ShareGroupSettings
from queueflow.structs import TopicPartition
from queueflow.testing import FakeClock

TOPIC = "jobs"
EPOCH = 3  # the coordinator epoch the state serves under
T0 = 1_000_000  # wall ms


class _NoIO:
    """Stands for the sender, runtime, metadata and clock: a pure handler touches none."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a pure handler used {self.what}.{name}")


def make_state(table: dict[bytes, bytes] | None = None, **overrides: Any) -> CoordinatorState:
    values: dict[str, Any] = {"heartbeat_interval_ms": 200, "session_timeout_ms": 10_000}
    values.update(overrides)
    ctx = ServerContext(
        app_id="app",
        settings=ShareGroupSettings(**values),
        sender=cast(Any, _NoIO("sender")),
        runtime=cast(Any, _NoIO("runtime")),
        log_offsets=cast(Any, _NoIO("log_offsets")),
        topic_metadata=cast(Any, _NoIO("topic_metadata")),
        stall_limit_ms=11_000,
        clock=cast(Any, _NoIO("clock")),
    )
    fencing = PartitionFencing(11_000, role="coordinator")
    fencing.assign({0}, EPOCH)
    return CoordinatorState(ctx, {} if table is None else table, fencing, ("simple",))


def heartbeat(member: str, epoch: int, **fields: Any) -> protocol.HeartbeatRequest:
    return protocol.HeartbeatRequest(
        group="g",
        member_id=member,
        member_epoch=epoch,
        subscribed_topics=[TOPIC],
        reply_partition=0,
        request_id=7,
        **fields,
    )


def beat(
    state: CoordinatorState, member: str, epoch: int, now: int = T0, partitions: int = 2
) -> CoordinatorResult:
    """A heartbeat through both phases, with ``partitions`` partitions of the topic."""
    request = heartbeat(member, epoch)
    checked = membership.check_heartbeat(state, request, now)
    assert not isinstance(checked, CoordinatorResult), checked
    return membership.handle_heartbeat(state, request, checked, {TOPIC: partitions}, None, now)


def answer(result: CoordinatorResult) -> Any:
    [reply] = result.replies
    return reply.message


def names(result: CoordinatorResult) -> list[str]:
    return [e.event for e in result.events]


# -- membership -------------------------------------------------------------------------------


def test_a_join_is_answered_with_an_assignment_and_a_ticket_and_the_group_is_stored() -> None:
    state = make_state()
    result = beat(state, "a", 0)
    response = answer(result)
    assert response.error == ErrorCode.NONE.value
    assert (response.member_epoch, response.assignment) == (1, {TOPIC: [0, 1]})
    assert response.coordinator_epoch == EPOCH and response.heartbeat_interval_ms == 200
    ticket = verify_ticket(state.ticket_key, response.ticket, now_ms=T0)
    assert (ticket.member_id, ticket.member_epoch, ticket.coordinator_epoch) == ("a", 1, EPOCH)
    [record] = result.records
    assert isinstance(record, PersistGroup)
    assert (record.group_id, record.members, record.group_epoch, record.rebalances) == (
        "g",
        1,
        1,
        1,
    )
    assert names(result) == ["share_group_epoch", "assignor_selected"]
    assert result.to_leaders == ()


def test_a_steady_heartbeat_writes_nothing() -> None:
    state = make_state()
    beat(state, "a", 0)
    result = beat(state, "a", 1, now=T0 + 200)
    assert answer(result).member_epoch == 1
    assert result.records == () and result.events == () and result.to_leaders == ()


def test_a_leave_releases_the_members_records_on_every_partition_of_the_groups_topics() -> None:
    state = make_state()
    beat(state, "a", 0)
    beat(state, "b", 0)
    result = beat(state, "a", -1)
    assert answer(result).member_epoch == -1 and answer(result).ticket == b""
    released = [t.message for t in result.to_leaders]
    assert [(m.topic, m.partition, m.member_id, m.reason) for m in released] == [
        (TOPIC, 0, "a", "member left"),
        (TOPIC, 1, "a", "member left"),
    ]
    group_epoch = state.groups["g"].group_epoch
    assert all(m.member_epoch == group_epoch and m.coordinator_epoch == EPOCH for m in released)
    [record] = result.records
    assert isinstance(record, PersistGroup) and record.members == 1


def test_an_unsupported_protocol_version_is_answered_without_touching_the_group() -> None:
    state = make_state()
    request = heartbeat("a", 0, protocol_version=999)
    result = membership.check_heartbeat(state, request, T0)
    assert isinstance(result, CoordinatorResult)
    assert answer(result).error == ErrorCode.UNSUPPORTED_VERSION.value
    assert names(result) == ["unsupported_protocol_version"] and state.groups == {}


def test_a_reply_key_of_the_wrong_size_is_refused_unsealed() -> None:
    state = make_state()
    result = membership.check_heartbeat(state, heartbeat("a", 0, reply_key=b"short"), T0)
    assert isinstance(result, CoordinatorResult)
    [reply] = result.replies
    assert reply.reply_key == b"" and reply.message.error == ErrorCode.INVALID_REQUEST.value


def test_corrupt_group_metadata_is_answered_not_dropped() -> None:
    state = make_state(table={b"g": b"not json"})
    result = membership.check_heartbeat(state, heartbeat("a", 0), T0)
    assert isinstance(result, CoordinatorResult)
    assert answer(result).error == ErrorCode.CORRUPT_STATE.value
    assert names(result) == ["share_group_refused"]


def test_a_join_while_an_admin_request_is_pending_is_told_to_retry() -> None:
    state = make_state()
    beat(state, "a", 0)
    beat(state, "a", -1)
    request = protocol.DeleteShareGroupRequest("g", "admin", 1, 0)
    state.pending["g"] = PendingAdmin(request, "delete group", {(TOPIC, 0)}, T0 + 1000)
    result = membership.check_heartbeat(state, heartbeat("b", 0), T0)
    assert isinstance(result, CoordinatorResult)
    assert answer(result).error == ErrorCode.REQUEST_TIMED_OUT.value
    assert "retry the join" in answer(result).error_message


def test_a_metadata_error_is_answered_and_changes_nothing() -> None:
    state = make_state()
    request = heartbeat("a", 0)
    group = membership.check_heartbeat(state, request, T0)
    assert not isinstance(group, CoordinatorResult)
    error = ShareGroupError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic")
    result = membership.handle_heartbeat(state, request, group, error, None, T0)
    assert answer(result).error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.value
    assert result.records == () and not group.members


def test_a_tick_expires_silent_members_and_releases_their_records() -> None:
    state = make_state()
    beat(state, "a", 0)
    result = membership.handle_tick(state, T0 + 10_001)
    assert names(result)[0] == "member_session_expired"
    assert [t.message.reason for t in result.to_leaders] == ["session timeout"] * 2
    [record] = result.records
    assert isinstance(record, PersistGroup) and record.members == 0
    assert membership.handle_tick(state, T0 + 10_002) == CoordinatorResult()


def test_a_long_silence_refreshes_every_session() -> None:
    state = make_state()
    membership.touch_after_silence(state, T0)
    beat(state, "a", 0)
    membership.touch_after_silence(state, T0 + 60_000)  # the coordinator was not running
    assert membership.handle_tick(state, T0 + 60_001).to_leaders == ()


# -- announcements ----------------------------------------------------------------------------


def test_announcements_log_a_new_address_once_and_expire_after_the_ttl() -> None:
    state = make_state()
    announce = protocol.LeaderAnnouncement(TOPIC, [0], 2, "h:1", lag=[("g", 0, 40)])
    first = handle_announcement(state.directory, announce, T0)
    assert names(first) == ["share_partition_leader"]
    assert handle_announcement(state.directory, announce, T0 + 1).empty
    older = protocol.LeaderAnnouncement(TOPIC, [0], 1, "h:2")
    assert handle_announcement(state.directory, older, T0 + 2).empty  # a lower epoch loses
    tp = TopicPartition(TOPIC, 0)
    assert state.directory.addresses_of([tp], T0 + 2) == [(TOPIC, 0, "h:1")]
    assert state.directory.addresses_of([tp], T0 + 2 + LEADER_ADDRESS_TTL_MS) == []
    assert state.directory.fresh_lag("g", T0) == {tp: 40}


def test_announcements_name_the_kafka_listener_of_each_leader_until_the_address_expires() -> None:
    state = make_state()
    with_listener = protocol.LeaderAnnouncement(TOPIC, [0, 1], 2, "h:1", kafka_listener="h:9192")
    handle_announcement(state.directory, with_listener, T0)
    handle_announcement(state.directory, protocol.LeaderAnnouncement(TOPIC, [2], 2, "h:2"), T0)
    assert state.directory.kafka_leaders(T0) == {
        (TOPIC, 0): (2, "h:9192"),
        (TOPIC, 1): (2, "h:9192"),
    }
    assert state.directory.kafka_leaders(T0 + LEADER_ADDRESS_TTL_MS + 1) == {}
    # the listener was turned off on that worker: its next announcement says so
    handle_announcement(state.directory, protocol.LeaderAnnouncement(TOPIC, [0], 2, "h:1"), T0)
    assert state.directory.kafka_leaders(T0) == {}


def test_announcements_name_the_kafka_listener_of_each_coordinator_partition() -> None:
    state = make_state()
    directory = state.directory
    a = protocol.LeaderAnnouncement(
        TOPIC, [0], 2, "h:1", kafka_listener="h:9192", coordinator_partitions=[(0, 4), (1, 4)]
    )
    handle_announcement(directory, a, T0)
    assert (directory.kafka_coordinator(0, T0), directory.kafka_coordinator(1, T0)) == (
        "h:9192",
        "h:9192",
    )
    # partition 1 moved to a worker without a listener at a newer coordinator epoch; an older
    # epoch's claim on partition 0 loses
    b = protocol.LeaderAnnouncement(TOPIC, [1], 2, "h:2", coordinator_partitions=[(1, 5), (0, 3)])
    handle_announcement(directory, b, T0 + 1)
    assert directory.kafka_coordinator(0, T0 + 1) == "h:9192"
    assert directory.kafka_coordinator(1, T0 + 1) is None
    assert directory.kafka_coordinator(0, T0 + LEADER_ADDRESS_TTL_MS + 1) is None
    assert directory.kafka_coordinator(7, T0) is None


def ticket_request(member: str, key: bytes = b"k" * 32) -> protocol.MemberTicketRequest:
    return protocol.MemberTicketRequest(
        group="g", member_id=member, reply_partition=3, request_id=11, reply_key=key
    )


def test_a_worker_gets_a_live_members_ticket_bound_to_its_key_and_the_group_is_untouched() -> None:
    state = make_state()
    beat(state, "a", 0, now=T0)
    group = state.groups["g"]
    epoch_before = group.group_epoch
    result = membership.handle_member_ticket(state, ticket_request("a"), T0 + 1_000)
    assert result.records == () and result.to_leaders == () and result.events == ()
    assert group.group_epoch == epoch_before
    [reply] = result.replies
    assert (reply.recipient, reply.reply_partition, reply.reply_key) == ("a", 3, b"k" * 32)
    response = reply.message
    assert isinstance(response, protocol.HeartbeatResponse)
    assert (response.error, response.request_id) == (ErrorCode.NONE.value, 11)
    assert (response.member_epoch, response.assignment) == (1, {TOPIC: [0, 1]})
    ticket = verify_ticket(state.ticket_key, response.ticket, now_ms=T0 + 1_000)
    assert (ticket.member_id, ticket.member_epoch, ticket.reply_key) == ("a", 1, b"k" * 32)
    # it vouches no longer than the member's session: its last heartbeat + the timeout
    assert ticket.expires_ms == T0 + 10_000


@pytest.mark.parametrize("case", ["unknown group", "unknown member", "lapsed", "left"])
def test_a_ticket_of_a_member_not_in_the_group_is_refused(case: str) -> None:
    state = make_state()
    if case != "unknown group":
        beat(state, "a", 0, now=T0)
    if case == "left":
        beat(state, "a", -1, now=T0 + 1)
    member, now = ("b", T0) if case == "unknown member" else ("a", T0 + 1)
    if case == "lapsed":
        now = T0 + 10_000
    result = membership.handle_member_ticket(state, ticket_request(member), now)
    response = answer(result)
    assert response.error == ErrorCode.UNKNOWN_MEMBER_ID.value
    assert response.ticket == b""
    assert result.records == ()


def test_a_ticket_request_with_a_bad_reply_key_is_refused_unsealed() -> None:
    state = make_state()
    beat(state, "a", 0)
    [reply] = membership.handle_member_ticket(state, ticket_request("a", b"short"), T0).replies
    assert reply.message.error == ErrorCode.INVALID_REQUEST.value and reply.reply_key == b""


def test_a_member_envelope_cannot_carry_a_ticket_request() -> None:
    from queueflow.protocol.envelope import MEMBER_KINDS

    assert "member_ticket" not in MEMBER_KINDS


# -- admin ------------------------------------------------------------------------------------


def admin_group(state: CoordinatorState) -> None:
    """Group ``g`` with the topic's 2 share-partitions and no members."""
    beat(state, "a", 0)
    beat(state, "a", -1)


def test_a_delete_is_forwarded_to_the_leaders_and_answered_once_all_of_them_did() -> None:
    state = make_state()
    admin_group(state)
    request = protocol.DeleteShareGroupRequest("g", "admin", 1, 4)
    begun, group = admin.begin_admin(state, request, T0)
    assert begun == CoordinatorResult() and group is not None
    forwarded = admin.forward_admin(state, request, group, {}, T0)
    assert names(forwarded) == ["share_group_admin_request"]
    resets = [t.message for t in forwarded.to_leaders]
    assert [(r.partition, r.start_offset, r.coordinator_epoch) for r in resets] == [
        (0, None, EPOCH),
        (1, None, EPOCH),
    ]
    assert all(r.deadline_ms == T0 + admin.ADMIN_DEADLINE_MS for r in resets)
    pending = state.pending["g"]
    assert pending.state is AdminState.WAITING
    done = [
        admin.handle_reset_result(
            state, protocol.ResetSharePartitionResult("g", TOPIC, p, "admin", 1), T0
        )
        for p in (0, 0, 1)  # the repeated answer is ignored
    ]
    assert done[0].empty and done[1].empty
    assert pending.state is AdminState.ANSWERED and "g" not in state.pending
    assert done[2].records == (DeleteGroup("g"),) and "g" not in state.groups
    [reply] = done[2].replies
    assert (reply.recipient, reply.reply_partition) == ("admin", 4)
    assert reply.message.error == ErrorCode.NONE.value and len(reply.message.results) == 2


def test_an_admin_request_on_a_group_with_members_is_refused() -> None:
    state = make_state()
    beat(state, "a", 0)
    request = protocol.DeleteShareGroupRequest("g", "admin", 1, 0)
    result, group = admin.begin_admin(state, request, T0)
    assert group is None and state.pending == {}
    assert answer(result).error == ErrorCode.NON_EMPTY_GROUP.value
    assert names(result) == ["share_group_admin_refused"]


def test_an_admin_request_expires_lapsed_members_first_without_logging_them() -> None:
    state = make_state()
    beat(state, "a", 0)
    request = protocol.DeleteShareGroupRequest("g", "admin", 1, 0)
    result, group = admin.begin_admin(state, request, T0 + 10_001)
    assert group is not None and not group.members
    assert "member_session_expired" not in names(result)
    assert [t.message.reason for t in result.to_leaders] == ["session timeout"] * 2


def test_an_alteration_to_a_missing_partition_is_refused_after_the_counts() -> None:
    state = make_state()
    admin_group(state)
    request = protocol.AlterShareGroupOffsetsRequest("g", "admin", 1, 0, offsets=[(TOPIC, 5, 0)])
    _, group = admin.begin_admin(state, request, T0)
    assert group is not None and admin.count_topics(request) == [TOPIC]
    result = admin.forward_admin(state, request, group, {TOPIC: 2}, T0)
    assert answer(result).error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.value
    assert state.pending == {}


def test_a_request_read_after_its_deadline_is_dropped_unanswered() -> None:
    state = make_state()
    admin_group(state)
    request = protocol.DeleteShareGroupRequest("g", "admin", 1, 0, deadline_ms=T0 - 1)
    result, group = admin.begin_admin(state, request, T0)
    assert group is None and result.replies == ()
    assert names(result) == ["share_group_admin_expired"]


def test_a_pending_request_past_its_deadline_is_answered_with_what_was_applied() -> None:
    state = make_state()
    admin_group(state)
    request = protocol.DeleteShareGroupRequest("g", "admin", 1, 0, deadline_ms=T0 + 500)
    _, group = admin.begin_admin(state, request, T0)
    assert group is not None
    admin.forward_admin(state, request, group, {}, T0)
    pending = state.pending["g"]
    result = protocol.ResetSharePartitionResult("g", TOPIC, 0, "admin", 1, start_offset=-1)
    assert admin.handle_reset_result(state, result, T0).empty
    assert admin.expire_pending(state, T0 + 500).empty
    expired = admin.expire_pending(state, T0 + 501)
    assert pending.state is AdminState.EXPIRED and state.pending == {}
    response = answer(expired)
    assert response.error == ErrorCode.REQUEST_TIMED_OUT.value
    assert f"leaders of {TOPIC}[1] did not answer" in response.error_message
    assert f"Applied to: {TOPIC}[0]." in response.error_message


def test_group_configs_are_altered_stored_and_described() -> None:
    state = make_state()
    admin_group(state)
    alter = protocol.AlterGroupConfigsRequest(
        "g", "admin", 1, 0, set_configs={"share.session.timeout.ms": "12000"}
    )
    result = admin.handle_group_configs(state, alter, T0)
    [record] = result.records
    assert isinstance(record, PersistGroup)
    assert state.groups["g"].config_version == 1
    assert state.groups["g"].session_timeout_ms == 12_000
    configs = {name: value for name, value, _, _ in answer(result).configs}
    assert configs["share.session.timeout.ms"] == "12000"
    bad = protocol.AlterGroupConfigsRequest(
        "g", "admin", 2, 0, set_configs={"share.session.timeout.ms": "1"}
    )
    refused = admin.handle_group_configs(state, bad, T0)
    assert answer(refused).error == ErrorCode.INVALID_CONFIG.value and refused.records == ()
    # As Kafka: a group no member joined yet has configs (the defaults), and they can be set.
    missing = protocol.DescribeGroupConfigsRequest("nope", "admin", 3, 0)
    described = admin.handle_group_configs(state, missing, T0)
    assert answer(described).error == ErrorCode.NONE.value and described.records == ()
    assert "nope" not in state.groups
    early = protocol.AlterGroupConfigsRequest(
        "nope", "admin", 4, 0, set_configs={"share.auto.offset.reset": "earliest"}
    )
    [record] = admin.handle_group_configs(state, early, T0).records
    assert isinstance(record, PersistGroup)
    assert state.groups["nope"].configs == {"share.auto.offset.reset": "earliest"}
    assert state.groups["nope"].group_epoch == 0 and not state.groups["nope"].members


# -- results ----------------------------------------------------------------------------------


def test_results_add_up_in_order() -> None:
    first = CoordinatorResult(events=(LogEvent.info("a_b"),), records=(DeleteGroup("x"),))
    release = ToLeader(protocol.ReleaseMember("g", TOPIC, 0, "m"))
    reply = Reply("m", 0, protocol.AdminResponse("m", 1))
    second = CoordinatorResult(events=(LogEvent.warning("c_d"),), to_leaders=(release,))
    both = first + second + CoordinatorResult(replies=(reply,))
    assert [e.event for e in both.events] == ["a_b", "c_d"]
    assert both.records == (DeleteGroup("x"),) and both.to_leaders == (release,)
    assert both.replies == (reply,) and not both.empty and CoordinatorResult().empty


# -- named states -----------------------------------------------------------------------------


@pytest.mark.parametrize("start", list(AdminState))
@pytest.mark.parametrize("to", list(AdminState))
def test_admin_request_transitions_follow_the_table(start: AdminState, to: AdminState) -> None:
    pending = PendingAdmin(protocol.DeleteShareGroupRequest("g", "a", 1, 0), "delete", set(), 0)
    pending.state = start
    if to in ADMIN_TRANSITIONS[start]:
        pending.move(to)
        assert pending.state is to
    else:
        with pytest.raises(ValueError, match="is not allowed"):
            pending.move(to)
        assert pending.state is start


def test_only_a_waiting_admin_request_moves_and_every_move_is_final() -> None:
    assert ADMIN_TRANSITIONS[AdminState.WAITING] == {
        AdminState.ANSWERED,
        AdminState.EXPIRED,
        AdminState.ABANDONED,
    }
    assert all(not ADMIN_TRANSITIONS[s] for s in AdminState if s is not AdminState.WAITING)


def make_gate() -> CoordinatorGate:
    """The gate is the I/O side of fencing, not a pure handler: it gets a clock."""
    ctx = replace(make_state().ctx, clock=FakeClock())
    return CoordinatorGate(ctx, cast(Any, _NoIO("auth")), "app-share-coordinator", print)


@pytest.mark.parametrize("start", list(OwnedState))
@pytest.mark.parametrize("to", list(OwnedState))
def test_owned_partition_transitions_follow_the_table(start: OwnedState, to: OwnedState) -> None:
    gate = make_gate()
    gate.states[0] = start
    if to in OWNED_TRANSITIONS[start]:
        gate.move(0, to)
        assert gate.states[0] is to
    else:
        with pytest.raises(ValueError, match="is not allowed"):
            gate.move(0, to)
        assert gate.states[0] is start


def test_an_owned_partition_goes_live_on_its_own_fence_and_a_partition_not_owned_never_moves() -> (
    None
):
    gate = make_gate()
    gate.assign({0}, 4)
    assert gate.states[0] is OwnedState.FENCING
    gate.on_fence(0, 4)
    assert gate.states[0] is OwnedState.LIVE and gate.fencing.is_live(0)
    gate.revoke({0})
    with pytest.raises(ValueError, match="not owned"):
        gate.move(0, OwnedState.LIVE)
