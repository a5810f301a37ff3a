"""The engine's dead-letter hold (KIP-1191 dead-letter topics; docs/guide.md "Dead-letter
topics"): with ``SharePartitionConfig(dead_letter=True)`` every archive transition except GAP
holds the record Acquired by ``__dead_letter__`` until the leader archives it."""

from __future__ import annotations

import pytest

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    RecordState,
    SharePartition,
    SharePartitionConfig,
)
from queueflow.engine.group import ShareGroup
from queueflow.engine.reserved import (
    DEAD_LETTER_DEADLINE_MS,
    DEAD_LETTER_OWNER,
    is_reserved,
)
from queueflow.engine.state import StateBatch
from queueflow.errors import (
    ErrorCode,
    InvalidRecordStateError,
    InvalidRequestError,
    ShareGroupError,
)

A = AcknowledgeType
AQ = RecordState.ACQUIRED
AR = RecordState.ARCHIVED
DLQ = SharePartitionConfig(delivery_count_limit=2, dead_letter=True)


def ack(sp: SharePartition, member: str, first: int, last: int, t: AcknowledgeType) -> None:
    sp.acknowledge(member, [AcknowledgementBatch(first, last, (t,))], 1_000)


def held(sp: SharePartition) -> list[tuple[int, int, int]]:
    return [(r.first_offset, r.last_offset, r.delivery_count) for r in sp.dead_letters()]


def test_reserved_names() -> None:
    assert is_reserved(DEAD_LETTER_OWNER)
    assert is_reserved("__delayed__")
    assert not is_reserved("member-1")
    assert not is_reserved("")
    assert not is_reserved(None)


def test_reject_is_held_then_archived_by_the_writer() -> None:
    sp = SharePartition(DLQ, 0)
    sp.acquire("m", 10, 5, 0)
    ack(sp, "m", 1, 2, A.REJECT)
    ack(sp, "m", 0, 0, A.ACCEPT)
    assert held(sp) == [(1, 2, 1)]
    view = sp.record(1)
    assert (view.state, view.member_id, view.lock_deadline_ms) == (
        AQ,
        DEAD_LETTER_OWNER,
        DEAD_LETTER_DEADLINE_MS,
    )
    assert sp.start_offset == 1  # the SPSO waits for the DLQ write
    assert sp.archived_total == 0
    assert sp.held_by("m") == 2
    # Nobody but the leader can settle a held record.
    with pytest.raises(InvalidRecordStateError):
        ack(sp, "m", 1, 1, A.ACCEPT)
    assert sp.archive_dead_letters(0, 4) == 2
    assert sp.record(1).state is AR
    assert sp.archived_total == 2
    assert held(sp) == []
    assert sp.archive_dead_letters(0, 4) == 0


def test_gap_is_archived_directly() -> None:
    sp = SharePartition(DLQ, 0)
    sp.acquire("m", 3, 3, 0)
    ack(sp, "m", 0, 0, A.GAP)
    assert held(sp) == []
    assert sp.start_offset == 1


def test_delivery_limit_by_release_expiry_and_member_release() -> None:
    sp = SharePartition(DLQ, 0)
    sp.acquire("m", 3, 3, 0)
    ack(sp, "m", 0, 2, A.RELEASE)
    sp.acquire("m", 1, 3, 0)  # offset 0, 2nd delivery: RELEASE archives it
    ack(sp, "m", 0, 0, A.RELEASE)
    sp.acquire("m", 1, 3, 0)  # offset 1, 2nd delivery: its lock expires
    sp.expire_locks(10**9)
    sp.acquire("n", 1, 3, 10**9)  # offset 2, 2nd delivery: its member leaves
    sp.release_member("n", 10**9)
    assert held(sp) == [(0, 2, 2)]
    assert sp.acquire("m", 10, 3, 10**9) == []  # held records are never delivered
    assert sp.next_lock_deadline() == DEAD_LETTER_DEADLINE_MS
    assert sp.expire_locks(DEAD_LETTER_DEADLINE_MS - 1) == 0


def test_hold_is_durable_and_restored() -> None:
    sp = SharePartition(DLQ, 0)
    sp.acquire("m", 2, 2, 0)
    ack(sp, "m", 0, 0, A.REJECT)
    start, batches = sp.snapshot()
    again = SharePartition.restore(DLQ, start, batches)
    assert held(again) == [(0, 0, 1)]
    assert again.archive_dead_letters(0, 0) == 1
    assert again.start_offset == 1


def test_restore_at_the_limit_holds_instead_of_archiving() -> None:
    batches = [StateBatch(0, 1, RecordState.AVAILABLE, 2)]
    sp = SharePartition.restore(DLQ, 0, batches)
    assert held(sp) == [(0, 1, 2)]
    plain = SharePartition.restore(SharePartitionConfig(delivery_count_limit=2), 0, batches)
    assert plain.start_offset == 2
    change = sp.take_changes()
    assert change is not None and change.batches[0].member_id == DEAD_LETTER_OWNER


def test_without_dead_letter_nothing_changes() -> None:
    sp = SharePartition(SharePartitionConfig(delivery_count_limit=2), 0)
    sp.acquire("m", 2, 2, 0)
    ack(sp, "m", 0, 1, A.REJECT)
    assert held(sp) == []
    assert sp.start_offset == 2


def test_reset_refused_while_dead_letters_are_held() -> None:
    sp = SharePartition(DLQ, 0)
    sp.acquire("m", 2, 2, 0)
    ack(sp, "m", 0, 1, A.REJECT)
    with pytest.raises(InvalidRequestError, match="dead-letter topic"):
        sp.reset_start_offset(0)


def test_a_release_abuse_fence_brings_back_records_it_sent_to_the_dlq() -> None:
    """A member fenced for RELEASing without handling (share.member.release.abuse.*): the
    records its RELEASEs took to the delivery limit come back Available, not to the DLQ."""
    sp = SharePartition(
        SharePartitionConfig(
            delivery_count_limit=3,
            dead_letter=True,
            release_abuse_records=60,
            release_abuse_ratio_percent=90,
        ),
        0,
    )
    sp.acquire("honest", 1, 1, 0)  # holds offset 0: the SPSO can't pass the others
    now, fenced = 0, None
    while fenced is None:
        now += 10
        got = sp.acquire("attacker", 20, 1_000_000, now)
        assert got, "the attacker was refused before it was fenced"
        fenced = sp.acknowledge(
            "attacker",
            [AcknowledgementBatch(a.first_offset, a.last_offset, (A.RELEASE,)) for a in got],
            now,
        )
    assert held(sp) == []
    assert all(r.state is RecordState.AVAILABLE for r in sp.in_flight() if r.first_offset > 0)


def test_a_member_id_reserved_for_the_leaders_is_refused_at_join() -> None:
    group = ShareGroup("G", session_timeout_ms=45_000, max_size=10)
    with pytest.raises(ShareGroupError) as info:
        group.heartbeat(DEAD_LETTER_OWNER, 0, ["t"], 0, {"t": 1})
    assert info.value.code is ErrorCode.INVALID_REQUEST and "reserved" in info.value.message
    assert not group.members
