"""``ShareConsumer.metrics()``: the client's own figures under the Java ``KafkaShareConsumer``'s
metric group and metric names (Kafka's "Share Consumer Metrics": ``consumer-share-metrics``,
``consumer-share-fetch-manager-metrics``), where queueflow has the same figure. Pure: the
consumer reports what happened, with times from its clock (seconds, monotonic).

Kafka's ``-rate`` metrics are windowed (30 s samples); here a rate is the total divided by the
time since the consumer subscribed, and ``-avg``/``-max`` cover the consumer's whole life.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FETCH_GROUP", "SHARE_GROUP", "ShareConsumerMetrics"]

#: Kafka's metric group of the share consumer's poll metrics.
SHARE_GROUP = "consumer-share-metrics"
#: Kafka's metric group of the share consumer's fetch and acknowledgement metrics.
FETCH_GROUP = "consumer-share-fetch-manager-metrics"


@dataclass(slots=True)
class _Stat:
    """Count, sum and maximum of a series of values."""

    count: int = 0
    total: float = 0.0
    peak: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.peak = max(self.peak, value)

    @property
    def avg(self) -> float:
        return self.total / self.count if self.count else 0.0


@dataclass(slots=True)
class ShareConsumerMetrics:
    """What a ``ShareConsumer`` did, for :meth:`snapshot`.

    Args:
        started: when the consumer was created (seconds, its clock's ``monotonic()``).
    """

    started: float
    records: int = 0
    record_bytes: int = 0
    acknowledgements: int = 0
    acknowledgement_errors: int = 0
    fetch_latency: _Stat = field(default_factory=_Stat)
    records_per_request: _Stat = field(default_factory=_Stat)
    between_polls: _Stat = field(default_factory=_Stat)
    last_poll: float | None = None
    poll_end: float | None = None
    idle_s: float = 0.0  # time spent inside poll() waiting
    busy_s: float = 0.0  # time between polls (the application's)

    def poll_started(self, now: float) -> None:
        """A ``poll()`` began at ``now``."""
        if self.last_poll is not None:
            self.between_polls.add((now - self.last_poll) * 1000)
        if self.poll_end is not None:
            self.busy_s += now - self.poll_end
        self.last_poll = now

    def poll_ended(self, now: float, records: int, record_bytes: int) -> None:
        """A ``poll()`` that began at :attr:`last_poll` returned ``records`` records of
        ``record_bytes`` key and value bytes at ``now``."""
        if self.last_poll is not None:
            self.idle_s += now - self.last_poll
        self.poll_end = now
        self.records += records
        self.record_bytes += record_bytes

    def fetched(self, latency_s: float, records: int) -> None:
        """A ShareFetch answered in ``latency_s`` seconds with ``records`` records."""
        self.fetch_latency.add(latency_s * 1000)
        self.records_per_request.add(records)

    def acknowledged(self, records: int, error: bool) -> None:
        """A leader answered an acknowledgement of ``records`` records (with an error or not)."""
        self.acknowledgements += records
        if error:
            self.acknowledgement_errors += records

    def snapshot(self, now: float) -> dict[str, dict[str, float]]:
        """``{metric group: {metric name: value}}`` at ``now``, e.g.
        ``snapshot(now)["consumer-share-fetch-manager-metrics"]["records-consumed-total"]``.
        Times are in ms except ``last-poll-seconds-ago``; ``-1`` where nothing happened yet
        (``last-poll-seconds-ago`` before the first poll)."""
        elapsed = max(now - self.started, 1e-9)
        cycle = self.idle_s + self.busy_s
        return {
            SHARE_GROUP: {
                "last-poll-seconds-ago": (
                    -1.0 if self.last_poll is None else float(int(now - self.last_poll))
                ),
                "time-between-poll-avg": self.between_polls.avg,
                "time-between-poll-max": self.between_polls.peak,
                "poll-idle-ratio-avg": self.idle_s / cycle if cycle > 0 else 0.0,
            },
            FETCH_GROUP: {
                "records-consumed-total": float(self.records),
                "records-consumed-rate": self.records / elapsed,
                "bytes-consumed-total": float(self.record_bytes),
                "bytes-consumed-rate": self.record_bytes / elapsed,
                "fetch-total": float(self.fetch_latency.count),
                "fetch-rate": self.fetch_latency.count / elapsed,
                "fetch-latency-avg": self.fetch_latency.avg,
                "fetch-latency-max": self.fetch_latency.peak,
                "records-per-request-avg": self.records_per_request.avg,
                "records-per-request-max": self.records_per_request.peak,
                "acknowledgements-send-total": float(self.acknowledgements),
                "acknowledgements-send-rate": self.acknowledgements / elapsed,
                "acknowledgements-error-total": float(self.acknowledgement_errors),
                "acknowledgements-error-rate": self.acknowledgement_errors / elapsed,
            },
        }
