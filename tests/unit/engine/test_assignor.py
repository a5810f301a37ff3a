"""The ``simple`` assignor (``queueflow.engine.assignors.simple.assign``): balance, sharing,
stickiness."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine.assignors.simple import assign
from queueflow.structs import TopicPartition


def members_of(n: int, topics: Sequence[str] = ("t",)) -> dict[str, list[str]]:
    return {f"m{i:02d}": list(topics) for i in range(n)}


def sizes(result: Mapping[str, list[TopicPartition]]) -> list[int]:
    return [len(tps) for tps in result.values()]


def check_topic_rules(
    result: Mapping[str, list[TopicPartition]], subscribers: Sequence[str], topic: str, n_parts: int
) -> None:
    """The KIP-932 SimpleAssignor rules for one topic and its subscribers."""
    per_member = {m: [tp for tp in result[m] if tp[0] == topic] for m in subscribers}
    counts = Counter(tp for tps in per_member.values() for tp in tps)
    all_tps = {(topic, p) for p in range(n_parts)}
    assert set(counts) <= all_tps
    n_members = len(subscribers)
    if n_members == 0 or n_parts == 0:
        assert not counts
        return
    if n_members <= n_parts:
        # Each partition to exactly one member; sizes differ by at most one.
        assert set(counts) == all_tps
        assert set(counts.values()) == {1}
        lens = [len(v) for v in per_member.values()]
        assert max(lens) - min(lens) <= 1
    else:
        # Every member exactly one partition; each shared by floor or ceil of M/P members.
        assert all(len(v) == 1 for v in per_member.values())
        assert set(counts) == all_tps
        lo, hi = n_members // n_parts, -(-n_members // n_parts)
        assert all(lo <= c <= hi for c in counts.values())


# ------------------------------------------------------------------------------------------------
# Shape of the result
# ------------------------------------------------------------------------------------------------


def test_no_members_gives_empty_result() -> None:
    assert assign({}, {"t": 3}) == {}


def test_every_member_appears_and_lists_are_sorted() -> None:
    result = assign(members_of(3), {"t": 7})
    assert set(result) == {"m00", "m01", "m02"}
    for tps in result.values():
        assert tps == sorted(tps)


def test_single_member_gets_everything() -> None:
    assert assign({"a": ["t"]}, {"t": 4}) == {"a": [("t", 0), ("t", 1), ("t", 2), ("t", 3)]}


def test_unknown_topic_gives_empty_assignment() -> None:
    result = assign({"a": ["missing"], "b": ["t"]}, {"t": 2})
    assert result == {"a": [], "b": [("t", 0), ("t", 1)]}


def test_member_without_subscriptions_gets_nothing() -> None:
    result = assign({"a": [], "b": ["t"]}, {"t": 1})
    assert result == {"a": [], "b": [("t", 0)]}


def test_topic_with_zero_partitions_assigns_nothing() -> None:
    assert assign({"a": ["t"], "b": ["t"]}, {"t": 0}) == {"a": [], "b": []}


# ------------------------------------------------------------------------------------------------
# Balance
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_members", "n_parts"), [(1, 1), (2, 2), (3, 7), (4, 8), (3, 10), (5, 6), (7, 100)]
)
def test_members_at_most_partitions_each_partition_once(n_members: int, n_parts: int) -> None:
    members = members_of(n_members)
    result = assign(members, {"t": n_parts})
    check_topic_rules(result, list(members), "t", n_parts)
    assert sum(sizes(result)) == n_parts


def test_three_members_seven_partitions_sizes() -> None:
    assert sorted(sizes(assign(members_of(3), {"t": 7}))) == [2, 2, 3]


@pytest.mark.parametrize(("n_members", "n_parts"), [(2, 1), (3, 2), (5, 2), (7, 3), (10, 4)])
def test_more_members_than_partitions_shares_partitions(n_members: int, n_parts: int) -> None:
    members = members_of(n_members)
    result = assign(members, {"t": n_parts})
    check_topic_rules(result, list(members), "t", n_parts)


def test_five_members_two_partitions_share_three_and_two() -> None:
    result = assign(members_of(5), {"t": 2})
    assert all(len(tps) == 1 for tps in result.values())
    counts = Counter(tps[0] for tps in result.values())
    assert sorted(counts.values()) == [2, 3]


# ------------------------------------------------------------------------------------------------
# Stickiness
# ------------------------------------------------------------------------------------------------


def test_unchanged_membership_keeps_assignment() -> None:
    members = members_of(3)
    first = assign(members, {"t": 8})
    assert assign(members, {"t": 8}, first) == first


def test_previous_assignment_is_kept_when_balanced() -> None:
    previous = {"a": [("t", 3), ("t", 4)], "b": [("t", 0), ("t", 1)], "c": [("t", 2), ("t", 5)]}
    members = {"a": ["t"], "b": ["t"], "c": ["t"]}
    assert assign(members, {"t": 6}, previous) == {m: sorted(v) for m, v in previous.items()}


def test_leaving_member_partitions_are_spread_and_others_keep_theirs() -> None:
    previous = {"a": [("t", 0), ("t", 1)], "b": [("t", 2), ("t", 3)], "c": [("t", 4), ("t", 5)]}
    result = assign({"a": ["t"], "b": ["t"]}, {"t": 6}, previous)
    assert set(previous["a"]) <= set(result["a"])
    assert set(previous["b"]) <= set(result["b"])
    assert sorted(sizes(result)) == [3, 3]
    check_topic_rules(result, ["a", "b"], "t", 6)


def test_joining_member_takes_only_what_balance_requires() -> None:
    previous = {"a": [("t", 0), ("t", 1), ("t", 2)], "b": [("t", 3), ("t", 4), ("t", 5)]}
    result = assign({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 6}, previous)
    assert sorted(sizes(result)) == [2, 2, 2]
    assert set(result["a"]) <= set(previous["a"])
    assert set(result["b"]) <= set(previous["b"])
    moved = sum(1 for m in ("a", "b") for tp in previous[m] if tp not in result[m])
    assert moved == 2


def test_stickiness_with_shared_partitions() -> None:
    previous = {"a": [("t", 0)], "b": [("t", 1)], "c": [("t", 0)], "d": [("t", 1)]}
    members = {m: ["t"] for m in "abcde"}
    result = assign(members, {"t": 2}, previous)
    for m, tps in previous.items():
        assert result[m] == tps
    check_topic_rules(result, list(members), "t", 2)


def test_stickiness_gives_way_to_balance_when_sharing() -> None:
    previous = {"a": [("t", 0)], "b": [("t", 0)], "c": [("t", 0)]}
    result = assign({m: ["t"] for m in "abc"}, {"t": 2}, previous)
    check_topic_rules(result, ["a", "b", "c"], "t", 2)
    assert sum(1 for m in "abc" if result[m] == [("t", 0)]) == 2


def test_previous_partitions_beyond_partition_count_are_ignored() -> None:
    previous = {"a": [("t", 5), ("t", 0)], "b": [("other", 0)]}
    result = assign({"a": ["t"], "b": ["t"]}, {"t": 2}, previous)
    assert result["a"] == [("t", 0)]
    assert result["b"] == [("t", 1)]


def test_stickiness_when_new_member_sorts_first() -> None:
    # "a" owns t-0 and t-1; "0" joins (3 partitions, 2 members -> sizes 2 and 1). The balanced
    # assignment {"a": [t-0, t-1], "0": [t-2]} keeps all of a's partitions.
    previous = {"a": [("t", 0), ("t", 1)]}
    result = assign({"0": ["t"], "a": ["t"]}, {"t": 3}, previous)
    assert result == {"a": [("t", 0), ("t", 1)], "0": [("t", 2)]}


# ------------------------------------------------------------------------------------------------
# Multiple topics
# ------------------------------------------------------------------------------------------------


def test_multiple_topics_with_different_subscriptions() -> None:
    members = {"a": ["x", "y"], "b": ["x"], "c": ["y"], "d": ["z"]}
    result = assign(members, {"x": 3, "y": 2})
    assert result["d"] == []
    assert all(tp[0] == "x" for tp in result["b"])
    assert all(tp[0] == "y" for tp in result["c"])
    check_topic_rules(result, ["a", "b"], "x", 3)
    check_topic_rules(result, ["a", "c"], "y", 2)


def test_multiple_topics_previous_of_each_topic_is_kept() -> None:
    members = {"a": ["x", "y"], "b": ["x", "y"]}
    first = assign(members, {"x": 4, "y": 2})
    assert assign(members, {"x": 4, "y": 2}, first) == first


def test_balance_over_all_topics_with_homogeneous_subscriptions() -> None:
    result = assign({"a": ["t1", "t2"], "b": ["t1", "t2"]}, {"t1": 3, "t2": 3})
    assert max(sizes(result)) - min(sizes(result)) <= 1


# ------------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, list[str]], int, dict[str, list[TopicPartition]]]:
    n_members = draw(st.integers(1, 12))
    n_parts = draw(st.integers(1, 12))
    names = [f"m{i:02d}" for i in range(n_members)]
    members = {m: ["t"] for m in names}
    previous = draw(
        st.dictionaries(
            st.sampled_from([*names, "gone"]),
            st.lists(st.tuples(st.just("t"), st.integers(0, 14)), max_size=4),
        )
    )
    return members, n_parts, previous


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_property_balance_rules(
    scenario: tuple[dict[str, list[str]], int, dict[str, list[TopicPartition]]],
) -> None:
    members, n_parts, previous = scenario
    result = assign(members, {"t": n_parts}, previous)
    assert set(result) == set(members)
    check_topic_rules(result, list(members), "t", n_parts)
    assert max(sizes(result)) - min(sizes(result)) <= 1
    # An assignment that is already balanced is a fixed point (full stickiness).
    assert assign(members, {"t": n_parts}, result) == result


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10), st.integers(1, 10), st.integers(1, 10))
def test_property_membership_change_keeps_rules(before: int, after: int, n_parts: int) -> None:
    previous = assign(members_of(before), {"t": n_parts})
    members = members_of(after)
    result = assign(members, {"t": n_parts}, previous)
    check_topic_rules(result, list(members), "t", n_parts)
    if after <= n_parts and before <= n_parts:
        # Members join and leave at the end of the sort order here, so every surviving member
        # keeps as many of its previous partitions as its new size allows.
        for m in set(members) & set(previous):
            kept = set(result[m]) & set(previous[m])
            assert len(kept) == min(len(previous[m]), len(result[m]))
