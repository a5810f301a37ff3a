"""Client-side acknowledgement batching (``queueflow.member.acks``)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import queueflow.member.acks as acks_module
from queueflow.member.acks import AcknowledgementBuffer, to_wire
from queueflow.structs import AcknowledgeType

ACCEPT = AcknowledgeType.ACCEPT
RELEASE = AcknowledgeType.RELEASE
REJECT = AcknowledgeType.REJECT
GAP = AcknowledgeType.GAP
TP = ("t", 0)
OTHER = ("t", 1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(acks_module.time, "monotonic", fake)
    return fake


# ------------------------------------------------------------------------------------------------
# to_wire
# ------------------------------------------------------------------------------------------------


def test_to_wire_docstring_example() -> None:
    assert to_wire({5: ACCEPT, 6: ACCEPT, 8: REJECT}) == [(5, 6, (1,)), (8, 8, (3,))]


def test_to_wire_empty() -> None:
    assert to_wire({}) == []


def test_to_wire_single_offset_zero() -> None:
    assert to_wire({0: GAP}) == [(0, 0, (0,))]


def test_to_wire_splits_on_type_change() -> None:
    outcomes = {10: ACCEPT, 11: ACCEPT, 12: RELEASE, 13: RELEASE, 14: ACCEPT}
    assert to_wire(outcomes) == [(10, 11, (1,)), (12, 13, (2,)), (14, 14, (1,))]


def test_to_wire_splits_on_gap_in_offsets() -> None:
    assert to_wire({1: ACCEPT, 2: ACCEPT, 4: ACCEPT}) == [(1, 2, (1,)), (4, 4, (1,))]


def test_to_wire_sorts_offsets() -> None:
    outcomes = {7: REJECT, 3: ACCEPT, 5: REJECT, 4: ACCEPT, 6: REJECT}
    assert to_wire(outcomes) == [(3, 4, (1,)), (5, 7, (3,))]


def test_to_wire_emits_plain_ints() -> None:
    ((first, last, kinds),) = to_wire({0: ACCEPT})
    assert type(kinds[0]) is int
    assert (first, last) == (0, 0)


def expand(ranges: list[tuple[int, int, tuple[int, ...]]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for first, last, kinds in ranges:
        for i, offset in enumerate(range(first, last + 1)):
            assert offset not in out
            out[offset] = kinds[0] if len(kinds) == 1 else kinds[i]
    return out


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 60), st.sampled_from(list(AcknowledgeType)), max_size=40))
def test_property_to_wire_is_lossless_ordered_and_maximal(
    outcomes: dict[int, AcknowledgeType],
) -> None:
    ranges = to_wire(outcomes)
    assert expand(ranges) == {o: int(k) for o, k in outcomes.items()}
    for first, last, kinds in ranges:
        assert first <= last
        assert len(kinds) == 1
    for (_, last_a, kinds_a), (first_b, _, kinds_b) in pairwise(ranges):
        assert last_a < first_b
        # Adjacent ranges are merged whenever they could be.
        assert not (last_a + 1 == first_b and kinds_a == kinds_b)


# ------------------------------------------------------------------------------------------------
# AcknowledgementBuffer
# ------------------------------------------------------------------------------------------------


def test_empty_buffer() -> None:
    buf = AcknowledgementBuffer()
    assert buf.take(TP) == []
    assert buf.pending(TP) == 0
    assert buf.age_ms(TP) == 0.0
    assert buf.partitions() == []


def test_add_and_take(clock: FakeClock) -> None:
    buf = AcknowledgementBuffer()
    buf.add(TP, 3, ACCEPT)
    buf.add(TP, 4, ACCEPT)
    buf.add(TP, 5, REJECT)
    buf.add(OTHER, 9, RELEASE)
    assert buf.pending(TP) == 3
    assert buf.pending(OTHER) == 1
    assert sorted(buf.partitions()) == [TP, OTHER]
    assert buf.take(TP) == [(3, 4, (1,)), (5, 5, (3,))]
    assert buf.pending(TP) == 0
    assert buf.age_ms(TP) == 0.0
    assert buf.partitions() == [OTHER]
    assert buf.take(TP) == []
    assert buf.take(OTHER) == [(9, 9, (2,))]
    assert buf.partitions() == []


def test_later_outcome_for_same_offset_wins() -> None:
    buf = AcknowledgementBuffer()
    buf.add(TP, 1, RELEASE)
    buf.add(TP, 1, ACCEPT)
    assert buf.pending(TP) == 1
    assert buf.take(TP) == [(1, 1, (1,))]


def test_age_is_from_oldest_pending(clock: FakeClock) -> None:
    buf = AcknowledgementBuffer()
    buf.add(TP, 1, ACCEPT)
    clock.now += 0.25
    buf.add(TP, 2, ACCEPT)
    clock.now += 0.5
    assert buf.age_ms(TP) == pytest.approx(750.0)
    assert buf.age_ms(OTHER) == 0.0
    buf.take(TP)
    assert buf.age_ms(TP) == 0.0
    buf.add(TP, 3, ACCEPT)
    clock.now += 0.01
    assert buf.age_ms(TP) == pytest.approx(10.0)


def test_restore_puts_back_taken_acknowledgements(clock: FakeClock) -> None:
    buf = AcknowledgementBuffer()
    for offset, kind in {3: ACCEPT, 4: ACCEPT, 5: REJECT, 7: GAP}.items():
        buf.add(TP, offset, kind)
    taken = buf.take(TP)
    assert buf.pending(TP) == 0
    clock.now += 1.0
    buf.restore(TP, taken)
    assert buf.pending(TP) == 4
    assert buf.partitions() == [TP]
    assert buf.age_ms(TP) == 0.0
    clock.now += 0.002
    assert buf.age_ms(TP) == pytest.approx(2.0)
    assert buf.take(TP) == taken


def test_restore_newer_outcomes_win() -> None:
    buf = AcknowledgementBuffer()
    buf.add(TP, 1, RELEASE)
    buf.add(TP, 2, RELEASE)
    taken = buf.take(TP)
    buf.add(TP, 2, ACCEPT)  # recorded while the failed request was in flight
    buf.add(TP, 3, REJECT)
    buf.restore(TP, taken)
    # The failed request's acknowledgements go again alone (offset 2 has a newer outcome) ...
    assert buf.take(TP) == [(1, 1, (2,))]
    # ... so that if the leader had applied them, its refusal can't take the newer ones down.
    assert buf.take(TP) == [(2, 2, (1,)), (3, 3, (3,))]
    assert buf.take(TP) == []


def test_restore_per_offset_types() -> None:
    buf = AcknowledgementBuffer()
    buf.restore(TP, [(10, 12, (1, 2, 3)), (20, 21, (0,))])
    assert buf.pending(TP) == 5
    assert buf.take(TP) == [
        (10, 10, (1,)),
        (11, 11, (2,)),
        (12, 12, (3,)),
        (20, 21, (0,)),
    ]


def test_restore_nothing_leaves_buffer_empty() -> None:
    buf = AcknowledgementBuffer()
    buf.restore(TP, [])
    assert buf.pending(TP) == 0
    assert buf.partitions() == []
    assert buf.age_ms(TP) == 0.0


def test_restore_rejects_unknown_type() -> None:
    buf = AcknowledgementBuffer()
    with pytest.raises(ValueError):
        buf.restore(TP, [(0, 0, (9,))])


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.integers(0, 30), st.sampled_from(list(AcknowledgeType)), max_size=20),
    st.dictionaries(st.integers(0, 30), st.sampled_from(list(AcknowledgeType)), max_size=20),
)
def test_property_take_restore_merges_with_newer_outcomes(
    old: dict[int, AcknowledgeType], new: dict[int, AcknowledgeType]
) -> None:
    buf = AcknowledgementBuffer()
    for offset, kind in old.items():
        buf.add(TP, offset, kind)
    taken = buf.take(TP)
    for offset, kind in new.items():
        buf.add(TP, offset, kind)
    buf.restore(TP, taken)
    assert buf.pending(TP) == len(old.keys() | new.keys())
    restored = {o: int(k) for o, k in old.items() if o not in new}
    if restored:  # the restored batch alone: only offsets without a newer outcome
        assert expand(buf.take(TP)) == restored
    assert expand(buf.take(TP)) == {o: int(k) for o, k in new.items()}
    assert buf.take(TP) == [] and buf.pending(TP) == 0 and buf.partitions() == []


# ------------------------------------------------------------------------------------------------
# refused: a request's acknowledgements refused as a whole
# ------------------------------------------------------------------------------------------------


def test_refused_drops_the_stale_offsets_and_sends_the_rest_again_first() -> None:
    buf = AcknowledgementBuffer()
    for offset in range(10, 20):
        buf.add(TP, offset, ACCEPT)
    taken = buf.take(TP)
    buf.add(TP, 30, REJECT)  # newer, not part of the refused request
    assert buf.refused(TP, taken, stale=[(12, 13), (19, 19)]) == [12, 13, 19]
    assert buf.take(TP) == [(10, 11, (1,)), (14, 18, (1,))]  # alone, ahead of newer outcomes
    assert buf.take(TP) == [(30, 30, (3,))]
    assert buf.take(TP) == []


def test_refused_without_stale_offsets_splits_in_halves_until_one_offset_is_dropped() -> None:
    buf = AcknowledgementBuffer()
    for offset in range(4):
        buf.add(TP, offset, ACCEPT)
    assert buf.refused(TP, buf.take(TP)) == []
    assert buf.take(TP) == [(0, 1, (1,))]
    assert buf.refused(TP, [(0, 1, (1,))]) == []
    assert buf.take(TP) == [(0, 0, (1,))]
    assert buf.refused(TP, [(0, 0, (1,))]) == [0]  # refused alone: dropped
    assert buf.take(TP) == [(1, 1, (1,))]
    assert buf.take(TP) == [(2, 3, (1,))]
    assert buf.take(TP) == []


def test_refused_newer_outcomes_win() -> None:
    buf = AcknowledgementBuffer()
    buf.add(TP, 1, RELEASE)
    buf.add(TP, 2, RELEASE)
    buf.add(TP, 3, RELEASE)
    taken = buf.take(TP)
    buf.add(TP, 2, ACCEPT)  # redelivered to this member and handled again meanwhile
    assert buf.refused(TP, taken, stale=[(1, 1)]) == [1]
    assert buf.take(TP) == [(3, 3, (2,))]
    assert buf.take(TP) == [(2, 2, (1,))]


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.integers(0, 60), st.sampled_from(list(AcknowledgeType)), min_size=1),
    st.sets(st.integers(0, 60)),
    st.booleans(),
)
def test_property_refusals_lose_only_the_stale_outcomes(
    outcomes: dict[int, AcknowledgeType], stale: set[int], leader_names_them: bool
) -> None:
    """Against a leader that refuses any request naming a stale offset (atomically), every
    valid outcome is applied exactly once, every stale one is dropped, within 2n - 1 requests."""
    buf = AcknowledgementBuffer()
    for offset, kind in outcomes.items():
        buf.add(TP, offset, kind)
    applied: dict[int, int] = {}
    dropped: list[int] = []
    requests = 0
    while ranges := buf.take(TP):
        requests += 1
        offered = expand(ranges)
        bad = sorted(stale & offered.keys())
        if not bad:
            assert not offered.keys() & applied.keys()
            applied.update(offered)
            continue
        named = [(o, o) for o in bad] if leader_names_them else []
        dropped += buf.refused(TP, ranges, named)
    assert applied == {o: int(k) for o, k in outcomes.items() if o not in stale}
    assert sorted(dropped) == sorted(stale & outcomes.keys())
    assert requests <= 2 * len(outcomes) - 1
    if leader_names_them:
        assert requests <= 2
