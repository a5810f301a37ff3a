"""The member abuse limits of the share-partition engine: the RENEW cap
(``share.record.lock.max.renewal.ms``), per-member in-flight and acquisition-rate limits, and
the fence of a member that RELEASEs without handling (``share.member.release.abuse.*``)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    MemberFence,
    RecordState,
    SharePartition,
    SharePartitionConfig,
)
from queueflow.errors import ErrorCode, InvalidRecordStateError, ShareGroupError

A = AcknowledgeType
AV = RecordState.AVAILABLE
AQ = RecordState.ACQUIRED
AR = RecordState.ARCHIVED
LOCK = 30_000


def batch(first: int, last: int, *types: AcknowledgeType) -> AcknowledgementBatch:
    return AcknowledgementBatch(first, last, tuple(types))


def cfg(**overrides: int) -> SharePartitionConfig:
    return SharePartitionConfig(record_lock_duration_ms=LOCK, **overrides)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# RENEW cap (KIP-1222 renewals bounded by share.record.lock.max.renewal.ms)
# ------------------------------------------------------------------------------------------


def test_renew_extends_the_lock_until_the_cap_then_is_refused() -> None:
    sp = SharePartition(cfg(max_renewal_ms=100_000), 0)
    sp.acquire("a", 10, 10, 0)
    now = 0
    while True:
        now += 20_000
        try:
            sp.acknowledge("a", [batch(0, 9, A.RENEW)], now)
        except InvalidRecordStateError as exc:
            assert exc.code is ErrorCode.INVALID_RECORD_STATE
            assert "share.record.lock.max.renewal.ms=100000" in exc.message
            assert "0..9" in exc.message
            break
        assert now <= 100_000
    # The lock was never extended past acquisition + cap, and runs out there as usual.
    assert sp.record(0).lock_deadline_ms == 100_000
    assert sp.record(0).state is AQ
    assert sp.expire_locks(100_000) == 10
    assert sp.record(0).state is AV
    # Another member acquires them afterwards, with a fresh cap of its own.
    assert [a.first_offset for a in sp.acquire("b", 10, 10, 100_001)] == [0]
    sp.acknowledge("b", [batch(0, 9, A.RENEW)], 120_000)
    assert sp.record(0).lock_deadline_ms == 150_000


def test_a_refused_renew_changes_nothing_and_names_its_records_stale() -> None:
    sp = SharePartition(cfg(max_renewal_ms=LOCK), 0)
    sp.acquire("a", 4, 4, 0)
    acks = [batch(0, 1, A.ACCEPT), batch(2, 3, A.RENEW)]
    before = list(sp.in_flight())
    with pytest.raises(InvalidRecordStateError):
        sp.acknowledge("a", acks, 10_000)
    assert list(sp.in_flight()) == before
    # The member resends its other acknowledgements without the stale RENEW.
    assert sp.stale_acknowledgements("a", acks) == [(2, 3)]
    sp.acknowledge("a", [batch(0, 1, A.ACCEPT)], 10_000)
    assert sp.start_offset == 2


def test_the_cap_counts_from_acquisition_not_from_the_last_renewal() -> None:
    sp = SharePartition(cfg(max_renewal_ms=45_000), 0)
    sp.acquire("a", 1, 1, 0)
    sp.acknowledge("a", [batch(0, 0, A.RENEW)], 10_000)
    assert sp.record(0).lock_deadline_ms == 40_000
    sp.acknowledge("a", [batch(0, 0, A.RENEW)], 20_000)  # clamped to 0 + 45000
    assert sp.record(0).lock_deadline_ms == 45_000


def test_restored_locks_keep_a_renewal_cap() -> None:
    sp = SharePartition(cfg(max_renewal_ms=LOCK), 0)
    sp.acquire("a", 1, 1, 0)
    start, batches = sp.snapshot()
    back = SharePartition.restore(cfg(max_renewal_ms=LOCK), start, batches)
    with pytest.raises(InvalidRecordStateError):
        back.acknowledge("a", [batch(0, 0, A.RENEW)], 1_000)


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(1_000, 200_000),
    steps=st.lists(st.integers(1, 40_000), min_size=1, max_size=30),
)
def test_no_lock_outlives_acquisition_plus_cap(cap: int, steps: list[int]) -> None:
    """Whatever RENEWs a member sends, its lock never reaches past acquisition + cap."""
    sp = SharePartition(cfg(max_renewal_ms=cap), 0)
    sp.acquire("a", 5, 5, 0)
    now = 0
    for step in steps:
        now += step
        sp.expire_locks(now)
        if sp.record(0).state is not AQ:
            break
        with contextlib.suppress(InvalidRecordStateError):
            sp.acknowledge("a", [batch(0, 4, A.RENEW)], now)
        deadline = sp.record(0).lock_deadline_ms
        assert deadline is not None and deadline <= max(cap, LOCK)  # the first lock is whole
    sp.expire_locks(max(cap, LOCK))
    assert sp.record(0).state is not AQ


# ------------------------------------------------------------------------------------------
# Per-member in-flight and acquisition-rate limits
# ------------------------------------------------------------------------------------------


def test_a_member_holds_at_most_its_in_flight_limit_and_others_get_the_rest() -> None:
    sp = SharePartition(cfg(member_max_in_flight_records=100, member_max_acquisition_rate=0), 0)
    assert sp.acquire("greedy", 500, 1_000, 0)[0].last_offset == 99
    assert sp.acquire("greedy", 500, 1_000, 1) == []  # no error: just nothing more
    assert sp.held_by("greedy") == 100
    got = sp.acquire("victim", 50, 1_000, 2)
    assert (got[0].first_offset, got[0].last_offset) == (100, 149)
    sp.acknowledge("greedy", [batch(0, 9, A.ACCEPT)], 3)
    assert sp.held_by("greedy") == 90
    assert (
        sum(a.last_offset - a.first_offset + 1 for a in sp.acquire("greedy", 500, 1_000, 4)) == 10
    )


def test_the_acquisition_rate_is_a_token_bucket_of_one_second() -> None:
    sp = SharePartition(cfg(member_max_acquisition_rate=100), 0)
    n = lambda got: sum(a.last_offset - a.first_offset + 1 for a in got)  # noqa: E731
    assert n(sp.acquire("a", 500, 10_000, 0)) == 100
    assert sp.acquire("a", 500, 10_000, 0) == []
    assert n(sp.acquire("a", 500, 10_000, 500)) == 50  # half a second refills half
    assert n(sp.acquire("b", 500, 10_000, 500)) == 100  # per member
    assert n(sp.acquire("a", 500, 10_000, 5_000)) == 100  # never more than one second's worth


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 300),
    ops=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 200), st.booleans()),
        max_size=30,
    ),
)
def test_held_never_exceeds_the_member_limit(limit: int, ops: list[tuple[str, int, bool]]) -> None:
    sp = SharePartition(cfg(member_max_in_flight_records=limit, member_max_acquisition_rate=0), 0)
    for now, (member, want, ack) in enumerate(ops, start=1):
        got = sp.acquire(member, want, 10_000, now)
        if ack and got:
            sp.acknowledge(member, [batch(got[0].first_offset, got[0].last_offset, A.ACCEPT)], now)
        for m in ("a", "b"):
            held = sum(
                r.last_offset - r.first_offset + 1
                for r in sp.in_flight()
                if r.state is AQ and r.member_id == m
            )
            assert held == sp.held_by(m) <= limit


# ------------------------------------------------------------------------------------------
# RELEASE without handling: fence and roll back
# ------------------------------------------------------------------------------------------

ABUSE = {"release_abuse_records": 200, "release_abuse_ratio_percent": 90}


def acquire_release_loop(
    sp: SharePartition, member: str, n: int, rounds: int, t0: int = 0
) -> list[MemberFence]:
    """The trial's attack: acquire n records and RELEASE them, ``rounds`` times."""
    fences: list[MemberFence] = []
    now = t0
    for _ in range(rounds):
        now += 10
        try:
            got = sp.acquire(member, n, 1_000_000, now)
        except ShareGroupError as exc:
            assert exc.code is ErrorCode.FENCED_MEMBER_EPOCH
            break
        acks = [batch(a.first_offset, a.last_offset, A.RELEASE) for a in got]
        if acks:
            fence = sp.acknowledge(member, acks, now)
            if fence is not None:
                fences.append(fence)
    return fences


