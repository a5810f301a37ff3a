"""Dispatch of a share agent: fetch loops, reservations and acknowledgement sends.

One :class:`Dispatcher` per agent runs :data:`FETCHES_IN_FLIGHT` fetch loops per assigned
share-partition (:meth:`Dispatcher.supervise`). Each round reserves room
(:meth:`Dispatcher.reserve`, :class:`~queueflow.member.flow.FlowControl`), sends one ShareFetch
with the share-partition's pending acknowledgements riding along (KIP-932 "Batching") and
queues what it acquired for the handler runner. Outcomes that would otherwise wait behind a
long poll leave alone (KIP-932 ShareAcknowledge, :meth:`Dispatcher.send_acks_while_parked`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from queueflow.member.flow import Backoff
from queueflow.structs import AcknowledgeType, TopicPartition

if TYPE_CHECKING:
    from queueflow.member.agent.core import ShareAgent

__all__ = ["FETCHES_IN_FLIGHT", "Dispatcher"]

#: ShareFetch loops per assigned share-partition: one can be in flight while the handlers work
#: through the records of the other.
FETCHES_IN_FLIGHT = 2
#: The longest (ms) an idle share-partition's long poll asks its leader to hold it: each empty
#: long poll doubles the wait, from ``fetch.max.wait.ms`` up to this; records reset it. The
#: leader answers a parked ShareFetch as soon as records arrive (KIP-932 long poll), so a
#: longer wait costs no reaction time, only fewer idle round trips (and the leader's lease
#: still caps it).
IDLE_LONG_POLL_MAX_MS = 8_000


class Dispatcher:
    """The fetch loops of one share agent and the room they reserve.

    Args:
        agent: the share agent (its session, flow control, runner and deadlines).
    """

    def __init__(self, agent: ShareAgent) -> None:
        self.agent = agent
        self.backoff = Backoff()
        # Set when the records outstanding drop to the refill level (fetch loops wait on it).
        self.room_free = asyncio.Event()
        self._untimed_reservers = 0  # fetch loops in reserve() waiting without a timeout
        self.fetchers: dict[TopicPartition, list[asyncio.Task[None]]] = {}
        # Monotonic start times of the ShareFetches in flight per share-partition, and set when
        # an outcome was recorded: see send_acks_while_parked.
        self.in_flight: dict[TopicPartition, list[float]] = {}
        self.outcome_recorded = asyncio.Event()
        self._long_polled: dict[TopicPartition, bool] = {}
        #: The next long poll's wait (ms) of share-partitions whose long polls came back empty.
        self._idle_wait_ms: dict[TopicPartition, int] = {}
        #: Share-partitions whose last ShareFetch acquired nothing (see :meth:`reserve`).
        self.idle_partitions: set[TopicPartition] = set()
        self._idle_polls: dict[TopicPartition, asyncio.Lock] = {}  # one long poll at a time
        m, labels = agent.ctx.metrics, (agent.group, agent.topic_name)
        self._delivered = m.delivered.labels(*labels)
        self._redelivered = m.redelivered.labels(*labels)
        self._fetch_seconds = m.share_fetch_seconds.labels(*labels)

    def _linger_s(self) -> float:
        return max(self.agent.ctx.settings.acknowledgement_linger_ms / 1000, 0.005)

    def cancel_fetchers(self) -> None:
        """Cancel every fetch loop (the agent is stopping)."""
        for tasks in self.fetchers.values():
            for task in tasks:
                task.cancel()

    async def end_long_polls(self) -> None:
        """Have the leaders answer this agent's parked ShareFetches now (the agent is
        stopping: its cancelled fetch loops wait for their ShareFetch in flight)."""
        session = self.agent.session
        if session is not None:
            for tp in list(self.fetchers):
                with contextlib.suppress(Exception):  # the leave releases them anyway
                    await session.end_long_polls(tp)

    async def supervise(self) -> None:
        """Start and stop one fetch loop per assigned share-partition; send acknowledgements
        of share-partitions no longer assigned (their records finished after a reassignment)."""
        agent = self.agent
        session = agent.session
        assert session is not None
        while not agent.stopping:
            wanted = set(session.assignment)
            for tp in wanted - set(self.fetchers):
                session.prepare(tp)
                self.fetchers[tp] = [
                    agent.spawn(self.fetch_loop(tp)) for _ in range(FETCHES_IN_FLIGHT)
                ]
            for tp in set(self.fetchers) - wanted:
                tasks = self.fetchers.pop(tp)
                for task in tasks:
                    task.cancel()
                await session.end_long_polls(tp)  # parked fetches: answered now, empty
                # Not awaited here: a cancelled loop finishes its ShareFetch in flight (up to
                # the request timeout), and the other share-partitions' acknowledgements must
                # not wait for it or their locks could expire.
                agent.spawn(self._retire(tp, tasks))
            for tp in session.acks.partitions():
                if tp not in self.fetchers:
                    await self.flush(tp)
            session.assignment_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(session.assignment_changed.wait(), timeout=0.5)

    async def _retire(self, tp: TopicPartition, tasks: list[asyncio.Task[None]]) -> None:
        """Wait for the cancelled fetch loops of a share-partition no longer assigned, then
        close its reader unless it was assigned again meanwhile."""
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if tp not in self.fetchers and self.agent.session is not None:
            await self.agent.session.drop(tp)

    async def reserve(self, tp: TopicPartition, idle: bool) -> int:
        """How many records the next ShareFetch of ``tp`` may acquire.

        An ``idle`` share-partition (its last ShareFetch acquired nothing) asks for
        :meth:`FlowControl.idle_fetch_limit` records at once, outside the room: its fetch
        waits at the leader (long poll), and waiting for room, or holding room while it waits,
        would let one share-partition's empty long polls starve another's records. Its records
        count once delivered. Otherwise (its fetch is answered at once, see
        :meth:`fetch_loop`): wait until the records outstanding drop to half of
        :attr:`high_water` (or until acknowledgements have lingered long enough), then reserve
        the room up to it. A batch is handled as a whole and frees its room only at the end:
        at most half of the room per ShareFetch, so that the other fetch loop acquires the
        next batch meanwhile."""
        # With outcomes pending, woken after the linger period even without room: they must
        # not wait for room (that can take seconds with slow handlers) or their locks expire.
        # With none, it sleeps until room frees or an outcome is recorded (an idle member's
        # second fetch loop, behind a parked long poll, must not wake every linger period).
        agent = self.agent
        linger_s = self._linger_s()
        session, flow, deadlines = agent.session, agent.flow, agent.deadlines
        assert session is not None
        while deadlines.all_stuck and not agent.stopping:
            await deadlines.unstuck.wait()  # no handler could start what this would acquire
        limit = max(flow.high_water // 2, 1) if agent.batch else None
        if idle:
            fetches = max(len(self.fetchers), 1) * FETCHES_IN_FLIGHT
            return min(flow.idle_fetch_limit(fetches), limit or flow.max_poll_records)
        while flow.must_wait():
            self.room_free.clear()
            if not session.acks.pending(tp):
                self._untimed_reservers += 1
                try:
                    await self.room_free.wait()
                finally:
                    self._untimed_reservers -= 1
                continue
            try:
                await asyncio.wait_for(self.room_free.wait(), timeout=linger_s)
            except asyncio.TimeoutError:
                if session.acks.pending(tp):
                    break  # no room, but acknowledgements have waited long enough: send them
        return flow.reserve(limit)

    def unreserve(self, count: int) -> None:
        """``count`` records were settled (or not delivered): free their room."""
        if self.agent.flow.release(count) and not self.room_free.is_set():
            self.room_free.set()
        if count > 0:
            self.outcome_recorded.set()
            self.wake_untimed_reservers()

    def wake_untimed_reservers(self) -> None:
        """An outcome was recorded: fetch loops waiting for room without a timeout start
        their linger period (see :meth:`reserve`)."""
        if self._untimed_reservers and not self.room_free.is_set():
            self.room_free.set()

    async def send_acks_while_parked(self) -> None:
        """Send outcomes alone (KIP-932 ShareAcknowledge), after the linger period, when
        every fetch loop of their share-partition has a ShareFetch in flight (held by the
        leader in a long poll): they would otherwise wait for it (``fetch.max.wait.ms``)."""
        agent = self.agent
        linger_s = self._linger_s()
        while not agent.stopping:
            await self.outcome_recorded.wait()
            self.outcome_recorded.clear()
            await asyncio.sleep(linger_s)
            session = agent.session
            if session is None:
                continue
            # Outcomes still pending were recorded after every fetch in flight was sent (a
            # fetch takes the pending ones along): with all fetch loops in flight, none would
            # leave before a long poll ends.
            # So would an idle share-partition's: its other loop waits for the long poll.
            for tp in session.acks.partitions():
                in_flight = len(self.in_flight.get(tp, ()))
                if in_flight >= FETCHES_IN_FLIGHT or (in_flight and tp in self.idle_partitions):
                    await self.flush(tp)

    async def fetch_loop(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` round after round until the agent stops (or the loop is cancelled)."""
        agent = self.agent
        clock = agent.ctx.clock
        while not agent.stopping:
            idle_until = self.backoff.idle_until(tp)
            if idle_until > clock.monotonic():
                await asyncio.sleep(idle_until - clock.monotonic())
                continue
            # Only an idle share-partition's fetch waits at the leader for records (long
            # poll), one at a time: the other loop waits for it. A busy share-partition's
            # fetches hold room, so they must not wait there: one that finds nothing is
            # answered at once, and the next fetch is an idle one.
            if tp in self.idle_partitions:
                async with self._idle_polls.setdefault(tp, asyncio.Lock()):
                    if tp in self.idle_partitions:  # still, after the other loop's poll
                        await self.fetch_round(tp, idle=True)
                        continue
            await self.fetch_round(tp, idle=False)

    async def fetch_round(self, tp: TopicPartition, idle: bool) -> None:
        """Reserve, send one ShareFetch of ``tp`` (a long poll when ``idle``), queue what it
        brings and settle the reservation."""
        agent = self.agent
        clock = agent.ctx.clock
        want = await self.reserve(tp, idle)
        # Shielded: when the share-partition is reassigned mid-request, the request still
        # completes and its records are handled, instead of staying locked until expiry.
        wait_ms = self._idle_wait_ms.get(tp) if idle else 0
        fetch = asyncio.ensure_future(self.fetch_once(tp, want, wait_ms))
        try:
            delivered = await asyncio.shield(fetch)
        except asyncio.CancelledError:
            delivered = 0
            with contextlib.suppress(Exception):
                delivered = await asyncio.wait_for(
                    fetch, agent.ctx.settings.request_timeout_ms / 1000
                )
            self._settle_reservation(idle, want, delivered)
            raise
        except Exception as exc:  # keep fetching whatever goes wrong; say what it was
            agent.log.warning(
                "share_fetch_failed", topic=tp.topic, partition=tp.partition, error=repr(exc)
            )
            delivered = -1
        self._settle_reservation(idle, want, delivered)
        self._next_wait(tp, delivered)
        # An empty long poll already waited at the leader, and an empty busy fetch is
        # followed by a long poll: no back-off on top of either.
        waited = delivered == 0 and (self._long_polled.pop(tp, False) or not idle)
        self.backoff.observe(tp, clock.monotonic(), delivered, 0 if waited else want)
        if delivered > 0:
            self.idle_partitions.discard(tp)
        else:
            # Idle only if it asked for records and found none: a fetch that only carried
            # acknowledgements (no room) says nothing, and marking the share-partition idle
            # then let its other loop acquire outside the room again and again.
            if want > 0 and delivered == 0:
                self.idle_partitions.add(tp)
            # The loops woken by room just freed reserve first (they wait in order).
            await asyncio.sleep(0)

    def _next_wait(self, tp: TopicPartition, delivered: int) -> None:
        """After a ShareFetch of ``tp`` that queued ``delivered`` records: the next long poll
        waits twice as long if this one was an empty long poll (up to
        :data:`IDLE_LONG_POLL_MAX_MS`), ``fetch.max.wait.ms`` again once records come."""
        if delivered != 0:
            self._idle_wait_ms.pop(tp, None)
        elif self._long_polled.get(tp):
            base = self.agent.ctx.settings.fetch_max_wait_ms
            current = self._idle_wait_ms.get(tp, base)
            self._idle_wait_ms[tp] = max(min(2 * current, IDLE_LONG_POLL_MAX_MS), base)

    def _settle_reservation(self, idle: bool, want: int, delivered: int) -> None:
        """After a ShareFetch that asked for ``want`` records and queued ``delivered`` (-1 on
        an error): give back the room it did not use, or, for an idle share-partition's fetch
        (which reserved none, see :meth:`reserve`), take room for what it delivered."""
        if idle:
            self.agent.flow.take(max(delivered, 0))
        else:
            self.unreserve(want - max(delivered, 0))

    async def fetch_once(
        self, tp: TopicPartition, want: int, max_wait_ms: int | None = None
    ) -> int:
        """One ShareFetch with the pending acknowledgements of ``tp`` riding along; the
        leader may hold it ``max_wait_ms`` (``None``: ``fetch.max.wait.ms``) for records.

        Returns:
            records queued for the handlers (0 when none were acquired), -1 on an error.
        """
        agent = self.agent
        session, runner = agent.session, agent.runner
        assert session is not None
        runner.publish_ack_counts()
        clock = agent.ctx.clock
        started = clock.monotonic()
        in_flight = self.in_flight.setdefault(tp, [])
        in_flight.append(started)
        try:
            result = await session.fetch(tp, want, max_wait_ms)
        finally:
            in_flight.remove(started)
        self._long_polled[tp] = result.long_polled and not result.acquired
        if result.round_trip_s:
            self._fetch_seconds.observe(result.round_trip_s)
        if result.error is not None:
            agent.log.error(
                "share_fetch_error",
                topic=tp.topic,
                partition=tp.partition,
                error=result.error.code.value,
                detail=result.error.message,
            )
            return -1
        if not result.acquired:
            return 0
        if result.undecodable:  # REJECTed by the session, never queued
            agent.stats.undecodable += result.undecodable
            agent.stats.rejected += result.undecodable
        if result.lock_timeout_ms:
            agent.flow.lock_s = result.lock_timeout_ms / 1000
        records = result.records
        agent.flow.observe_fetch_cycle(clock.monotonic() - started)
        redelivered = sum(1 for r in records if r.delivery_count > 1)
        agent.stats.delivered += len(records)
        agent.stats.redelivered += redelivered
        self._delivered.inc(len(records))
        self._redelivered.inc(redelivered)
        if agent.deadlines.all_stuck:  # acquired by a fetch in flight: nobody can start them
            for record in records:
                runner.acknowledge(record, AcknowledgeType.RELEASE)
            agent.stats.released += len(records)
            agent.spawn(self.flush(tp))
            return 0
        if agent.transactions is not None:
            records = agent.transactions.screen(records)
        runner.enqueue(records, result.lock_deadline)
        return len(records)

    async def flush(self, tp: TopicPartition) -> None:
        """Send the pending acknowledgements of ``tp`` now (ShareAcknowledge)."""
        session = self.agent.session
        if session is None:
            return
        error = await session.flush(tp)
        if error is not None and error.code.retriable:
            self.agent.log.warning("acknowledgement_flush_failed", error=str(error))

    async def flush_all(self) -> None:
        """Publish the outcome counters and send every pending acknowledgement now."""
        self.agent.runner.publish_ack_counts()
        session = self.agent.session
        if session is not None:
            for tp in session.acks.partitions():
                await self.flush(tp)
