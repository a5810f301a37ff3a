"""Client-side acknowledgement batching (KIP-932 "Batching", ShareAcknowledge).

Outcomes are collected per share-partition and sent as ranges of equal acknowledge type, riding
along with the next ShareFetch of that share-partition where possible. One batch is applied by
the leader atomically.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Sequence

from queueflow.protocol.messages import AckError, WireAck
from queueflow.structs import AcknowledgeType, TopicPartition

#: The most errors kept per share-partition.
_MAX_ERRORS = 4096


def to_wire(outcomes: dict[int, AcknowledgeType]) -> list[WireAck]:
    """Fold ``offset → type`` into ranges of consecutive offsets with one type, in offset order.

    >>> to_wire({5: AcknowledgeType.ACCEPT, 6: AcknowledgeType.ACCEPT, 8: AcknowledgeType.REJECT})
    [(5, 6, (1,)), (8, 8, (3,))]
    """
    ranges: list[WireAck] = []
    first = last = -2
    current = -1
    for offset in sorted(outcomes):
        kind = int(outcomes[offset])
        if offset == last + 1 and kind == current:
            last = offset
            continue
        if first >= 0:
            ranges.append((first, last, (current,)))
        first = last = offset
        current = kind
    if first >= 0:
        ranges.append((first, last, (current,)))
    return ranges


class OutcomeRuns:
    """The pending outcomes of one share-partition as runs of consecutive offsets with one
    acknowledge type: ``[first, last, kind]`` lists (inclusive), sorted, disjoint, adjacent runs
    of the same type merged. A handler's outcomes mostly arrive in offset order, so recording
    one extends the last run (no per-offset entry); the runs are the wire ranges (KIP-932
    ShareAcknowledge ``AcknowledgementBatches``) as they are.
    """

    __slots__ = ("_firsts", "count", "runs")

    def __init__(self) -> None:
        #: The runs, in offset order.
        self.runs: list[list[int]] = []
        self._firsts: list[int] = []  # runs[i][0], for bisect
        #: Offsets with an outcome.
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        i = bisect_right(self._firsts, offset) - 1
        return i >= 0 and self.runs[i][1] >= offset

    def add(self, first: int, last: int, kind: int) -> None:
        """Record ``kind`` for ``first..last`` (inclusive); it replaces earlier outcomes of
        those offsets (a later outcome wins).

        Raises:
            ValueError: ``last < first``.
        """
        if last < first:
            raise ValueError(f"empty offset range {first}..{last}")
        runs = self.runs
        if not runs or first > runs[-1][1]:  # in offset order: the common case
            if runs and runs[-1][1] == first - 1 and runs[-1][2] == kind:
                runs[-1][1] = last
            else:
                runs.append([first, last, kind])
                self._firsts.append(first)
            self.count += last - first + 1
            return
        self._insert(first, last, kind)

    def _insert(self, first: int, last: int, kind: int) -> None:
        """:meth:`add` out of offset order: cut ``first..last`` out of the runs it overlaps,
        put the new run in its place and merge equal neighbours (linear in the runs)."""
        kept: list[list[int]] = []
        removed = 0
        for lo, hi, k in self.runs:
            if hi < first or lo > last:
                kept.append([lo, hi, k])
                continue
            removed += min(hi, last) - max(lo, first) + 1
            if lo < first:
                kept.append([lo, first - 1, k])
            if hi > last:
                kept.append([last + 1, hi, k])
        kept.append([first, last, kind])
        kept.sort()
        merged: list[list[int]] = []
        for run in kept:
            if merged and merged[-1][1] == run[0] - 1 and merged[-1][2] == run[2]:
                merged[-1][1] = run[1]
            else:
                merged.append(run)
        self.runs = merged
        self._firsts = [run[0] for run in merged]
        self.count += last - first + 1 - removed

    def wire(self) -> list[WireAck]:
        """The runs as wire ranges ``(first, last, (type,))``, in offset order."""
        return [(first, last, (int(kind),)) for first, last, kind in self.runs]


class AcknowledgementBuffer:
    """Pending acknowledgements per share-partition, with the age of the oldest one.

    Acknowledgements whose request failed (no answer: the leader may or may not have applied
    them) are kept apart and sent again on their own, ahead of newer ones. The leader applies a
    request's acknowledgements for a share-partition as a whole or refuses them as a whole
    (KIP-932), so a repeat merged with newer outcomes would take those down with it when the
    first request had in fact been applied.
    """

    def __init__(self) -> None:
        self._pending: dict[TopicPartition, OutcomeRuns] = {}
        self._since: dict[TopicPartition, float] = {}
        self._uncertain: dict[TopicPartition, list[list[WireAck]]] = {}
        # offset -> (delay_ms, undelivered) of a pending RELEASE with options, kept until its
        # outcome is answered (they travel with whichever request carries the offset).
        self._options: dict[TopicPartition, dict[int, tuple[int, bool]]] = {}
        #: Why records were RELEASEd or REJECTed (sent along for the dead-letter headers).
        self._errors: dict[TopicPartition, dict[int, AckError]] = {}

    def add(
        self,
        tp: TopicPartition,
        offset: int,
        kind: AcknowledgeType,
        error: AckError | None = None,
        *,
        delay_ms: int = 0,
        undelivered: bool = False,
    ) -> None:
        """Record the outcome of one record (a later outcome for the same offset wins), and
        for a RELEASE or REJECT the ``error`` that caused it.

        ``delay_ms`` / ``undelivered``: options of a RELEASE (docs/concepts.md "Delayed
        redelivery", "Delivery counts"), sent as the request's ``ack_delay_ms`` /
        ``ack_undelivered``."""
        runs = self._pending.get(tp)
        if runs is None:
            runs = self._pending[tp] = OutcomeRuns()
        runs.add(offset, offset, kind)
        if delay_ms or undelivered:
            self._options.setdefault(tp, {})[offset] = (delay_ms, undelivered)
        elif tp in self._options:
            self._options[tp].pop(offset, None)
        if tp not in self._since:
            self._since[tp] = time.monotonic()
        errors = self._errors.get(tp)
        if error is not None:
            errors = self._errors.setdefault(tp, {})
            errors.pop(offset, None)
            errors[offset] = error
            if len(errors) > _MAX_ERRORS:  # the oldest go: they were sent long ago
                del errors[next(iter(errors))]
        elif errors:
            errors.pop(offset, None)

    def add_range(self, tp: TopicPartition, first: int, last: int, kind: AcknowledgeType) -> None:
        """Record ``kind`` for the offsets ``first..last`` (inclusive) of ``tp``, without an
        error or RELEASE options (they replace any earlier ones of those offsets): one run,
        whatever its length.

        Raises:
            ValueError: ``last < first``.
        """
        runs = self._pending.get(tp)
        if runs is None:
            runs = self._pending[tp] = OutcomeRuns()
        runs.add(first, last, kind)
        if tp not in self._since:
            self._since[tp] = time.monotonic()
        options, errors = self._options.get(tp), self._errors.get(tp)
        if options or errors:  # rare: a RELEASE or REJECT of these offsets recorded before
            for known in (options or {}, errors or {}):
                for offset in [o for o in known if first <= o <= last]:
                    del known[offset]

    def errors_for(
        self, tp: TopicPartition, acks: list[WireAck]
    ) -> list[tuple[int, int, AckError]]:
        """The errors of the offsets of ``acks`` (``(first, last, error)``, adjacent offsets
        with the same error merged), for :attr:`ShareFetchRequest.ack_errors
        <queueflow.protocol.messages.ShareFetchRequest.ack_errors>`."""
        errors = self._errors.get(tp)
        out: list[tuple[int, int, AckError]] = []
        if not errors:
            return out
        for first, last, _kinds in acks:
            if last - first >= len(errors):
                offsets = sorted(o for o in errors if first <= o <= last)
            else:
                offsets = [o for o in range(first, last + 1) if o in errors]
            for offset in offsets:
                error = errors[offset]
                if out and out[-1][1] == offset - 1 and out[-1][2] == error:
                    out[-1] = (out[-1][0], offset, error)
                else:
                    out.append((offset, offset, error))
        return out

    def options(
        self, tp: TopicPartition, acks: list[WireAck]
    ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        """The RELEASE options of the offsets in ``acks``: ``(first, last, delay_ms)`` and
        ``(first, last)`` ranges (``ShareFetchRequest.ack_delay_ms`` / ``ack_undelivered``)."""
        known = self._options.get(tp)
        if not known:
            return [], []
        delays: list[tuple[int, int, int]] = []
        undelivered: list[tuple[int, int]] = []
        for first, last, _ in acks:
            for offset in range(first, last + 1):
                option = known.get(offset)
                if option is None:
                    continue
                delay, given_back = option
                if delay:
                    if delays and delays[-1][1] == offset - 1 and delays[-1][2] == delay:
                        delays[-1] = (delays[-1][0], offset, delay)
                    else:
                        delays.append((offset, offset, delay))
                if given_back:
                    if undelivered and undelivered[-1][1] == offset - 1:
                        undelivered[-1] = (undelivered[-1][0], offset)
                    else:
                        undelivered.append((offset, offset))
        return delays, undelivered

    def settled(self, tp: TopicPartition, offsets: Sequence[int]) -> None:
        """Forget the RELEASE options of ``offsets`` (their outcome was answered)."""
        known = self._options.get(tp)
        if known:
            for offset in offsets:
                known.pop(offset, None)
            if not known:
                del self._options[tp]

    def take(self, tp: TopicPartition) -> list[WireAck]:
        """Remove and return the acknowledgements for the next request of ``tp``, as wire
        ranges: the oldest batch whose request failed, alone, if there is one; otherwise every
        pending outcome."""
        uncertain = self._uncertain.get(tp)
        if uncertain:
            batch = uncertain.pop(0)
            if not uncertain:
                del self._uncertain[tp]
                if not self._pending.get(tp):
                    self._since.pop(tp, None)
            return batch
        self._since.pop(tp, None)
        outcomes = self._pending.pop(tp, None)
        return outcomes.wire() if outcomes else []

    def restore(self, tp: TopicPartition, ranges: list[WireAck]) -> None:
        """Put back acknowledgements taken with :meth:`take` whose request failed, to be sent
        again on their own; outcomes recorded since then for the same offsets win.

        Raises:
            ValueError: an unknown acknowledge type.
        """
        kept = self._not_superseded(tp, ranges)
        if kept:
            self._uncertain.setdefault(tp, []).append(to_wire(kept))
            self._since.setdefault(tp, time.monotonic())

    def refused(
        self, tp: TopicPartition, ranges: list[WireAck], stale: Sequence[tuple[int, int]] = ()
    ) -> list[int]:
        """Handle acknowledgements the leader refused as a whole, so that one stale outcome
        does not take the others down with it.

        The leader applies a request's acknowledgements atomically (KIP-932 "Client programming
        interface"), so one offset the member can no longer acknowledge (its lock expired, or
        it was acknowledged already) refuses all the others, and those records would be
        delivered and processed again for nothing. The stale offsets named by the leader
        (``stale``) are dropped and the rest is sent again on its own, ahead of newer outcomes.
        When the leader named none, the batch is split in two halves, each sent on its own,
        until a refused batch holds a single offset, which is dropped. Either way each refusal
        drops or halves, so a batch of ``n`` offsets costs at most ``2n - 1`` requests.
        Outcomes recorded since then for the same offsets win.

        Args:
            ranges: the wire ranges of the refused request, as returned by :meth:`take`.
            stale: inclusive offset ranges the leader said are stale (``ack_stale``).

        Returns:
            the offsets dropped, in order.

        Raises:
            ValueError: an unknown acknowledge type.
        """
        kept = self._not_superseded(tp, ranges)
        dropped = [o for o in kept if any(lo <= o <= hi for lo, hi in stale)]
        for offset in dropped:
            del kept[offset]
        if not dropped and len(kept) == 1:
            return list(kept)
        if not kept:
            return dropped
        offsets = sorted(kept)
        parts = (
            [offsets] if dropped else [offsets[: len(offsets) // 2], offsets[len(offsets) // 2 :]]
        )
        self._uncertain.setdefault(tp, [])[0:0] = [to_wire({o: kept[o] for o in p}) for p in parts]
        self._since.setdefault(tp, time.monotonic())
        return dropped

    def _not_superseded(
        self, tp: TopicPartition, ranges: list[WireAck]
    ) -> dict[int, AcknowledgeType]:
        """``ranges`` as ``offset → type``, without offsets that have a newer pending outcome."""
        newer = self._pending.get(tp) or OutcomeRuns()
        kept: dict[int, AcknowledgeType] = {}
        for first, last, kinds in ranges:
            for i, offset in enumerate(range(first, last + 1)):
                if offset not in newer:
                    kept[offset] = AcknowledgeType(kinds[0] if len(kinds) == 1 else kinds[i])
        return kept

    def pending(self, tp: TopicPartition) -> int:
        """Number of records of ``tp`` waiting to be acknowledged."""
        uncertain = sum(
            last - first + 1 for batch in self._uncertain.get(tp, ()) for first, last, _ in batch
        )
        return len(self._pending.get(tp, ())) + uncertain

    def age_ms(self, tp: TopicPartition) -> float:
        """How long the oldest pending acknowledgement of ``tp`` has waited, in ms."""
        since = self._since.get(tp)
        return 0.0 if since is None else (time.monotonic() - since) * 1000

    def partitions(self) -> list[TopicPartition]:
        """Share-partitions with pending acknowledgements."""
        tps = [tp for tp, outcomes in self._pending.items() if outcomes]
        return tps + [tp for tp in self._uncertain if tp not in tps]