def test_an_acquire_release_loop_archives_nothing_and_fences_the_member() -> None:
    sp = SharePartition(cfg(**ABUSE), 0)
    fences = acquire_release_loop(sp, "attacker", 60, rounds=20)
    assert len(fences) == 1
    fence = fences[0]
    assert fence.member_id == "attacker" and fence.released >= 200 and fence.handled == 0
    assert sp.archived_total == 0
    # Every record it touched is Available with the delivery counts it added rolled back.
    assert all(r.state is AV and r.delivery_count == 0 for r in sp.in_flight())
    # Fenced: refused on this share-partition for the window, acquiring and acknowledging.
    with pytest.raises(ShareGroupError) as info:
        sp.acquire("attacker", 10, 1_000_000, 1_000)
    assert info.value.code is ErrorCode.FENCED_MEMBER_EPOCH
    assert "share.member.release.abuse" in info.value.message
    # A victim gets the records as first deliveries.
    got = sp.acquire("victim", 60, 1_000_000, 1_000)
    assert got[0].delivery_count == 1
    # After the window the member may come back.
    sp.acquire("attacker", 1, 1_000_000, fence.until_ms)


def test_the_fence_restores_records_it_archived_that_are_still_in_flight() -> None:
    # A record before them is held by someone else, so the SPSO can't pass them.
    sp = SharePartition(cfg(release_abuse_records=60, delivery_count_limit=3), 0)
    sp.acquire("honest", 1, 1, 0)
    fences = acquire_release_loop(sp, "attacker", 20, rounds=10)
    assert len(fences) == 1
    assert sp.start_offset == 0
    assert [sp.record(o).state for o in range(1, 21)] == [AV] * 20
    assert max(sp.record(o).delivery_count for o in range(1, 21)) == 0


