"""``SharePartitionConfig.release_by_lock_end`` (``queueflow.processing.guarantee=exactly_once``):
a release by member or a fence ends the member's locks now instead of releasing its records; the
records are released by ``expire_locks`` at or after that time, and the member may still
acknowledge them until then."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    RecordState,
    SharePartition,
    SharePartitionConfig,
)

ACCEPT, RELEASE = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE
LOCK_MS = 30_000


def engine(deferred: bool, **config: int) -> SharePartition:
    return SharePartition(SharePartitionConfig(release_by_lock_end=deferred, **config), 0)


def states(sp: SharePartition, end: int) -> list[tuple[RecordState, int, str | None]]:
    return [(v.state, v.delivery_count, v.member_id) for v in map(sp.record, range(end))]


def test_a_release_by_member_ends_its_locks_now_and_expiry_releases_them() -> None:
    sp = engine(True)
    sp.acquire("gone", 3, 3, 1000)
    sp.acquire("other", 2, 5, 1000)
    assert sp.release_member("gone", 2000) == 3
    for offset in range(3):
        view = sp.record(offset)
        assert view.state is RecordState.ACQUIRED and view.member_id == "gone"
        assert view.lock_deadline_ms == 2000
    assert sp.expire_locks(1999) == 0  # the lock clock is behind the release: nothing yet
    assert sp.acquired_count == 5
    assert sp.expire_locks(2000) == 3
    assert [sp.record(o).state for o in range(5)] == [RecordState.AVAILABLE] * 3 + [
        RecordState.ACQUIRED
    ] * 2
    assert sp.record(3).lock_deadline_ms == 1000 + LOCK_MS  # the other member's locks untouched


def test_the_member_may_acknowledge_what_it_held_until_its_ended_locks_expire() -> None:
    sp = engine(True)
    sp.acquire("gone", 2, 2, 1000)
    sp.release_member("gone", 2000)
    sp.acknowledge("gone", [AcknowledgementBatch(0, 1, (ACCEPT,))], 2500)
    assert sp.start_offset == 2 and sp.acquired_count == 0
    assert sp.expire_locks(10_000) == 0


def test_a_lock_ending_sooner_than_the_release_keeps_its_deadline() -> None:
    sp = engine(True)
    sp.acquire("m", 1, 1, 1000)
    assert sp.release_member("m", 1000 + LOCK_MS + 5) == 0
    assert sp.record(0).lock_deadline_ms == 1000 + LOCK_MS


def test_a_fence_for_release_abuse_ends_the_locks_and_the_member_may_still_settle() -> None:
    config = {"release_abuse_records": 2, "release_abuse_ratio_percent": 50}
    sp = engine(True, **config)
    sp.acquire("m", 4, 4, 0)
    sp.acknowledge("m", [AcknowledgementBatch(0, 1, (RELEASE,))], 10)
    sp.acquire("m", 2, 4, 20)  # the released records again: their second delivery
    fence = sp.acknowledge("m", [AcknowledgementBatch(0, 1, (RELEASE,))], 30)
    assert fence is not None and fence.returned == 4  # its locks ended, nothing released yet
    assert sp.acquired_count == 4
    assert all(sp.record(o).lock_deadline_ms == 30 for o in range(4))
    sp.acknowledge("m", [AcknowledgementBatch(2, 2, (ACCEPT,))], 31)  # fenced, still settles
    assert sp.record(2).state is RecordState.ACKNOWLEDGED
    assert sp.expire_locks(30) == 3
    assert sp.acquired_count == 0


def test_without_the_option_a_release_by_member_is_immediate() -> None:
    sp = engine(False)
    sp.acquire("gone", 3, 3, 1000)
    assert sp.release_member("gone", 2000) == 3
    assert sp.available_count == 3


# One step: (kind, member index, size, time step)
STEP = st.tuples(
    st.sampled_from(["acquire", "accept", "release", "leave", "expire"]),
    st.integers(0, 2),
    st.integers(1, 4),
    st.integers(0, 40_000),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=40))
def test_a_release_by_member_then_expiry_at_its_time_equals_the_immediate_release(
    steps: list[tuple[str, int, int, int]],
) -> None:
    """Deferred and immediate engines agree on every record when the deferred one's expiry
    runs right after each release (the lock clock caught up); and a deferred engine never
    releases a member's records before ``expire_locks`` reaches the release time."""
    deferred, immediate = engine(True), engine(False)
    now, end = 0, 0
    for kind, m, n, dt in steps:
        member = f"m{m}"
        now += dt
        if kind == "acquire":
            end += n
            for sp in (deferred, immediate):
                sp.acquire(member, n, end, now)
        elif kind in ("accept", "release"):
            held = [o for o in range(end) if immediate.record(o).member_id == member]
            if held:
                ack = ACCEPT if kind == "accept" else RELEASE
                batch = [AcknowledgementBatch(held[0], held[0], (ack,))]
                for sp in (deferred, immediate):
                    sp.acknowledge(member, batch, now)
        elif kind == "leave":
            held = {  # what it holds beyond the release time: no natural expiry before it
                o
                for o in range(end)
                if deferred.record(o).member_id == member
                and (deferred.record(o).lock_deadline_ms or 0) >= now
            }
            deferred.release_member(member, now)
            assert deferred.expire_locks(now - 1) >= 0
            for o in held:  # nothing of it released before the release time
                assert deferred.record(o).member_id == member
            immediate.release_member(member, now)
            immediate.expire_locks(now - 1)
            deferred.expire_locks(now)
            immediate.expire_locks(now)
        else:
            deferred.expire_locks(now)
            immediate.expire_locks(now)
        assert states(deferred, end) == states(immediate, end)
        assert deferred.start_offset == immediate.start_offset
