"""Known holes (offsets without a record: transaction markers, compaction) don't use up
``max_records`` (:meth:`SharePartition.mark_holes`; docs/concepts.md "Acquisition counts
records")."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    RecordState,
    SharePartition,
    SharePartitionConfig,
    ShareSnapshot,
    ShareUpdate,
    replay,
)
from queueflow.engine.key_order import consecutive
from queueflow.errors import InvalidRequestError

AV, AQ, AR = RecordState.AVAILABLE, RecordState.ACQUIRED, RecordState.ARCHIVED
CFG = SharePartitionConfig(max_in_flight_records=100, member_max_acquisition_rate=0)


def holes_of(log: list[bool], lo: int, hi: int) -> list[tuple[int, int]]:
    """The hole ranges of ``log`` (True: a record) in ``lo..hi-1``."""
    return list(consecutive(o for o in range(lo, min(hi, len(log))) if not log[o]))


def acquirable(sp: SharePartition, log: list[bool], log_end: int) -> int:
    """Records ``sp`` may hand out now: Available in flight, and records (not holes) from the
    SPEO up to the log end within the in-flight limit."""
    available = sum(r.last_offset - r.first_offset + 1 for r in sp.in_flight() if r.state is AV)
    top = min(log_end, sp.start_offset + CFG.max_in_flight_records)
    return available + sum(log[o] for o in range(sp.end_offset, top))


def check_invariants(sp: SharePartition, log: list[bool]) -> None:
    runs = list(sp.in_flight())
    expected = sp.start_offset
    for r in runs:
        assert r.first_offset == expected
        expected = r.last_offset + 1
        if r.state is AV:  # a known hole is never Available
            assert all(log[o] for o in range(r.first_offset, r.last_offset + 1)), r
    assert expected == sp.end_offset
    assert not runs or runs[0].state not in (AR, RecordState.ACKNOWLEDGED)
    assert sp.end_offset - sp.start_offset <= CFG.max_in_flight_records


@settings(max_examples=300, deadline=None)
@given(
    log=st.lists(st.booleans(), min_size=1, max_size=260),
    start=st.integers(0, 5),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["acquire", "accept", "release", "learn"]),
            st.integers(1, 40),
            st.integers(0, 260),
        ),
        max_size=40,
    ),
)
def test_acquire_counts_records_once_holes_are_known(
    log: list[bool], start: int, steps: list[tuple[str, int, int]]
) -> None:
    start = min(start, len(log))
    sp = SharePartition(CFG, start)
    base = ShareSnapshot(0, 0, 0, start, ())
    updates: list[ShareUpdate] = []
    log_end = start
    handed: dict[int, int] = {}
    learned_all = False
    for op, n, arg in steps:
        if op == "learn":  # the reader learns the holes up to some offset
            top = min(len(log), sp.start_offset + CFG.max_in_flight_records, max(arg, start))
            lo = sp.holes_read_to
            sp.mark_holes(holes_of(log, lo, top), read_to=max(top, lo))
            learned_all = sp.holes_read_to >= len(log)
        elif op == "acquire":
            log_end = max(log_end, min(len(log), arg))
            if learned_all:
                want = min(n, acquirable(sp, log, log_end))
            got = sp.acquire("m", n, log_end, 0)
            offsets = [o for a in got for o in range(a.first_offset, a.last_offset + 1)]
            for o in offsets:
                handed[o] = handed.get(o, 0) + 1
            if learned_all:
                assert len(offsets) == want, (n, got)
                assert all(log[o] for o in offsets)
        else:
            held = [(r.first_offset, r.last_offset) for r in sp.in_flight() if r.state is AQ][:1]
            kind = AcknowledgeType.ACCEPT if op == "accept" else AcknowledgeType.RELEASE
            for first, last in held:
                types = tuple(
                    kind if log[o] else AcknowledgeType.GAP for o in range(first, last + 1)
                )
                sp.acknowledge("m", [AcknowledgementBatch(first, last, types)], 0)
        update = sp.take_changes()
        if update is not None:
            updates.append(update)
        if learned_all:
            check_invariants(sp, log)
        assert replay(base, updates) == sp.snapshot()
        assert SharePartition.restore(CFG, *sp.snapshot()).snapshot() == sp.snapshot()


def test_a_hole_at_the_speo_is_entered_and_skipped() -> None:
    # Records 0..4, a transaction marker at 5, records 6..10, a marker at 11.
    sp = SharePartition(CFG, 0)
    sp.mark_holes([(5, 5), (11, 11)], read_to=12)
    got = sp.acquire("m", 10, 12, 0)
    assert [(a.first_offset, a.last_offset) for a in got] == [(0, 4), (6, 10)]
    assert sp.end_offset == 12  # the trailing marker is in flight too, Archived
    assert sp.record(5).state is AR and sp.record(11).state is AR
    sp.acknowledge("m", [AcknowledgementBatch(0, 4, (AcknowledgeType.ACCEPT,))], 0)
    sp.acknowledge("m", [AcknowledgementBatch(6, 10, (AcknowledgeType.ACCEPT,))], 0)
    assert sp.start_offset == 12  # past the Archived markers
    assert sp.take_archived() == []  # a hole is no archived record (no DLQ, no log line)


def test_available_holes_in_flight_are_archived_acquired_ones_left_alone() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m", 10, 10, 0)
    sp.acknowledge("m", [AcknowledgementBatch(0, 4, (AcknowledgeType.RELEASE,))], 0)
    assert sp.mark_holes([(3, 6)], read_to=10) == 2  # 3, 4 Available; 5, 6 held by m
    assert [sp.record(o).state for o in range(0, 8)] == [AV, AV, AV, AR, AR, AQ, AQ, AQ]
    assert sp.take_archived() == []
    got = sp.acquire("m2", 10, 10, 0)
    assert [(a.first_offset, a.last_offset) for a in got] == [(0, 2)]


def test_holes_beyond_the_in_flight_limit_wait_for_the_speo() -> None:
    sp = SharePartition(CFG, 0)
    sp.mark_holes([(0, 149), (200, 209)], read_to=300)
    # Entered as the SPSO passes them (never more than the in-flight limit at once).
    assert (sp.start_offset, sp.end_offset) == (150, 150)
    got = sp.acquire("m", 60, 300, 0)
    assert [(a.first_offset, a.last_offset) for a in got] == [(150, 199), (210, 219)]


def test_reset_forgets_the_holes() -> None:
    sp = SharePartition(CFG, 0)
    sp.mark_holes([(20, 29)], read_to=40)
    sp.reset_start_offset(10)
    assert sp.holes_read_to == 10
    got = sp.acquire("m", 30, 40, 0)
    assert [(a.first_offset, a.last_offset) for a in got] == [(10, 39)]


def test_bad_holes_are_refused() -> None:
    sp = SharePartition(CFG, 0)
    for bad in ([(5, 4)], [(-1, 2)], [(5, 6), (6, 7)], [(8, 9), (1, 2)]):
        try:
            sp.mark_holes(bad)
        except InvalidRequestError:
            continue
        raise AssertionError(bad)
    assert sp.end_offset == 0
