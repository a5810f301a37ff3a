"""Durable share-partition state: its records and their replay.

KIP-932 "Managing durable share-partition state": for each share-partition the cluster must be
able to recover the share-partition start offset (SPSO), the state of the in-flight records and
the delivery counts of records whose delivery failed. The Acquired state is never persisted.

The final Kafka design (KIP-932 "Managing durable share-partition state") stores this as a full
``ShareSnapshot`` followed by
``ShareUpdate`` deltas, each holding ranges (``StateBatch``) rather than per-record entries. This
module defines those records and :func:`replay`, which folds a snapshot and its updates back into
``(start_offset, batches)``; their encoding is :mod:`queueflow.protocol.state_codec`.

KIP-932 says the Acquired state is not persisted, so a new leader redelivers every record that was
in flight at a takeover, even to a member still processing it. queueflow persists acquisition locks
instead: an Acquired batch carries its owner and lock deadline, and a new leader restores it
Acquired, so the owner can still acknowledge it and nobody else gets it before the lock elapses
(a takeover redelivers nothing: docs/architecture.md).

Everything here is pure: no I/O, no clocks.
"""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from queueflow.errors import CorruptStateError

__all__ = [
    "PERSISTED_STATES",
    "RecordState",
    "ShareSnapshot",
    "ShareUpdate",
    "StateBatch",
    "merge_batches",
    "replay",
]


class RecordState(enum.IntEnum):
    """State of one record of a share-partition (KIP-932 "In-flight records").

    The values are the ``DeliveryState`` wire values of ``ShareSnapshotValue.StateBatches``
    (Kafka's ``ShareSnapshotValue``/``ShareUpdateValue`` schemas,
    https://github.com/apache/kafka/tree/trunk/share-coordinator/src/main/resources/common/message).
    ``ACQUIRED`` (1) is persisted by queueflow only with its lock (owner and deadline, see
    :class:`StateBatch`); Kafka never persists it.
    """

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


#: States a durable batch may have without a lock (KIP-932: "the Acquired state is not
#: persisted"). An ``ACQUIRED`` batch is durable only with its lock: owner and deadline.
PERSISTED_STATES: frozenset[RecordState] = frozenset(
    {RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED}
)


@dataclass(frozen=True, slots=True)
class StateBatch:
    """A persisted run of records ``first_offset..last_offset`` (inclusive) with one state.

    Attributes:
        first_offset: first offset of the run (>= 0).
        last_offset: last offset of the run, inclusive (>= ``first_offset``).
        state: ``AVAILABLE``, ``ACKNOWLEDGED``, ``ARCHIVED``, or ``ACQUIRED`` with a lock.
        delivery_count: number of delivery attempts so far (>= 0; >= 1 when ``ACQUIRED``).
        member_id: the member holding the acquisition lock (``ACQUIRED`` only, else None).
        lock_deadline_ms: when that lock elapses, in wall-clock ms since the epoch
            (``ACQUIRED`` only, else None).

    KIP-932 "Managing durable share-partition state"; ``StateBatches`` in Kafka's
    ``ShareSnapshotValue`` schema. The lock
    fields are queueflow's: Kafka does not persist acquisition locks.
    """

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int
    member_id: str | None = None
    lock_deadline_ms: int | None = None

    def cut(self, first_offset: int, last_offset: int) -> StateBatch:
        """The same batch over ``first_offset..last_offset`` (a part of it)."""
        return StateBatch(
            first_offset,
            last_offset,
            self.state,
            self.delivery_count,
            self.member_id,
            self.lock_deadline_ms,
        )

    def continues(self, other: StateBatch) -> bool:
        """True if ``other`` starts right after this batch with the same state, count and lock
        (the two merge into one)."""
        return (
            self.last_offset + 1 == other.first_offset
            and self.state == other.state
            and self.delivery_count == other.delivery_count
            and self.member_id == other.member_id
            and self.lock_deadline_ms == other.lock_deadline_ms
        )


