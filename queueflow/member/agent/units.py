"""The units a share agent's handler runner queues, with one lock deadline per unit.

The records of one ShareFetch share one acquisition lock deadline (the fetch's send time plus
the lock duration, KIP-932 "Acquisition lock"), so a batch unit carries it once
(:class:`FetchUnit`) and the runner's checks against it (admission, the handler call's
deadline, the give-back of queued records) cost once per unit, not once per record.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from queueflow.structs import ShareRecord

__all__ = ["FetchUnit", "unit_lock_deadline"]


class FetchUnit(list[ShareRecord]):
    """Records of one ShareFetch queued for one handler call, with the earliest of their lock
    deadlines (monotonic s; ``inf`` when unknown).

    Args:
        records: the records.
        lock_deadline: their earliest ``lock_deadline`` if the caller knows it (the fetch's
            deadline); computed from the records otherwise.
    """

    __slots__ = ("lock_deadline",)

    def __init__(self, records: Iterable[ShareRecord], lock_deadline: float | None = None) -> None:
        super().__init__(records)
        if lock_deadline is None:
            lock_deadline = min((r.lock_deadline for r in self), default=math.inf)
        self.lock_deadline = lock_deadline


def unit_lock_deadline(unit: Sequence[ShareRecord]) -> float:
    """The earliest lock deadline of ``unit``'s records (monotonic s): a :class:`FetchUnit`'s
    own, a lone record's, or the minimum over any other sequence."""
    if len(unit) == 1:
        return unit[0].lock_deadline
    if type(unit) is FetchUnit:
        return unit.lock_deadline
    return min((r.lock_deadline for r in unit), default=math.inf)
