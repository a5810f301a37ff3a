"""Flow control of a share agent: how many records to keep acquired, and when to fetch more.

Pure and synchronous; the agent feeds it measurements (seconds) and asks it how many records a
ShareFetch may acquire. KIP-932 leaves batch sizes to the client (``max.poll.records``); a share
agent sizes them so that every handler stays busy while the next ShareFetch is on its way, and
no record waits in the queue until its acquisition lock expires: it never holds more records
than its measured handling rate gets through in a part of the lock duration
(:func:`acquisition_limit`), and records it would still not start in time are given back
(:mod:`queueflow.member.agent.giveback`). docs/concepts.md "Adaptive acquisition".
"""

from __future__ import annotations

__all__ = ["LOCK_USE", "Backoff", "FlowControl", "acquisition_limit"]

#: Start values (s) of the moving averages: conservative, so the first batches are small.
INITIAL_HANDLER_S = 0.1
INITIAL_FETCH_CYCLE_S = 0.005
#: The share of the acquisition lock duration the records held may take to start, at the
#: measured handling rate: the rest is slack for a slower stretch, the ShareFetch round trip and
#: the lock margin (records still queued two lock margins before their lock ends are given back).
LOCK_USE = 0.5
#: Moving-average weights of a handler call's time per record: a slowdown counts at once, a
#: speed-up slowly (holding too many records costs expired locks, too few only some throughput).
SLOWER_WEIGHT = 0.5
FASTER_WEIGHT = 0.05
#: Throughput samples: records finished over at least this many seconds (s) of busy handlers.
RATE_WINDOW_S = 0.25
#: Moving-average weights of the measured throughput (records/s): down fast, up slowly.
RATE_DOWN_WEIGHT = 0.7
#: Seconds (s) of handler calls ending with no record waiting after which the measured rate
#: moves a step back towards the nominal one.
RATE_DRIFT_S = 1.0
RATE_UP_WEIGHT = 0.25


def acquisition_limit(
    rate: float,
    lock_s: float,
    concurrency: int,
    max_poll_records: int,
    fetch_cycle_s: float = INITIAL_FETCH_CYCLE_S,
    lock_use: float = LOCK_USE,
) -> int:
    """The most records a share agent keeps acquired (reserved, queued or being handled).

    Enough to keep every handler busy while the next ShareFetch is on its way (three times the
    records the handlers finish in one ShareFetch cycle, plus two per handler), but never more
    than the handlers get through in ``lock_use`` of the acquisition lock duration at the
    measured rate (a record held longer would wait in the queue until its lock expires), never
    more than ``max.poll.records`` and never below 1.

    Args:
        rate: records per second this agent's handlers finish (measured, smoothed).
        lock_s: the acquisition lock duration (s, ``group.share.record.lock.duration.ms``).
        concurrency: handler tasks.
        max_poll_records: ``max.poll.records``.
        fetch_cycle_s: one ShareFetch cycle (s: round trip plus reading the records).
        lock_use: the share of the lock duration (0..1], :data:`LOCK_USE`.
    """
    rate = max(rate, 0.0)
    busy = int(3 * rate * max(fetch_cycle_s, 0.0)) + 2 * concurrency
    within_lock = int(rate * max(lock_s, 0.0) * lock_use)
    return max(1, min(busy, within_lock, max_poll_records))