@dataclass(frozen=True, slots=True)
class ShareSnapshot:
    """Full durable state of one share-partition (Kafka's ``ShareSnapshotValue``).

    Attributes:
        snapshot_epoch: incremented for each new snapshot of the share-partition (>= 0).
        state_epoch: epoch of the share-partition state; bumped by a reset (>= 0).
        leader_epoch: leader epoch of the writer (>= -1; -1 means unknown).
        start_offset: the SPSO (>= 0).
        batches: ordered, non-overlapping persisted batches at or above ``start_offset``.
    """

    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...]


@dataclass(frozen=True, slots=True)
class ShareUpdate:
    """A delta of one share-partition's durable state (Kafka's ``ShareUpdateValue``).

    Attributes:
        start_offset: the SPSO after the change; ``-1`` means unchanged (as in Kafka's schema).
            The engine always writes the actual SPSO.
        batches: ordered, non-overlapping batches; each overwrites the range it covers.
        reset: if true, discard all earlier state before applying this update (an admin reset of
            the SPSO, KIP-932 "Managing the SPSO and SPEO").

    The persistence layer adds the snapshot epoch and the delta index (see :func:`encode_update`).
    """

    start_offset: int
    batches: tuple[StateBatch, ...]
    reset: bool = False


_ADVICE = (
    "refusing to serve this share-partition; inspect the changelog record (docs/operations.md, "
    '"Corrupt state", says how to repair or reset it)'
)


def _corrupt(where: str, problem: str) -> CorruptStateError:
    return CorruptStateError(f"corrupt share-partition state for {where}: {problem}; {_ADVICE}")


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------


def _check_batches(batches: Sequence[StateBatch], where: str) -> None:
    prev_last = -1
    for b in batches:
        if b.first_offset < 0 or b.first_offset > b.last_offset:
            raise _corrupt(where, f"batch {b.first_offset}..{b.last_offset} has an invalid range")
        if b.first_offset <= prev_last:
            raise _corrupt(
                where,
                f"batch {b.first_offset}..{b.last_offset} overlaps or precedes the previous "
                "batch; batches must be ordered and non-overlapping",
            )
        if b.state is RecordState.ACQUIRED:
            if not b.member_id or b.lock_deadline_ms is None or b.lock_deadline_ms < 0:
                raise _corrupt(
                    where,
                    f"batch {b.first_offset}..{b.last_offset} is Acquired without a lock "
                    f"(member {b.member_id!r}, deadline {b.lock_deadline_ms!r})",
                )
        elif b.state not in PERSISTED_STATES:
            raise _corrupt(where, f"batch {b.first_offset}..{b.last_offset} is {b.state!r}")
        elif b.member_id is not None or b.lock_deadline_ms is not None:
            raise _corrupt(
                where, f"batch {b.first_offset}..{b.last_offset} is {b.state.name} with a lock"
            )
        if b.delivery_count < 0:
            raise _corrupt(where, f"batch {b.first_offset}..{b.last_offset} has a negative count")
        prev_last = b.last_offset


def _overlay(old: list[StateBatch], new: Sequence[StateBatch]) -> list[StateBatch]:
    """Return ``old`` with every range covered by ``new`` replaced by ``new``'s batches."""
    if not new:
        return old
    if not old:
        return list(new)
    new_lasts = [b.last_offset for b in new]
    pieces: list[StateBatch] = []
    for o in old:
        cur = o.first_offset
        # First new batch that ends at or after the start of o.
        j = bisect_left(new_lasts, cur)
        while cur <= o.last_offset:
            if j >= len(new) or new[j].first_offset > o.last_offset:
                pieces.append(o.cut(cur, o.last_offset))
                break
            n = new[j]
            if n.first_offset > cur:
                pieces.append(o.cut(cur, n.first_offset - 1))
            cur = n.last_offset + 1
            j += 1
    pieces.extend(new)
    pieces.sort(key=lambda b: b.first_offset)
    return pieces


