"""Flow control of a share agent: how many records to keep acquired, and when to fetch more.

Pure and synchronous; the agent feeds it measurements (seconds) and asks it how many records a
ShareFetch may acquire. KIP-932 leaves batch sizes to the client (``max.poll.records``); a share
agent sizes them so that every handler stays busy while the next ShareFetch is on its way, and
no record waits in the queue until its acquisition lock expires.
"""

from __future__ import annotations

__all__ = ["Backoff", "FlowControl"]

#: Start values (s) of the moving averages: conservative, so the first batches are small.
INITIAL_HANDLER_S = 0.1
INITIAL_FETCH_CYCLE_S = 0.005


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
        #: Moving averages (s) of one handler call and of one ShareFetch cycle (round trip
        #: plus reading the records).
        self.handler_s = INITIAL_HANDLER_S
        self.fetch_cycle_s = INITIAL_FETCH_CYCLE_S
        #: Records reserved by fetches or queued or being handled.
        self.outstanding = 0
        #: The refill threshold computed when a fetch loop last looked (see :meth:`must_wait`).
        self.refill_level = 0

    @property
    def high_water(self) -> int:
        """Records this agent keeps acquired at most.

        Enough to keep every handler busy while the next ShareFetch is on its way (a refill
        starts at half of it): three times the records the handlers complete in one ShareFetch
        cycle, plus two per handler; at least ``2 * concurrency`` and at most
        ``max.poll.records``. Fast handlers get large batches (throughput); slow ones get small
        batches, so locks stay short and members sharing a partition share its records fairly.
        Never more than the handlers get through in half the acquisition lock duration, so that
        a record is not still queued when its lock expires (a slow ShareFetch, say while the
        broker restarts, would otherwise inflate the batch).
        """
        rate = self.concurrency / max(self.handler_s, 1e-6)  # records per second
        wanted = int(3 * rate * self.fetch_cycle_s) + 2 * self.concurrency
        wanted = min(wanted, int(rate * self.lock_s / 2), self.max_poll_records)
        return max(2 * self.concurrency, wanted)

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
        """Feed one handler call's duration (s) into the moving average."""
        self.handler_s += 0.05 * (seconds - self.handler_s)

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