class FlowControl:
    """Records outstanding (acquired, not yet acknowledged) in one share agent, and its limit.

    Args:
        concurrency: handler tasks.
        max_poll_records: the most records one ShareFetch may acquire (``max.poll.records``).
        lock_s: the acquisition lock duration in seconds, until a leader says otherwise.
    """

    def __init__(self, concurrency: int, max_poll_records: int, lock_s: float) -> None:
        self.concurrency = concurrency
        self.max_poll_records = max_poll_records
        #: Acquisition lock duration (s), as the leaders last said.
        self.lock_s = lock_s
        #: Moving averages (s) of one handler call per record and of one ShareFetch cycle
        #: (round trip plus reading the records).
        self.handler_s = INITIAL_HANDLER_S
        self.fetch_cycle_s = INITIAL_FETCH_CYCLE_S
        #: Records per second the handlers finished while they had work waiting (smoothed);
        #: 0 until measured. Lower than ``concurrency / handler_s`` when the calls don't run
        #: side by side (a handler blocking the event loop, CPU shared with other processes).
        self.measured_rate = 0.0
        self._last_done: float | None = None
        self._last_saturated = False
        self._window_records = 0
        self._window_s = 0.0
        self._idle_s = 0.0
        #: Records reserved by fetches or queued or being handled.
        self.outstanding = 0
        #: The refill threshold computed when a fetch loop last looked (see :meth:`must_wait`).
        self.refill_level = 0

    @property
    def rate(self) -> float:
        """Records per second this agent's handlers get through: ``concurrency`` calls of
        :attr:`handler_s` each, or the measured throughput when that is lower."""
        nominal = self.concurrency / max(self.handler_s, 1e-6)
        return min(nominal, self.measured_rate) if self.measured_rate else nominal

    @property
    def high_water(self) -> int:
        """Records this agent keeps acquired at most: :func:`acquisition_limit` at
        :attr:`rate`. Fast handlers get large batches (throughput); slow ones get small
        batches, so locks stay short and members sharing a partition share its records
        fairly; a slow ShareFetch (say while the broker restarts) can't inflate the batch past
        what the handlers start within the lock."""
        return acquisition_limit(
            self.rate, self.lock_s, self.concurrency, self.max_poll_records, self.fetch_cycle_s
        )

    def must_wait(self) -> bool:
        """True while the records outstanding are above half of :attr:`high_water`: a fetch
        loop waits for room (refilling at half keeps a ShareFetch in flight while the handlers
        work through the previous batch, without splitting work into one-record fetches)."""
        self.refill_level = self.high_water // 2
        return self.outstanding > self.refill_level

    def reserve(self, limit: int | None = None) -> int:
        """Reserve room up to :attr:`high_water` (and at most ``limit`` records); returns how
        many records to acquire."""
        want = min(max(self.high_water - self.outstanding, 0), self.max_poll_records)
        if limit is not None:
            want = min(want, max(limit, 0))
        self.outstanding += want
        return want

    def take(self, count: int) -> None:
        """Count ``count`` records delivered without a reservation (an idle share-partition's
        ShareFetch, see :meth:`idle_fetch_limit`) as outstanding."""
        self.outstanding += count

    def idle_fetch_limit(self, fetches: int) -> int:
        """The most records a ShareFetch of an idle share-partition (whose last ShareFetch
        acquired nothing) asks for, with ``fetches`` fetch loops in all.

        Such a fetch reserves no room (it mostly waits at the leader, and must not wait for
        room behind a busy share-partition): what it delivers is counted afterwards
        (:meth:`take`). Even if every fetch loop were answered at once with this many records,
        they would add at most half of :attr:`high_water`; and no more than the room left, but
        at least one record each (an idle share-partition is never starved by a busy one).
        """
        share = self.high_water // (2 * max(fetches, 1))
        return max(min(share, self.high_water - self.outstanding), 1)

    def release(self, count: int) -> bool:
        """Give back ``count`` reserved records (handled, or never acquired).

        Returns:
            True when the outstanding records dropped to the refill level a waiting fetch loop
            computed: it should wake.
        """
        if not count:
            return False
        self.outstanding -= count
        return self.outstanding <= self.refill_level

    def observe_handler(self, seconds: float) -> None:
        """Feed one handler call's time per record (s) into the moving average (a slower call
        weighs :data:`SLOWER_WEIGHT`, a faster one :data:`FASTER_WEIGHT`)."""
        weight = SLOWER_WEIGHT if seconds > self.handler_s else FASTER_WEIGHT
        self.handler_s += weight * (seconds - self.handler_s)

    def observe_handled(self, seconds: float, records: int, now: float, waiting: int) -> None:
        """A handler call on ``records`` records ended at monotonic time ``now`` (s) after
        ``seconds`` (s), with ``waiting`` records still queued for a handler.

        Feeds :meth:`observe_handler` and the measured throughput: the records finished
        between two calls' ends while records were waiting (every handler busy), over windows
        of at least :data:`RATE_WINDOW_S`. While no handler waited for work the throughput says
        nothing about the handlers, and the measured rate drifts back towards the nominal one
        (``concurrency / handler_s``), so a low measurement doesn't keep batches small for good.
        """
        self.observe_handler(seconds / max(records, 1))
        last, self._last_done = self._last_done, now
        if last is not None:
            if self._last_saturated:
                self._window_records += records
                self._window_s += max(now - last, 0.0)
            else:
                self._idle_s += max(now - last, 0.0)
        self._last_saturated = waiting > 0
        if self._window_s >= RATE_WINDOW_S:
            sample = self._window_records / self._window_s
            if not self.measured_rate:
                self.measured_rate = sample
            else:
                weight = RATE_DOWN_WEIGHT if sample < self.measured_rate else RATE_UP_WEIGHT
                self.measured_rate += weight * (sample - self.measured_rate)
            self._window_records, self._window_s, self._idle_s = 0, 0.0, 0.0
        elif self._idle_s >= RATE_DRIFT_S and self.measured_rate:
            nominal = self.concurrency / max(self.handler_s, 1e-6)
            self.measured_rate += RATE_UP_WEIGHT * (nominal - self.measured_rate)
            self._idle_s = 0.0

    def start_delay_s(self, ahead: int) -> float:
        """Seconds (s) until a queued record starts, with ``ahead`` records queued before it
        and every handler busy: ``(ahead + 1) / rate`` (:attr:`rate`)."""
        return (ahead + 1) / max(self.rate, 1e-6)

    def observe_fetch_cycle(self, seconds: float) -> None:
        """Feed one ShareFetch cycle's duration (s: round trip plus read) into the average."""
        self.fetch_cycle_s += 0.2 * (seconds - self.fetch_cycle_s)


