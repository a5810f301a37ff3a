"""Pluggable share-group assignors (``queueflow.engine.assignors``): the properties every
built-in assignor keeps, what ``lag`` and ``rack`` do, the registry and the choice of one."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine.assignors import (
    AssignmentSpec,
    LagAwareAssignor,
    MemberSpec,
    RackAwareAssignor,
    SimpleAssignor,
    get_assignor,
    parse_names,
    register_assignor,
    registered_assignors,
    select_assignor,
)
from queueflow.engine.assignors.base import _REGISTRY, check_known
from queueflow.engine.assignors.lag import lag_quotas
from queueflow.engine.group import ShareGroup
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.protocol.group_codec import decode_group, encode_group
from queueflow.structs import TopicPartition as TP

BUILTINS = [SimpleAssignor(), LagAwareAssignor(), RackAwareAssignor()]
TOPICS = ("a", "b", "c")
RACKS = ("", "r1", "r2", "r3")


@st.composite
def specs(draw: st.DrawFn) -> AssignmentSpec:
    """Members subscribing to some of three topics (one the cluster may not know), with racks
    and previous assignments (possibly stale: unknown partitions, other topics); lag and
    partition racks for some share-partitions."""
    partitions = draw(
        st.dictionaries(st.sampled_from(TOPICS[:2]), st.integers(0, 6), min_size=0, max_size=2)
    )
    all_tps = [TP(t, p) for t in TOPICS for p in range(8)]
    n = draw(st.integers(0, 9))
    members = {}
    for i in range(n):
        subs = draw(st.lists(st.sampled_from(TOPICS), unique=True, max_size=3))
        previous = draw(st.lists(st.sampled_from(all_tps), unique=True, max_size=4))
        members[f"m{i}"] = MemberSpec(
            tuple(sorted(subs)), draw(st.sampled_from(RACKS)), tuple(previous)
        )
    known = [TP(t, p) for t, count in partitions.items() for p in range(count)]
    lag = draw(st.dictionaries(st.sampled_from(known), st.integers(0, 10_000))) if known else {}
    racks = (
        draw(st.dictionaries(st.sampled_from(known), st.sampled_from(RACKS[1:]))) if known else {}
    )
    return AssignmentSpec(members, partitions, lag, racks)


def check_rules(spec: AssignmentSpec, result: Mapping[str, list[TP]], exact_quotas: bool) -> None:
    """What every assignor must give (and the SimpleAssignor's balance bounds)."""
    assert set(result) == set(spec.members)
    for m, tps in result.items():
        assert tps == sorted(tps) and len(set(tps)) == len(tps)
        for tp in tps:
            assert tp.topic in spec.members[m].subscribed_topics
            assert 0 <= tp.partition < spec.partitions[tp.topic]
    for topic, count in spec.partitions.items():
        subscribers = [m for m, s in spec.members.items() if topic in s.subscribed_topics]
        per_member = {m: [tp for tp in result[m] if tp.topic == topic] for m in subscribers}
        counts = Counter(tp for tps in per_member.values() for tp in tps)
        if not subscribers or not count:
            assert not counts
            continue
        # Every share-partition of a subscribed topic has at least one member.
        assert set(counts) == {TP(topic, p) for p in range(count)}
        if len(subscribers) <= count:
            assert set(counts.values()) == {1}
            sizes = [len(v) for v in per_member.values()]
            assert max(sizes) - min(sizes) <= 1
        else:
            assert all(len(v) == 1 for v in per_member.values())
            if exact_quotas:
                lo, hi = len(subscribers) // count, -(-len(subscribers) // count)
                assert all(lo <= c <= hi for c in counts.values())


@pytest.mark.parametrize("assignor", BUILTINS, ids=lambda a: a.name)
@settings(max_examples=120, deadline=None)
@given(spec=specs(), seed=st.integers(0, 2**16))
def test_rules_determinism_and_stickiness(
    assignor: SimpleAssignor, spec: AssignmentSpec, seed: int
) -> None:
    result = assignor.assign(spec)
    check_rules(spec, result, exact_quotas=assignor.name != "lag")
    # Deterministic, whatever the order of the members mapping.
    names = list(spec.members)
    random.Random(seed).shuffle(names)
    shuffled = AssignmentSpec(
        {m: spec.members[m] for m in names}, spec.partitions, spec.lag, spec.partition_racks
    )
    assert assignor.assign(shuffled) == result
    # Sticky: with nothing changed but the previous assignment, nothing moves.
    again = AssignmentSpec(
        {
            m: MemberSpec(s.subscribed_topics, s.rack_id, tuple(result[m]))
            for m, s in spec.members.items()
        },
        spec.partitions,
        spec.lag,
        spec.partition_racks,
    )
    if assignor.name != "lag" or not spec.lag:
        assert assignor.assign(again) == result


@settings(max_examples=80, deadline=None)
@given(spec=specs())
def test_without_lag_and_racks_every_assignor_gives_the_simple_sizes(spec: AssignmentSpec) -> None:
    plain = AssignmentSpec(
        {m: MemberSpec(s.subscribed_topics) for m, s in spec.members.items()}, spec.partitions
    )
    expected = SimpleAssignor().assign(plain)

    def shape(result: Mapping[str, list[TP]]) -> Counter[TP]:
        return Counter(tp for tps in result.values() for tp in tps)

    for assignor in BUILTINS[1:]:
        got = assignor.assign(plain)
        assert sorted(len(v) for v in got.values()) == sorted(len(v) for v in expected.values())
        assert sorted(shape(got).values()) == sorted(shape(expected).values())


# ------------------------------------------------------------------------------------------------
# lag
# ------------------------------------------------------------------------------------------------


def members(n: int, rack: str = "", topic: str = "t") -> dict[str, MemberSpec]:
    return {f"m{i}": MemberSpec((topic,), rack) for i in range(n)}


def per_partition(result: Mapping[str, list[TP]]) -> dict[int, int]:
    counts = Counter(tp.partition for tps in result.values() for tp in tps)
    return dict(sorted(counts.items()))


def test_lag_puts_the_extra_members_where_the_lag_is() -> None:
    lag = {TP("t", 0): 300, TP("t", 1): 100, TP("t", 2): 0}
    result = LagAwareAssignor().assign(AssignmentSpec(members(5), {"t": 3}, lag))
    assert per_partition(result) == {0: 3, 1: 1, 2: 1}
    # SimpleAssignor splits them evenly whatever the lag.
    assert per_partition(SimpleAssignor().assign(AssignmentSpec(members(5), {"t": 3}, lag))) == {
        0: 2,
        1: 2,
        2: 1,
    }


def test_lag_quotas_follow_lag_per_member_and_sum_to_the_members() -> None:
    tps = [TP("t", p) for p in range(4)]
    assert lag_quotas(tps, 10, {tps[0]: 900, tps[3]: 300}) == {
        tps[0]: 6,
        tps[1]: 1,
        tps[2]: 1,
        tps[3]: 2,
    }  # 900:300 is 3:1, and the two share-partitions without lag keep one each
    assert lag_quotas(tps, 6, {}) == {tps[0]: 2, tps[1]: 2, tps[2]: 1, tps[3]: 1}
    assert lag_quotas(tps, 4, {tps[0]: 10**9}) == dict.fromkeys(tps, 1)


def test_lag_balances_lag_between_members_when_partitions_outnumber_them() -> None:
    lag = {TP("t", 0): 1000, TP("t", 1): 10, TP("t", 2): 10, TP("t", 3): 900}
    result = LagAwareAssignor().assign(AssignmentSpec(members(2), {"t": 4}, lag))
    loads = sorted(sum(lag[tp] for tp in tps) for tps in result.values())
    assert loads == [910, 1010]  # not 1900 + 20: the two lagging share-partitions are split
    assert sorted(len(v) for v in result.values()) == [2, 2]


# ------------------------------------------------------------------------------------------------
# rack
# ------------------------------------------------------------------------------------------------


def test_rack_gives_members_the_partitions_led_in_their_rack() -> None:
    spec = AssignmentSpec(
        {"a": MemberSpec(("t",), "r1"), "b": MemberSpec(("t",), "r2")},
        {"t": 4},
        partition_racks={TP("t", 0): "r2", TP("t", 1): "r1", TP("t", 2): "r2", TP("t", 3): "r1"},
    )
    result = RackAwareAssignor().assign(spec)
    assert result == {"a": [TP("t", 1), TP("t", 3)], "b": [TP("t", 0), TP("t", 2)]}
    # Stickiness yields to the rack: previously a held 0 and 2.
    moved = AssignmentSpec(
        {"a": MemberSpec(("t",), "r1", (TP("t", 0), TP("t", 2))), "b": MemberSpec(("t",), "r2")},
        spec.partitions,
        partition_racks=spec.partition_racks,
    )
    assert RackAwareAssignor().assign(moved) == result


def test_rack_keeps_balance_before_locality() -> None:
    spec = AssignmentSpec(
        {"a": MemberSpec(("t",), "r1"), "b": MemberSpec(("t",), "r2")},
        {"t": 4},
        partition_racks=dict.fromkeys((TP("t", p) for p in range(4)), "r1"),
    )
    result = RackAwareAssignor().assign(spec)
    assert sorted(len(v) for v in result.values()) == [2, 2]


def test_rack_spreads_each_racks_members_over_the_partitions_without_partition_racks() -> None:
    # Before: both r1 members on partition 0, both r2 members on partition 1.
    specs_ = {f"x{i}": MemberSpec(("t",), "r1", (TP("t", 0),)) for i in range(2)}
    specs_ |= {f"y{i}": MemberSpec(("t",), "r2", (TP("t", 1),)) for i in range(2)}
    result = RackAwareAssignor().assign(AssignmentSpec(specs_, {"t": 2}))
    for p in (0, 1):  # each share-partition has a member in each rack: one rack may go down
        racks = {specs_[m].rack_id for m, tps in result.items() if TP("t", p) in tps}
        assert racks == {"r1", "r2"}
    # SimpleAssignor keeps them where they were (sticky), both r1 members on one partition.
    simple = SimpleAssignor().assign(AssignmentSpec(specs_, {"t": 2}))
    assert {specs_[m].rack_id for m, tps in simple.items() if TP("t", 0) in tps} == {"r1"}


def test_rack_prefers_same_rack_partitions_when_members_outnumber_them() -> None:
    specs_ = {f"m{i}": MemberSpec(("t",), "r1" if i < 3 else "r2") for i in range(4)}
    racks = {TP("t", 0): "r2", TP("t", 1): "r1"}
    result = RackAwareAssignor().assign(AssignmentSpec(specs_, {"t": 2}, partition_racks=racks))
    # Two members each (balance); r1 has three members, so one of them reads across racks.
    assert per_partition(result) == {0: 2, 1: 2}
    assert result["m3"] == [TP("t", 0)]


# ------------------------------------------------------------------------------------------------
# Registry and selection
# ------------------------------------------------------------------------------------------------


class _EveryoneEverything:
    """A custom assignor: every member gets every share-partition of its topics."""

    name = "everything"

    def assign(self, spec: AssignmentSpec) -> dict[str, list[TP]]:
        return {
            m: sorted(
                TP(t, p) for t in s.subscribed_topics for p in range(spec.partitions.get(t, 0))
            )
            for m, s in spec.members.items()
        }


@pytest.fixture
def custom() -> object:
    assignor = _EveryoneEverything()
    register_assignor(assignor)
    yield assignor
    _REGISTRY.pop(assignor.name, None)


def test_builtins_are_registered() -> None:
    assert {"simple", "lag", "rack"} <= set(registered_assignors())
    assert isinstance(get_assignor("lag"), LagAwareAssignor)
    with pytest.raises(ConfigurationError, match=r"unknown share-group assignor 'nope'.*lag"):
        get_assignor("nope")


def test_register_refuses_bad_and_taken_names(custom: object) -> None:
    class Bad:
        name = "has space"

        def assign(self, spec: AssignmentSpec) -> dict[str, list[TP]]:
            return {}

    with pytest.raises(ConfigurationError, match="not valid"):
        register_assignor(Bad())
    before = registered_assignors()
    with pytest.raises(ConfigurationError, match="already registered"):
        register_assignor(_EveryoneEverything())
    assert registered_assignors() == before
    register_assignor(custom, replace=False)  # the same object again is fine


def test_a_registered_assignor_is_used_by_a_group(custom: object) -> None:
    group = ShareGroup("G", 45_000, 10, assignors=("everything",))
    group.heartbeat("a", 0, ["t"], 0, {"t": 3}, assignors=["everything"])
    group.heartbeat("b", 0, ["t"], 0, {"t": 3}, assignors=["everything"])
    assert group.assignor == "everything"
    assert (
        group.members["a"].assignment
        == group.members["b"].assignment
        == [
            TP("t", 0),
            TP("t", 1),
            TP("t", 2),
        ]
    )


def test_select_takes_the_first_preference_every_member_supports() -> None:
    new, old = ["simple", "lag"], []
    assert select_assignor(["lag", "simple"], {"a": new, "b": new}).name == "lag"
    picked = select_assignor(["lag", "simple"], {"a": new, "b": old})
    assert picked.name == "simple"
    assert "'lag' not supported by 1 member(s): b" in picked.reason
    # Order is the preference; simple is supported by everyone, advertised or not.
    assert select_assignor(["rack", "lag"], {"a": ["lag"], "b": ["lag", "rack"]}).name == "lag"
    assert select_assignor(["rack"], {"a": ["lag"]}).name == "simple"
    assert select_assignor([], {"a": new}).name == "simple"
    assert select_assignor(["lag"], {}).name == "lag"
    unregistered = select_assignor(["gone", "lag"], {"a": ["gone", "lag"]})
    assert unregistered.name == "lag" and "'gone' is not registered" in unregistered.reason


def test_parse_names_and_check_known() -> None:
    assert parse_names(" lag , simple", "s") == ("lag", "simple")
    assert parse_names("", "s") == ()
    with pytest.raises(ConfigurationError, match="twice"):
        parse_names("lag,lag", "s")
    with pytest.raises(ConfigurationError, match="'' is not an assignor name"):
        parse_names("lag,,simple", "s")
    with pytest.raises(ConfigurationError, match=r"group\.share\.assignors: unknown.*'fast'"):
        check_known(["lag", "fast"], "group.share.assignors")


# ------------------------------------------------------------------------------------------------
# The group: rolling upgrade of its members, and what is persisted
# ------------------------------------------------------------------------------------------------


def test_group_switches_once_the_last_old_member_is_gone() -> None:
    group = ShareGroup("G", 45_000, 10, assignors=("lag", "simple"))
    group.heartbeat("old-1", 0, ["t"], 0, {"t": 4})
    group.heartbeat("old-2", 0, ["t"], 0, {"t": 4})
    assert group.assignor == "simple"
    group.heartbeat("new-1", 0, ["t"], 0, {"t": 4}, assignors=["simple", "lag"])
    group.leave("old-1")
    assert group.assignor == "simple"  # old-2 still supports only simple
    group.leave("old-2")
    assert group.assignor == "lag"
    assert group.selection is not None and group.selection.reason.startswith("most preferred")
    # A member that upgrades in place (same id, now advertising) also counts.
    group2 = ShareGroup("G2", 45_000, 10, assignors=("lag",))
    group2.heartbeat("m", 0, ["t"], 0, {"t": 2})
    assert group2.assignor == "simple"
    epoch = group2.group_epoch
    group2.heartbeat("m", epoch, ["t"], 1, {"t": 2}, assignors=["lag"])
    assert (group2.assignor, group2.group_epoch) == ("lag", epoch + 1)


def test_group_uses_the_lag_it_is_given() -> None:
    group = ShareGroup("G", 45_000, 10, assignors=("lag",))
    group.lag = {TP("t", 1): 500}
    for i in range(4):
        group.heartbeat(f"m{i}", 0, ["t"], 0, {"t": 2}, assignors=["lag"])
    counts = Counter(tp.partition for m in group.members.values() for tp in m.assignment)
    assert counts == {1: 3, 0: 1}


def test_codec_keeps_the_assignor_and_what_members_advertise() -> None:
    group = ShareGroup("G", 45_000, 10, assignors=("rack", "simple"))
    group.heartbeat("a", 0, ["t"], 0, {"t": 2}, assignors=["simple", "rack"], rack_id="r1")
    group.heartbeat("b", 0, ["t"], 0, {"t": 2})
    group.leave("b")
    assert group.assignor == "rack"
    back = decode_group("G", encode_group(group), 45_000, 10, 5)
    assert back.assignor == "rack"
    assert (back.members["a"].assignors, back.members["a"].rack_id) == (("simple", "rack"), "r1")
    assert back.to_dict() == group.to_dict()
    legacy = ShareGroup.from_dict("G", group.to_dict(), 45_000, 10, 5)
    assert legacy.assignor == "rack" and legacy.members["a"].rack_id == "r1"


def test_groups_stored_before_assignors_decode_as_simple() -> None:
    stored = (
        b'{"v":1,"group_epoch":3,"assignment_epoch":3,"dead":false,"partitions":{"t":2},'
        b'"members":[["m1",3,["t"],[["t",0],["t",1]],"c","h"]]}'
    )
    group = decode_group("G", stored, 45_000, 10, 0)
    assert group.assignor == "simple"
    assert group.members["m1"].assignors == ()
    assert encode_group(group) == stored  # unchanged layout while nothing new is set


@pytest.mark.parametrize(
    ("assignors", "rack"),
    [(["x"] * 33, ""), ([""], ""), (["a" * 65], ""), (["simple"], "r" * 256)],
    ids=["too-many", "empty-name", "long-name", "long-rack"],
)
def test_absurd_advertisements_are_refused_and_change_nothing(
    assignors: list[str], rack: str
) -> None:
    group = ShareGroup("G", 45_000, 10, assignors=("lag", "simple"))
    group.heartbeat("a", 0, ["t"], 0, {"t": 2}, assignors=["lag"])
    before = group.to_dict()
    with pytest.raises(ShareGroupError, match="at most") as caught:
        group.heartbeat(
            "a", group.group_epoch, ["t"], 1, {"t": 2}, assignors=assignors, rack_id=rack
        )
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(ShareGroupError):
        group.heartbeat("b", 0, ["t"], 1, {"t": 2}, assignors=assignors, rack_id=rack)
    assert group.to_dict() == before


def test_refresh_follows_lag_and_leaves_a_stable_simple_group_alone() -> None:
    group = ShareGroup("G", 45_000, 10, assignors=("lag",))
    for i in range(4):
        group.heartbeat(f"m{i}", 0, ["t"], 0, {"t": 2}, assignors=["lag"])
    epoch = group.group_epoch
    assert not group.refresh()  # nothing changed: no rebalance
    group.lag = {TP("t", 0): 900, TP("t", 1): 10}
    assert group.refresh() and group.group_epoch == epoch + 1
    counts = Counter(tp.partition for m in group.members.values() for tp in m.assignment)
    assert counts == {0: 3, 1: 1}
    assert all(m.member_epoch == group.group_epoch for m in group.members.values())
    assert not group.refresh()  # same lag: stays
    simple = ShareGroup("S", 45_000, 10)
    for i in range(3):
        simple.heartbeat(f"m{i}", 0, ["t"], 0, {"t": 2})
    simple.lag = {TP("t", 0): 900}
    assert not simple.refresh()
    assert not ShareGroup("E", 45_000, 10).refresh()  # no members


def test_refresh_applies_a_changed_preference() -> None:
    group = ShareGroup("G", 45_000, 10)
    group.heartbeat("a", 0, ["t"], 0, {"t": 2}, assignors=["simple", "lag"])
    assert group.assignor == "simple"
    group.assignor_preference = ("lag", "simple")  # a coordinator restarted with a new list
    assert group.refresh() and group.assignor == "lag"
    assert not group.refresh()