def merge_batches(batches: Iterable[StateBatch]) -> tuple[StateBatch, ...]:
    """Merge adjacent contiguous batches with equal state, delivery count and lock.

    Args:
        batches: ordered, non-overlapping batches.
    """
    out: list[StateBatch] = []
    for b in batches:
        if out:
            p = out[-1]
            if p.continues(b):
                out[-1] = p.cut(p.first_offset, b.last_offset)
                continue
        out.append(b)
    return tuple(out)


def _drop_below(batches: list[StateBatch], start: int) -> list[StateBatch]:
    out: list[StateBatch] = []
    for b in batches:
        if b.last_offset < start:
            continue
        if b.first_offset < start:
            b = b.cut(start, b.last_offset)
        out.append(b)
    return out


def replay(
    snapshot: ShareSnapshot | None,
    updates: Iterable[ShareUpdate],
    *,
    where: str = "share-partition",
) -> tuple[int, tuple[StateBatch, ...]]:
    """Fold a snapshot and the updates written after it into ``(start_offset, batches)``.

    Each update overwrites the ranges its batches cover and sets the start offset (unless it is
    -1, "unchanged"); an update with ``reset=True`` first discards everything. Batches below the
    resulting start offset are dropped and adjacent equal batches are merged, so the result is
    canonical and replay is idempotent: applying an update twice gives the same state.

    Args:
        snapshot: the latest snapshot, or None if there is none (start offset 0 until an update
            sets one).
        updates: the updates written after ``snapshot``, in order.
        where: names the share-partition for error messages.

    Returns:
        ``(start_offset, batches)``; pass them to ``SharePartition.restore``.

    Raises:
        CorruptStateError: a batch is malformed (unordered, overlapping, negative, Acquired
            without a lock or another state with one).

    KIP-932 "Managing durable share-partition state".
    """
    start = 0
    batches: list[StateBatch] = []
    if snapshot is not None:
        _check_batches(snapshot.batches, where)
        start = snapshot.start_offset
        batches = list(snapshot.batches)
    firsts = [b.first_offset for b in batches]
    for u in updates:
        _check_batches(u.batches, where)
        if u.reset:
            batches, firsts = [], []
        if u.start_offset >= 0:
            start = u.start_offset
        for b in u.batches:
            _overlay_one(batches, firsts, b)
        _drop_below_in_place(batches, firsts, start)
    return start, merge_batches(_drop_below(batches, start))


def _overlay_one(batches: list[StateBatch], firsts: list[int], new: StateBatch) -> None:
    """Replace the range ``new`` covers with ``new``, in place; ``firsts`` mirrors the first
    offsets. O(log n) search plus one slice assignment, so replaying many small deltas over a
    large state stays fast."""
    lo = bisect_right(firsts, new.first_offset) - 1
    if lo < 0 or batches[lo].last_offset < new.first_offset:
        lo += 1
    hi = bisect_right(firsts, new.last_offset)
    pieces: list[StateBatch] = []
    if lo < hi and batches[lo].first_offset < new.first_offset:
        left = batches[lo]
        pieces.append(left.cut(left.first_offset, new.first_offset - 1))
    pieces.append(new)
    if lo < hi and batches[hi - 1].last_offset > new.last_offset:
        right = batches[hi - 1]
        pieces.append(right.cut(new.last_offset + 1, right.last_offset))
    batches[lo:hi] = pieces
    firsts[lo:hi] = [b.first_offset for b in pieces]


def _drop_below_in_place(batches: list[StateBatch], firsts: list[int], start: int) -> None:
    """Drop (and trim) batches below ``start``, in place."""
    cut = 0
    while cut < len(batches) and batches[cut].last_offset < start:
        cut += 1
    if cut:
        del batches[:cut]
        del firsts[:cut]
    if batches and batches[0].first_offset < start:
        b = batches[0]
        batches[0] = b.cut(start, b.last_offset)
        firsts[0] = start
