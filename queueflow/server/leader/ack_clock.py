"""The lock clock of an exactly-once leader: up to when its transactional acknowledgements are
known, per request partition (docs/architecture.md "Exactly-once: transactional
acknowledgements").

With ``queueflow.processing.guarantee=exactly_once`` a member commits its ACCEPTs (one
ShareAcknowledge per share-partition, produced to the ack topic) in the same Kafka transaction
as its results, and the leader applies them when its read_committed reader reaches them. A
record whose lock elapsed must not be released (and delivered again) while a committed
acknowledgement of it may still be on its way. Members put a record into a transaction only
while its lock holds, and every produce of the transaction is acknowledged by the broker before
the record's lock deadline, so the acknowledgement is below the ack topic's high watermark at
that deadline. Hence ``ack_safe_ms[p]``: the latest time ``T`` such that the reader's position
on partition ``p`` has passed the high watermark sampled (read_uncommitted) at ``T``. Every
acknowledgement acknowledged by the broker before ``T`` was then read and, if committed,
applied (a read_committed position can't pass an open transaction: the last stable offset holds
it back until the transaction commits, aborts or times out). The leader releases records by
time or by member only as of ``min(now, ack_safe_ms[p])``.

Pure: times and offsets are passed in; :mod:`queueflow.server.leader.acks_reader` does the I/O.
"""

from __future__ import annotations

from collections import deque

__all__ = ["NOT_CAUGHT_UP_MS", "AckClock"]

#: The expiry time of a partition whose reader has not caught up once: nothing elapses.
NOT_CAUGHT_UP_MS = -1
#: The most high-watermark samples kept per partition (oldest dropped first: that only makes
#: the clock lag, never run ahead).
MAX_SAMPLES = 1024


class AckClock:
    """``ack_safe_ms`` of the request partitions one leader leads.

    A partition is unknown (:data:`NOT_CAUGHT_UP_MS`) from :meth:`reset` until the reader's
    position first passes a sampled high watermark: a new leader releases nothing before its
    reader caught up once.
    """

    def __init__(self) -> None:
        self._safe: dict[int, int] = {}
        self._samples: dict[int, deque[tuple[int, int]]] = {}

    def reset(self, partition: int) -> None:
        """Forget ``partition`` (its reader starts again, e.g. under a new leader epoch): no
        release until it caught up again."""
        self._safe.pop(partition, None)
        self._samples[partition] = deque()

    def forget(self, partition: int) -> None:
        """No longer led here."""
        self._safe.pop(partition, None)
        self._samples.pop(partition, None)

    def sampled(self, partition: int, at_ms: int, high_watermark: int) -> None:
        """The ack topic's high watermark of ``partition`` was ``high_watermark`` (or more) at
        ``at_ms`` (take ``at_ms`` before sending the ListOffsets request)."""
        samples = self._samples.setdefault(partition, deque())
        if samples and samples[-1][1] >= high_watermark:
            # An older sample with an end as high: the newer time is as safe once passed.
            samples[-1] = (max(samples[-1][0], at_ms), samples[-1][1])
            return
        samples.append((at_ms, high_watermark))
        while len(samples) > MAX_SAMPLES:
            samples.popleft()

    def advanced(self, partition: int, position: int) -> int | None:
        """The reader applied everything of ``partition`` before ``position`` (its consumer's
        position after the messages it returned were applied); returns the new
        ``ack_safe_ms`` (``None``: still not caught up)."""
        samples = self._samples.get(partition)
        if samples is None:
            return self._safe.get(partition)
        while samples and samples[0][1] <= position:
            at_ms = samples.popleft()[0]
            self._safe[partition] = max(self._safe.get(partition, at_ms), at_ms)
        return self._safe.get(partition)

    def safe_ms(self, partition: int) -> int | None:
        """``ack_safe_ms`` of ``partition``; ``None`` until its reader caught up once."""
        return self._safe.get(partition)

    def expiry_ms(self, partition: int, now_ms: int) -> int:
        """The time to expire locks and end releases as of: ``min(now_ms, ack_safe_ms)``, or
        :data:`NOT_CAUGHT_UP_MS` (nothing elapses) before the reader caught up once."""
        safe = self._safe.get(partition)
        return NOT_CAUGHT_UP_MS if safe is None else min(now_ms, safe)

    def lag_ms(self, partition: int, now_ms: int) -> int | None:
        """How far ``ack_safe_ms`` trails ``now_ms`` (``None``: not caught up yet)."""
        safe = self._safe.get(partition)
        return None if safe is None else max(0, now_ms - safe)
