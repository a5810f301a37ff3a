"""Client-side acknowledgement batching (KIP-932 "Batching", ShareAcknowledge).

Outcomes are collected per share-partition and sent as ranges of equal acknowledge type, riding
along with the next ShareFetch of that share-partition where possible. One batch is applied by
the leader atomically.
"""

from __future__ import annotations

import time
from collections import defaultdict

from queueflow.protocol import WireAck
from queueflow.share.partition import AcknowledgeType

TopicPartition = tuple[str, int]


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


class AcknowledgementBuffer:
    """Pending acknowledgements per share-partition, with the age of the oldest one."""

    def __init__(self) -> None:
        self._pending: dict[TopicPartition, dict[int, AcknowledgeType]] = defaultdict(dict)
        self._since: dict[TopicPartition, float] = {}

    def add(self, tp: TopicPartition, offset: int, kind: AcknowledgeType) -> None:
        """Record the outcome of one record (a later outcome for the same offset wins)."""
        self._pending[tp][offset] = kind
        if tp not in self._since:
            self._since[tp] = time.monotonic()

    def take(self, tp: TopicPartition) -> list[WireAck]:
        """Remove and return the pending acknowledgements of ``tp`` as wire ranges."""
        self._since.pop(tp, None)
        outcomes = self._pending.pop(tp, None)
        return to_wire(outcomes) if outcomes else []

    def restore(self, tp: TopicPartition, ranges: list[WireAck]) -> None:
        """Put back acknowledgements taken with :meth:`take` whose request failed; outcomes
        recorded since then win."""
        for first, last, kinds in ranges:
            for i, offset in enumerate(range(first, last + 1)):
                kind = AcknowledgeType(kinds[0] if len(kinds) == 1 else kinds[i])
                self._pending[tp].setdefault(offset, kind)
        if ranges:
            self._since.setdefault(tp, time.monotonic())

    def pending(self, tp: TopicPartition) -> int:
        """Number of records of ``tp`` waiting to be acknowledged."""
        return len(self._pending.get(tp, ()))

    def age_ms(self, tp: TopicPartition) -> float:
        """How long the oldest pending acknowledgement of ``tp`` has waited, in ms."""
        since = self._since.get(tp)
        return 0.0 if since is None else (time.monotonic() - since) * 1000

    def partitions(self) -> list[TopicPartition]:
        """Share-partitions with pending acknowledgements."""
        return [tp for tp, outcomes in self._pending.items() if outcomes]
