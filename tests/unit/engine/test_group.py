"""Share-group membership (``queueflow.engine.group.ShareGroup``), the coordinator's state."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine.group import GroupState, ShareGroup
from queueflow.errors import ErrorCode, ShareGroupError

TIMEOUT = 45_000
PARTS = {"t": 4}


def group(max_size: int = 10) -> ShareGroup:
    return ShareGroup("G", session_timeout_ms=TIMEOUT, max_size=max_size)


def all_assigned(g: ShareGroup) -> Counter[tuple[str, int]]:
    return Counter(tp for m in g.members.values() for tp in m.assignment)


# ------------------------------------------------------------------------------------------------
# Join, heartbeat, leave
# ------------------------------------------------------------------------------------------------


def test_new_group_is_empty() -> None:
    g = group()
    assert g.state is GroupState.EMPTY
    assert g.group_epoch == 0
    assert g.assignment_epoch == 0
    assert g.members == {}


def test_join_with_epoch_zero() -> None:
    g = group()
    res = g.heartbeat("m1", 0, ["t"], now_ms=0, partitions=PARTS, client_id="c", host="h")
    assert res.member_epoch == 1
    assert res.assignment == [("t", 0), ("t", 1), ("t", 2), ("t", 3)]
    assert res.released == []
    assert g.state is GroupState.STABLE
    assert g.group_epoch == 1
    assert g.assignment_epoch == 1
    assert g.members["m1"].client_id == "c"
    assert g.members["m1"].host == "h"


def test_second_member_splits_partitions_and_bumps_epoch() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    res = g.heartbeat("m2", 0, ["t"], 10, PARTS)
    assert res.member_epoch == 2
    assert len(res.assignment) == 2
    assert g.group_epoch == 2
    assert all_assigned(g) == Counter({("t", p): 1 for p in range(4)})
    assert {len(m.assignment) for m in g.members.values()} == {2}
    # m1 learns its new assignment and epoch on its next heartbeat.
    res1 = g.heartbeat("m1", 1, ["t"], 20, PARTS)
    assert res1.member_epoch == 2
    assert sorted(res1.assignment + res.assignment) == [("t", p) for p in range(4)]


def test_plain_heartbeat_changes_nothing() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    before = g.to_dict()
    res = g.heartbeat("m1", 1, ["t"], 1000, PARTS)
    assert res.member_epoch == 1
    assert res.released == []
    assert g.to_dict() == before
    assert g.members["m1"].last_heartbeat_ms == 1000


def test_heartbeat_keeps_client_id_when_not_given() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS, client_id="c", host="h")
    g.heartbeat("m1", 1, ["t"], 1, PARTS)
    assert (g.members["m1"].client_id, g.members["m1"].host) == ("c", "h")


def test_leave_with_minus_one_returns_released() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    g.heartbeat("m2", 0, ["t"], 0, PARTS)
    held = list(g.members["m2"].assignment)
    res = g.heartbeat("m2", -1, ["t"], 5, PARTS)
    assert res.member_epoch == -1
    assert res.assignment == []
    assert res.released == [("m2", held)]
    assert set(g.members) == {"m1"}
    assert g.group_epoch == 3
    assert g.members["m1"].assignment == [("t", p) for p in range(4)]


def test_last_member_leaving_empties_group() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    assert g.leave("m1") == [("m1", [("t", p) for p in range(4)])]
    assert g.state is GroupState.EMPTY
    assert g.group_epoch == 2


def test_leave_of_unknown_member_is_a_no_op() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    res = g.heartbeat("ghost", -1, ["t"], 0, PARTS)
    assert res.member_epoch == -1
    assert res.released == []
    assert g.group_epoch == 1


@pytest.mark.parametrize("epoch", [1, 7])
def test_unknown_member_with_positive_epoch(epoch: int) -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    with pytest.raises(ShareGroupError) as info:
        g.heartbeat("ghost", epoch, ["t"], 0, PARTS)
    assert info.value.code is ErrorCode.UNKNOWN_MEMBER_ID
    assert "ghost" in str(info.value)
    assert set(g.members) == {"m1"}
    assert g.group_epoch == 1


def test_group_max_size_reached() -> None:
    g = group(max_size=2)
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    g.heartbeat("m2", 0, ["t"], 0, PARTS)
    # Confirmed members (a heartbeat with their epoch) count toward group.share.max.size.
    g.heartbeat("m1", g.group_epoch, ["t"], 0, PARTS)
    g.heartbeat("m2", g.group_epoch, ["t"], 0, PARTS)
    with pytest.raises(ShareGroupError) as info:
        g.heartbeat("m3", 0, ["t"], 0, PARTS)
    assert info.value.code is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert "'G'" in str(info.value)
    assert set(g.members) == {"m1", "m2"}
    assert g.group_epoch == 2
    # Existing members still heartbeat, and a free slot can be taken again.
    g.heartbeat("m2", 2, ["t"], 1, PARTS)
    g.leave("m1")
    g.heartbeat("m3", 0, ["t"], 2, PARTS)
    assert set(g.members) == {"m2", "m3"}


def test_deleted_group_refuses_heartbeats() -> None:
    g = group()
    g.dead = True
    assert g.state is GroupState.DEAD
    with pytest.raises(ShareGroupError) as info:
        g.heartbeat("m1", 0, ["t"], 0, PARTS)
    assert info.value.code is ErrorCode.GROUP_ID_NOT_FOUND


# ------------------------------------------------------------------------------------------------
# Subscriptions and partition counts
# ------------------------------------------------------------------------------------------------


def test_subscription_change_bumps_epoch_and_reassigns() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, {"t": 2, "u": 3})
    assert g.group_epoch == 1
    res = g.heartbeat("m1", 1, ["t", "u"], 1, {"t": 2, "u": 3})
    assert g.group_epoch == 2
    assert res.member_epoch == 2
    assert res.assignment == [("t", 0), ("t", 1), ("u", 0), ("u", 1), ("u", 2)]
    assert g.subscribed_topics() == {"t", "u"}
    # Order of topics is not a change.
    g.heartbeat("m1", 2, ["u", "t"], 2, {"t": 2, "u": 3})
    assert g.group_epoch == 2


def test_partition_count_change_bumps_epoch() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, {"t": 2})
    res = g.heartbeat("m1", 1, ["t"], 1, {"t": 3})
    assert g.group_epoch == 2
    assert res.assignment == [("t", 0), ("t", 1), ("t", 2)]


def test_subscription_to_unknown_topic_gets_nothing() -> None:
    g = group()
    res = g.heartbeat("m1", 0, ["missing"], 0, PARTS)
    assert res.assignment == []
    assert g.state is GroupState.STABLE


# ------------------------------------------------------------------------------------------------
# Session expiry
# ------------------------------------------------------------------------------------------------


def test_expire_removes_silent_members_and_reports_them() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    g.heartbeat("m2", 0, ["t"], 0, PARTS)
    g.heartbeat("m2", 2, ["t"], 30_000, PARTS)
    held = list(g.members["m1"].assignment)
    epoch = g.group_epoch
    assert g.expire(TIMEOUT) == []  # exactly the timeout: not yet
    assert g.expire(TIMEOUT + 1) == [("m1", held)]
    assert set(g.members) == {"m2"}
    assert g.group_epoch == epoch + 1
    assert g.members["m2"].assignment == [("t", p) for p in range(4)]
    with pytest.raises(ShareGroupError) as info:
        g.heartbeat("m1", 2, ["t"], TIMEOUT + 2, PARTS)
    assert info.value.code is ErrorCode.UNKNOWN_MEMBER_ID


def test_expire_everyone_empties_group() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    g.heartbeat("m2", 0, ["t"], 0, PARTS)
    released = g.expire(10 * TIMEOUT)
    assert sorted(m for m, _ in released) == ["m1", "m2"]
    assert sorted(tp for _, tps in released for tp in tps) == [("t", p) for p in range(4)]
    assert g.state is GroupState.EMPTY


def test_expire_with_nobody_silent_changes_nothing() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    assert g.expire(1000) == []
    assert g.group_epoch == 1


def test_touch_all_gives_fresh_sessions() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    g.touch_all(100_000)
    assert g.expire(100_000 + TIMEOUT) == []
    assert [m for m, _ in g.expire(100_001 + TIMEOUT)] == ["m1"]


# ------------------------------------------------------------------------------------------------
# Durable form
# ------------------------------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t", "u"], 0, {"t": 3, "u": 1}, client_id="c1", host="h1")
    g.heartbeat("m2", 0, ["t"], 5, {"t": 3, "u": 1}, client_id="c2", host="h2")
    data = g.to_dict()
    back = ShareGroup.from_dict("G", data, TIMEOUT, 10, now_ms=1_000_000)
    assert back.to_dict() == data
    assert back.group_epoch == g.group_epoch
    assert back.assignment_epoch == g.assignment_epoch
    assert back.state is GroupState.STABLE
    for mid, m in g.members.items():
        b = back.members[mid]
        assert (b.member_epoch, b.subscribed_topics, b.assignment) == (
            m.member_epoch,
            m.subscribed_topics,
            m.assignment,
        )
        assert (b.client_id, b.host) == (m.client_id, m.host)
        assert b.last_heartbeat_ms == 1_000_000  # a fresh session


def test_from_dict_then_heartbeat_continues_epochs() -> None:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    back = ShareGroup.from_dict("G", g.to_dict(), TIMEOUT, 10, now_ms=0)
    assert back.heartbeat("m1", 1, ["t"], 1, PARTS).member_epoch == 1
    assert back.heartbeat("m2", 0, ["t"], 1, PARTS).member_epoch == 2


def test_round_trip_of_empty_and_dead_groups() -> None:
    g = group()
    assert ShareGroup.from_dict("G", g.to_dict(), TIMEOUT, 10, 0).state is GroupState.EMPTY
    g.dead = True
    assert ShareGroup.from_dict("G", g.to_dict(), TIMEOUT, 10, 0).state is GroupState.DEAD


def _valid() -> dict[str, Any]:
    g = group()
    g.heartbeat("m1", 0, ["t"], 0, PARTS)
    return g.to_dict()


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param({}, id="empty"),
        pytest.param({**_valid(), "v": 2}, id="version"),
        pytest.param({k: v for k, v in _valid().items() if k != "group_epoch"}, id="no-epoch"),
        pytest.param({**_valid(), "assignment_epoch": "x"}, id="epoch-not-int"),
        pytest.param({**_valid(), "members": [["m1", 1, ["t"]]]}, id="short-member"),
        pytest.param({**_valid(), "members": [5]}, id="member-not-list"),
        pytest.param({**_valid(), "members": None}, id="members-none"),
        pytest.param({**_valid(), "members": [["m1", 1, ["t"], [["t"]], "", ""]]}, id="bad-tp"),
        pytest.param({**_valid(), "partitions": {"t": "four"}}, id="count-not-int"),
    ],
)
def test_from_dict_corrupt_raises_corrupt_state(corrupt: dict[str, Any]) -> None:
    with pytest.raises(ShareGroupError) as info:
        ShareGroup.from_dict("my-group", corrupt, TIMEOUT, 10, 0)
    assert info.value.code is ErrorCode.CORRUPT_STATE
    assert "'my-group'" in str(info.value)


def test_from_dict_partitions_not_a_mapping_is_corrupt_state() -> None:
    with pytest.raises(ShareGroupError) as info:
        ShareGroup.from_dict("my-group", {**_valid(), "partitions": []}, TIMEOUT, 10, 0)
    assert info.value.code is ErrorCode.CORRUPT_STATE


# ------------------------------------------------------------------------------------------------
# Property: random sequences of joins, heartbeats, leaves, subscription changes and expiries
# ------------------------------------------------------------------------------------------------

MEMBERS = ("a", "b", "c", "d", "e")
TOPICS = ("t", "u")

ops = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from(MEMBERS), st.sets(st.sampled_from(TOPICS))),
        st.tuples(st.just("beat"), st.sampled_from(MEMBERS), st.sets(st.sampled_from(TOPICS))),
        st.tuples(st.just("leave"), st.sampled_from(MEMBERS), st.just(frozenset())),
        st.tuples(st.just("tick"), st.integers(0, 60_000), st.just(frozenset())),
        st.tuples(st.just("resize"), st.integers(1, 6), st.just(frozenset())),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_property_epochs_never_move_backwards(steps: list[tuple[Any, Any, Any]]) -> None:
    g = ShareGroup("G", session_timeout_ms=20_000, max_size=4)
    now = 0
    parts = {"t": 3, "u": 2}
    for op, arg, topics in steps:
        before = (g.group_epoch, g.assignment_epoch)
        members_before = set(g.members)
        try:
            if op == "join":
                res = g.heartbeat(arg, 0, sorted(topics), now, parts)
                assert res.member_epoch == g.group_epoch
            elif op == "beat":
                epoch = g.members[arg].member_epoch if arg in g.members else 3
                res = g.heartbeat(arg, epoch, sorted(topics), now, parts)
                assert res.member_epoch == g.group_epoch
            elif op == "leave":
                res = g.heartbeat(arg, -1, [], now, parts)
                assert arg not in g.members
                assert [m for m, _ in res.released] == ([arg] if arg in members_before else [])
            elif op == "tick":
                now += arg
                released = g.expire(now)
                assert {m for m, _ in released} == members_before - set(g.members)
            else:
                parts = {"t": arg, "u": 2}
        except ShareGroupError as exc:
            assert exc.code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.GROUP_MAX_SIZE_REACHED)
            assert (g.group_epoch, g.assignment_epoch) == before
            assert set(g.members) == members_before
        assert g.group_epoch >= before[0]
        assert g.assignment_epoch >= before[1]
        assert g.assignment_epoch >= g.group_epoch
        if set(g.members) != members_before:
            assert g.group_epoch > before[0]
        assert len(g.members) <= 4
        assert g.state is (GroupState.STABLE if g.members else GroupState.EMPTY)
        for m in g.members.values():
            assert m.member_epoch <= g.group_epoch
            assert all(tp[0] in m.subscribed_topics for tp in m.assignment)
        # Within each topic, no partition has two owners unless there are more subscribers.
        for topic, n in g.partitions.items():
            subs = [m for m in g.members.values() if topic in m.subscribed_topics]
            counts = Counter(tp for m in subs for tp in m.assignment if tp[0] == topic)
            if subs and len(subs) <= n:
                assert set(counts.values()) <= {1}
        back = ShareGroup.from_dict("G", g.to_dict(), 20_000, 4, now)
        assert back.to_dict() == g.to_dict()
