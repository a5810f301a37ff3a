"""``SharePartitionConfig.release_by_lock_end`` (``queueflow.processing.guarantee=exactly_once``):
a release by member (leave, session expiry) or a fence leaves the member's records Acquired
until their own lock deadlines: ``expire_locks`` releases them, and the member may still
acknowledge them until then (it can't know it was removed, and may commit until its deadlines)."""

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


def states(sp: SharePartition, end: int) -> list[tuple[RecordState, int, str | None, int | None]]:
    return [
        (v.state, v.delivery_count, v.member_id, v.lock_deadline_ms)
        for v in map(sp.record, range(end))
    ]


def test_a_release_by_member_keeps_its_locks_and_expiry_releases_them() -> None:
    sp = engine(True)
    sp.acquire("gone", 3, 3, 1000)
    sp.acquire("other", 2, 5, 1000)
    assert sp.release_member("gone", 2000) == 3  # still held
    for offset in range(3):
        view = sp.record(offset)
        assert view.state is RecordState.ACQUIRED and view.member_id == "gone"
        assert view.lock_deadline_ms == 1000 + LOCK_MS
    assert sp.expire_locks(1000 + LOCK_MS - 1) == 0  # not before their own deadlines
    assert sp.acquired_count == 5
    assert sp.expire_locks(1000 + LOCK_MS) == 5
    assert sp.available_count == 5


def test_the_member_may_acknowledge_what_it_held_until_its_locks_expire() -> None:
    sp = engine(True)
    sp.acquire("gone", 2, 2, 1000)
    sp.release_member("gone", 2000)
    sp.acknowledge("gone", [AcknowledgementBatch(0, 1, (ACCEPT,))], 2500)
    assert sp.start_offset == 2 and sp.acquired_count == 0
    assert sp.expire_locks(100_000) == 0


def test_a_fence_for_release_abuse_keeps_the_locks_and_the_member_may_still_settle() -> None:
    config = {"release_abuse_records": 2, "release_abuse_ratio_percent": 50}
    sp = engine(True, **config)
    sp.acquire("m", 4, 4, 0)
    sp.acknowledge("m", [AcknowledgementBatch(0, 1, (RELEASE,))], 10)
    sp.acquire("m", 2, 4, 20)  # the released records again: their second delivery
    fence = sp.acknowledge("m", [AcknowledgementBatch(0, 1, (RELEASE,))], 30)
    assert fence is not None and fence.returned == 4  # all still held, nothing released
    assert sp.acquired_count == 4
    assert [sp.record(o).lock_deadline_ms for o in range(4)] == [20 + LOCK_MS] * 2 + [LOCK_MS] * 2
    sp.acknowledge("m", [AcknowledgementBatch(2, 2, (ACCEPT,))], 31)  # fenced, still settles
    assert sp.record(2).state is RecordState.ACKNOWLEDGED
    assert sp.expire_locks(LOCK_MS - 1) == 0
    assert sp.expire_locks(LOCK_MS) == 1  # offset 3, at its own deadline
    assert sp.expire_locks(20 + LOCK_MS) == 2
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
def test_no_record_is_released_before_its_own_lock_deadline(
    steps: list[tuple[str, int, int, int]],
) -> None:
    """With ``release_by_lock_end`` a release by member changes nothing, and an Acquired record
    stays Acquired by its member until ``expire_locks`` reaches its own lock deadline (or the
    member acknowledges it)."""
    sp = engine(True)
    now, end = 0, 0
    for kind, m, n, dt in steps:
        member = f"m{m}"
        now += dt
        before = {o: sp.record(o) for o in range(end)}
        if kind == "acquire":
            end += n
            sp.acquire(member, n, end, now)
        elif kind in ("accept", "release"):
            held = [o for o in range(end) if sp.record(o).member_id == member]
            if held:
                ack = ACCEPT if kind == "accept" else RELEASE
                sp.acknowledge(member, [AcknowledgementBatch(held[0], held[0], (ack,))], now)
                del before[held[0]]
        elif kind == "leave":
            snapshot = states(sp, end)
            sp.release_member(member, now)
            assert states(sp, end) == snapshot
        else:
            sp.expire_locks(now)
        for o, view in before.items():
            if view.state is RecordState.ACQUIRED and (view.lock_deadline_ms or 0) > now:
                after = sp.record(o)
                assert (after.state, after.member_id) == (RecordState.ACQUIRED, view.member_id)
