"""Which records an ``exactly_once`` share agent has in a transaction or has just committed, so
that a second delivery of the same offset to this member publishes nothing twice.

Acknowledgements name offsets, not deliveries. When a leader delivers an offset again to the
member that still has it in a transaction, or that committed its outcome moments ago (its lock
ended at the leader before the committed acknowledgement was applied), handling the new copy
would commit its results a second time. Instead:

* a copy of an offset in a transaction not yet finished is dropped: the transaction's
  acknowledgement settles the offset (this member holds it again, so the leader applies it),
  or, if the transaction fails, the new copy's lock ends and the leader delivers it again;
* a copy of an offset committed within :attr:`CommittedOffsets.window_s` is acknowledged on
  the normal path with the committed outcome, its handler not called (or its results dropped).

Pure: times are passed in (monotonic seconds).
"""

from __future__ import annotations

from collections import OrderedDict
from enum import Enum

from queueflow.structs import AcknowledgeType, ShareRecord

__all__ = ["MAX_REMEMBERED", "CommittedOffsets", "Seen"]

#: The most committed offsets remembered (oldest forgotten first).
MAX_REMEMBERED = 200_000

_Key = tuple[str, int, int]


class Seen(Enum):
    """What this member already did with a record's offset."""

    #: Nothing known: handle the record.
    NEW = "new"
    #: In a transaction not yet finished: drop the copy.
    IN_TRANSACTION = "in_transaction"
    #: Committed recently: acknowledge the copy with the committed outcome.
    COMMITTED = "committed"


def _key(record: ShareRecord) -> _Key:
    return (record.topic, record.partition, record.offset)


class CommittedOffsets:
    """The offsets of one ``exactly_once`` share agent in a transaction or recently committed.

    Args:
        window_s: how long a committed outcome is remembered (s): at least the time the
            leaders may take to apply a committed acknowledgement.
        max_remembered: the most committed offsets remembered.
    """

    def __init__(self, window_s: float, max_remembered: int = MAX_REMEMBERED) -> None:
        self.window_s = window_s
        self.max_remembered = max_remembered
        self._claimed: dict[_Key, int] = {}  # offset -> copies in transactions not finished
        self._committed: OrderedDict[_Key, tuple[AcknowledgeType, float]] = OrderedDict()

    def seen(self, record: ShareRecord, now: float) -> tuple[Seen, AcknowledgeType | None]:
        """What was done with ``record``'s offset, and the committed outcome if committed."""
        key = _key(record)
        if key in self._claimed:
            return Seen.IN_TRANSACTION, None
        found = self._committed.get(key)
        if found is None:
            return Seen.NEW, None
        outcome, until = found
        if until <= now:
            del self._committed[key]
            return Seen.NEW, None
        return Seen.COMMITTED, outcome

    def claim(self, record: ShareRecord) -> None:
        """``record`` entered the transaction queue."""
        key = _key(record)
        self._claimed[key] = self._claimed.get(key, 0) + 1

    def unclaim(self, record: ShareRecord) -> None:
        """``record`` left the transaction queue without a known commit (released, left to
        its lock)."""
        key = _key(record)
        left = self._claimed.get(key, 0) - 1
        if left > 0:
            self._claimed[key] = left
        else:
            self._claimed.pop(key, None)

    def committed(self, record: ShareRecord, outcome: AcknowledgeType, now: float) -> None:
        """``record``'s outcome ``outcome`` was committed at monotonic ``now``."""
        self.unclaim(record)
        key = _key(record)
        self._committed.pop(key, None)
        self._committed[key] = (outcome, now + self.window_s)
        while len(self._committed) > self.max_remembered:
            self._committed.popitem(last=False)
        self._expire(now)

    def _expire(self, now: float) -> None:
        committed = self._committed
        while committed:
            key, (_, until) = next(iter(committed.items()))
            if until > now:
                return
            del committed[key]

    def __len__(self) -> int:
        return len(self._claimed) + len(self._committed)