def test_a_member_that_handles_its_records_is_never_fenced() -> None:
    sp = SharePartition(cfg(**ABUSE), 0)
    now = 0
    for _ in range(100):
        now += 10
        for a in sp.acquire("m", 20, 1_000_000, now):
            # Poison records (every tenth offset) fail every time; the rest are handled.
            types = [
                A.RELEASE if o % 10 == 0 else A.ACCEPT
                for o in range(a.first_offset, a.last_offset + 1)
            ]
            assert sp.acknowledge("m", [batch(a.first_offset, a.last_offset, *types)], now) is None
    assert sp.archived_total > 0  # the poison records reached the limit


def test_a_poison_record_is_still_archived_at_the_delivery_limit() -> None:
    """KIP-932: every RELEASE counts a delivery; one member failing on one record archives it."""
    sp = SharePartition(cfg(**ABUSE), 0)
    for now in range(1, 6):
        sp.acquire("m", 1, 1, now)
        assert sp.acknowledge("m", [batch(0, 0, A.RELEASE)], now) is None
    assert sp.archived_total == 1


def test_zero_abuse_records_disables_the_fence() -> None:
    sp = SharePartition(cfg(release_abuse_records=0), 0)
    assert acquire_release_loop(sp, "a", 60, rounds=10) == []
    assert sp.archived_total == 120  # KIP-932: 5 deliveries each, twice over


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 80), rounds=st.integers(1, 12), limit=st.integers(2, 6))
def test_a_fenced_loop_leaves_no_count_it_caused(n: int, rounds: int, limit: int) -> None:
    """The attacker is fenced exactly when its RELEASEs of redelivered records reach the
    threshold, and then no record keeps a delivery count it caused."""
    sp = SharePartition(cfg(release_abuse_records=50, delivery_count_limit=limit), 0)
    fences = acquire_release_loop(sp, "attacker", n, rounds)
    # RELEASEs of second deliveries or later: (limit - 1) per record per cycle of limit rounds.
    cycles, rest = divmod(rounds, limit)
    looped = n * (cycles * (limit - 1) + max(rest - 1, 0))
    assert bool(fences) == (looped >= 50)
    if fences:
        assert all(r.delivery_count == 0 for r in sp.in_flight() if r.state is AV)


def test_releasing_first_deliveries_in_bulk_is_not_abuse() -> None:
    """A member closing or losing a share-partition RELEASEs the records it never started on:
    first deliveries, however many, don't make it a member that RELEASEs without handling."""
    sp = SharePartition(cfg(**ABUSE, member_max_acquisition_rate=0), 0)
    got = sp.acquire("m", 1000, 10_000, 0)
    assert sp.acknowledge("m", [batch(0, 999, A.RELEASE)], 0) is None
    assert got[0].delivery_count == 1 and sp.record(999).delivery_count == 1
    assert sp.acquire("m", 10, 10_000, 1)  # not fenced


def test_a_reset_forgets_the_released_ranges() -> None:
    """After an admin reset the old offsets hold other records: a later fence leaves them be."""
    sp = SharePartition(cfg(release_abuse_records=60), 0)
    acquire_release_loop(sp, "a", 20, rounds=2)
    sp.reset_start_offset(0)
    sp.acquire("b", 20, 20, 100)
    sp.acknowledge("b", [batch(0, 19, A.RELEASE)], 100)
    assert acquire_release_loop(sp, "a", 20, rounds=4, t0=200)
    assert all(sp.record(o).delivery_count == 1 for o in range(20))  # b's delivery stays


def test_holding_records_to_the_renewal_cap_over_and_over_fences_the_member() -> None:
    """Locks that run out at the renewal cap count as RELEASEs without handling: a member that
    re-acquires records and RENEWs them to the cap again and again is fenced by the expiry, and
    the deliveries it wasted are rolled back."""
    sp = SharePartition(cfg(max_renewal_ms=LOCK * 2, release_abuse_records=60), 0)
    now, fences = 0, []
    for _ in range(4):
        got = sp.acquire("hoarder", 30, 30, now)
        assert got, now
        sp.acknowledge("hoarder", [batch(0, 29, A.RENEW)], now + LOCK - 1000)
        sp.acknowledge("hoarder", [batch(0, 29, A.RENEW)], now + 2 * LOCK - 2000)  # to the cap
        assert sp.record(0).lock_deadline_ms == now + 2 * LOCK
        now += 2 * LOCK
        sp.expire_locks(now)
        fences += sp.take_fences()
        if fences:
            break
    [fence] = fences
    assert fence.member_id == "hoarder" and fence.released >= 60
    assert sp.take_fences() == []
    assert all(sp.record(o).delivery_count == 0 for o in range(30))
    assert sp.archived_total == 0