class Backoff:
    """Exponential back-off per share-partition after empty or failed ShareFetches.

    Shared by a share-partition's fetch loops, so an idle share-partition costs one request per
    back-off period, not one per loop.

    Args:
        initial_s: the first back-off (s).
        idle_max_s: the longest back-off after empty answers (s).
        error_max_s: the longest back-off after errors (s).
    """

    def __init__(
        self, initial_s: float = 0.005, idle_max_s: float = 0.2, error_max_s: float = 1.0
    ) -> None:
        self.initial_s = initial_s
        self.idle_max_s = idle_max_s
        self.error_max_s = error_max_s
        self._next: dict[object, float] = {}
        self._until: dict[object, float] = {}

    def idle_until(self, key: object) -> float:
        """The monotonic time (s) before which ``key`` should not fetch (0 if none)."""
        return self._until.get(key, 0.0)

    def observe(self, key: object, now: float, delivered: int, wanted: int) -> None:
        """Record a fetch's outcome at monotonic time ``now`` (s).

        Args:
            delivered: records delivered (> 0 resets the back-off), 0 for none, < 0 for an error.
            wanted: records asked for (an acknowledgement-only request that got none is no
                reason to back off).
        """
        if delivered > 0:
            self._next[key] = self.initial_s
        elif wanted or delivered < 0:
            backoff = self._next.get(key, self.initial_s)
            self._until[key] = now + backoff
            limit = self.error_max_s if delivered < 0 else self.idle_max_s
            self._next[key] = min(backoff * 2, limit)
