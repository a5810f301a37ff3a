"""Members' last heartbeats are stored with their group (every third of a session while they
heartbeat), so that the admin, when no coordinator runs, tells members whose session lapsed
(their leave was lost: the workers stopped before them) from live ones, and messages name who
holds a group and since when (docs/operations.md "Share groups that stay non-empty")."""

from __future__ import annotations

from typing import Any, cast

from queueflow.admin import lapsed_members
from queueflow.engine.fencing import PartitionFencing
from queueflow.engine.group import ShareGroup, describe_holders
from queueflow.errors import ErrorCode
from queueflow.protocol import messages as protocol
from queueflow.protocol.group_codec import decode_group, encode_group
from queueflow.server.context import ServerContext
from queueflow.server.coordinator import admin, membership
from queueflow.server.coordinator.results import CoordinatorResult, PersistGroup
from queueflow.server.coordinator.state import CoordinatorState
from queueflow.settings import ShareGroupSettings

TOPIC = "jobs"
T0 = 1_800_000_000_000  # wall ms (2027-01-15T08:00:00Z)
SESSION_MS = 9_000


def make_state() -> CoordinatorState:
    ctx = ServerContext(
        app_id="app",
        settings=ShareGroupSettings(heartbeat_interval_ms=200, session_timeout_ms=SESSION_MS),
        sender=cast(Any, None),
        runtime=cast(Any, None),
        log_offsets=cast(Any, None),
        topic_metadata=cast(Any, None),
        stall_limit_ms=11_000,
        clock=cast(Any, None),
    )
    fencing = PartitionFencing(11_000, role="coordinator")
    fencing.assign({0}, 3)
    return CoordinatorState(ctx, {}, fencing, ("simple",))


def beat(state: CoordinatorState, member: str, epoch: int, now: int) -> CoordinatorResult:
    request = protocol.HeartbeatRequest(
        group="g",
        member_id=member,
        member_epoch=epoch,
        subscribed_topics=[TOPIC],
        reply_partition=0,
        request_id=1,
    )
    checked = membership.check_heartbeat(state, request, now)
    assert not isinstance(checked, CoordinatorResult), checked
    return membership.handle_heartbeat(state, request, checked, {TOPIC: 2}, None, now)


def stored(result: CoordinatorResult) -> ShareGroup:
    [record] = [r for r in result.records if isinstance(r, PersistGroup)]
    return decode_group("g", record.value, 45_000, 100, 0, stored_sessions=True)


def test_a_join_stores_the_heartbeat_and_the_groups_session_timeout() -> None:
    group = stored(beat(make_state(), "a", 0, T0))
    assert group.members["a"].last_heartbeat_ms == T0
    assert group.session_timeout_ms == SESSION_MS


def test_heartbeats_are_stored_again_every_third_of_a_session_at_ticks() -> None:
    state = make_state()
    beat(state, "a", 0, T0)
    third = SESSION_MS // 3
    beat(state, "a", 1, T0 + third - 1)
    assert membership.handle_tick(state, T0 + third - 1).records == ()  # not due yet
    beat(state, "a", 1, T0 + third)
    group = stored(membership.handle_tick(state, T0 + third))
    assert group.members["a"].last_heartbeat_ms == T0 + third
    assert membership.handle_tick(state, T0 + third + 1).records == ()  # stored once


def test_a_coordinator_gives_restored_members_a_fresh_session() -> None:
    data = encode_group(stored(beat(make_state(), "a", 0, T0)))
    restored = decode_group("g", data, SESSION_MS, 100, T0 + 60_000)
    assert restored.members["a"].last_heartbeat_ms == T0 + 60_000


def test_the_admin_tells_lapsed_members() -> None:
    state = make_state()
    beat(state, "a", 0, T0)
    beat(state, "b", 0, T0 + 5_000)
    data = encode_group(state.groups["g"])
    group = decode_group("g", data, 45_000, 100, 0, stored_sessions=True)
    assert lapsed_members(group, T0 + SESSION_MS) == []
    assert [m.member_id for m in lapsed_members(group, T0 + SESSION_MS + 1)] == ["a"]
    assert len(lapsed_members(group, T0 + 5_000 + SESSION_MS + 1)) == 2


def test_a_group_stored_without_heartbeats_never_reads_lapsed() -> None:
    group = ShareGroup("g", SESSION_MS, 100)
    group.heartbeat("a", 0, [TOPIC], 0, {TOPIC: 1})  # an older coordinator stored no times
    back = decode_group("g", encode_group(group), 45_000, 100, 0, stored_sessions=True)
    assert back.members["a"].last_heartbeat_ms == 0
    assert lapsed_members(back, T0) == []


def test_holders_say_who_and_since_when() -> None:
    text = describe_holders([("m-1", "app:agent", T0), ("m-2", "", None)], T0 + 12_400)
    assert text == (
        "m-1 (client-id app:agent, last heartbeat 2027-01-15T08:00:00Z, 12 s ago), "
        "m-2 (last heartbeat unknown)"
    )
    many = describe_holders([(f"m{i}", "", T0) for i in range(7)], T0, limit=2)
    assert many.endswith("and 5 more")


def test_the_coordinators_non_empty_refusal_names_the_members() -> None:
    state = make_state()
    beat(state, "a", 0, T0)
    request = protocol.DeleteShareGroupRequest(
        group="g", admin_id="adm", request_id=0, reply_partition=0
    )
    result, group = admin.begin_admin(state, request, T0 + 1_000)
    assert group is None
    [reply] = result.replies
    assert reply.message.error == ErrorCode.NON_EMPTY_GROUP.value
    message = reply.message.error_message
    assert "share group 'g' is not empty: it has 1 member(s): a (last heartbeat " in message
    assert ", 1 s ago)" in message
    assert f"a member is expired {SESSION_MS} ms (share.session.timeout.ms)" in message
