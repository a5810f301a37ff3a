"""Redelivery rules of a share-partition: back-off, throttled delivery, archive reasons.

Pure functions the engine (:mod:`queueflow.engine.partition`) applies; each is documented in
docs/concepts.md:

* "Delayed redelivery": :func:`backoff_ms`, the group's back-off policy for a RELEASEd (or
  raised) record, ``share.redelivery.backoff.ms`` x ``share.redelivery.backoff.multiplier`` ^
  (delivery count - 1), capped at ``share.redelivery.backoff.max.ms``;
* "Throttled delivery": :func:`throttle_cap`, how many records one acquisition may take when
  the records are past half the delivery count limit (after Kafka 4.2's throttled delivery,
  apache/kafka#20837 and #21217);
* "Delivery counts": :data:`DELIVERY_COUNT_MODES` (``share.delivery.count.mode``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ACQUISITIONS",
    "ATTEMPTS",
    "DELIVERY_COUNT_MODES",
    "ArchivedRange",
    "backoff_ms",
    "merge_archived",
    "throttle_cap",
]

#: ``share.delivery.count.mode``: every acquisition counts (KIP-932's rule, the default).
ACQUISITIONS: Final = "acquisitions"
#: ``share.delivery.count.mode``: a delivery ended by a lock expiry or the member's removal
#: (it died holding the record) doesn't count.
ATTEMPTS: Final = "attempts"
DELIVERY_COUNT_MODES: Final = (ACQUISITIONS, ATTEMPTS)


def backoff_ms(delivery_count: int, initial_ms: int, multiplier: float, max_ms: int) -> int:
    """The delay (ms) before a record RELEASEd after its ``delivery_count``-th delivery is
    Available again: ``initial_ms x multiplier^(delivery_count - 1)``, at most ``max_ms``; 0
    when ``initial_ms`` is 0 (no back-off).

    >>> [backoff_ms(n, 1000, 2.0, 5000) for n in (1, 2, 3, 4)]
    [1000, 2000, 4000, 5000]
    """
    if initial_ms <= 0:
        return 0
    exponent = max(delivery_count - 1, 0)
    delay = float(initial_ms)
    for _ in range(exponent):  # stops at the cap: no float overflow for large counts
        delay *= multiplier
        if delay >= max_ms:
            return max_ms
    return min(int(delay), max_ms)


def throttle_cap(delivery: int, limit: int, max_records: int) -> int:
    """How many records one acquisition may take when it delivers records for the
    ``delivery``-th time (1-based; ``limit``: the delivery count limit).

    Up to half the limit (``delivery <= limit // 2``): ``max_records``. Past it the batch
    halves with every further delivery, ``max_records >> (delivery - limit // 2)`` (at least
    1), and the last attempt (``delivery >= limit``) is acquired alone. With a limit of 5 and
    500 records: deliveries 1-2 take 500, the 3rd 250, the 4th 125, the 5th 1.

    >>> [throttle_cap(n, 5, 500) for n in (1, 2, 3, 4, 5)]
    [500, 500, 250, 125, 1]
    """
    half = limit // 2
    if delivery <= half:
        return max_records
    if delivery >= limit:
        return 1
    return max(1, max_records >> (delivery - half))


@dataclass(frozen=True, slots=True)
class ArchivedRange:
    """Records ``first..last`` (inclusive) moved to Archived, with their delivery count and why:
    ``delivery_limit`` (released, or its lock ran out, at ``share.delivery.count.limit``) or
    ``rejected`` (a REJECT). Logged once as ``records_archived`` (docs/operations.md)."""

    first: int
    last: int
    delivery_count: int
    reason: str


def merge_archived(ranges: list[ArchivedRange]) -> list[ArchivedRange]:
    """``ranges`` sorted, adjacent ones of the same count and reason merged.

    >>> merge_archived([ArchivedRange(3, 3, 5, "rejected"), ArchivedRange(1, 2, 5, "rejected")])
    [ArchivedRange(first=1, last=3, delivery_count=5, reason='rejected')]
    """
    out: list[ArchivedRange] = []
    for r in sorted(ranges, key=lambda r: (r.first, r.last)):
        p = out[-1] if out else None
        if (
            p is not None
            and p.last + 1 == r.first
            and p.delivery_count == r.delivery_count
            and p.reason == r.reason
        ):
            out[-1] = ArchivedRange(p.first, r.last, p.delivery_count, p.reason)
        else:
            out.append(r)
    return out
