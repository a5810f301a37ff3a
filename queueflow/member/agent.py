"""``@share_agent``: a handler that processes records of a share group, one outcome per record.

A :class:`ShareAgent` joins the share group as a member, runs one fetch loop per assigned
share-partition and ``concurrency`` handler tasks, and acknowledges every record with the
handler's outcome (per record, or per batch with ``batch=True``: see below):

==============================  ==========================================================
handler does                    outcome
==============================  ==========================================================
returns ``None`` or ``ACCEPT``  ACCEPT: the record is Acknowledged
returns ``RELEASE``             RELEASE: delivered again (Archived at the delivery limit)
returns ``REJECT``              REJECT: Archived, never delivered again
raises                          RELEASE, with an error log line naming the record
returns anything else           RELEASE, with an error log line saying what was returned
value can't be deserialized     REJECT, with an error log line
runs past its deadline          cancelled; RELEASE, with an error log line
==============================  ==========================================================

A handler call's deadline is its record's acquisition lock deadline minus a margin (a tenth of
the lock duration, between two acknowledgement lingers and 1 s), or ``handler_timeout_ms``
after it started when that is sooner. A call still running then is cancelled and its record
RELEASEd while the lock still holds, so the leader can deliver it again at once. A record
whose lock ends within that margin when a handler is free is not started at all: it is RELEASEd
unhandled (log ``acquisition_lock_expired_before_handling``), because its outcome would reach
the leader after the lock elapsed and the record would be handled twice. When
``handler_timeout_ms`` is set and the group allows RENEW (``share.renew.acknowledge.enable``,
KIP-1222), the lock no longer bounds the call: a lock margin before it elapses the agent RENEWs
the call's records (log ``handler_locks_renewed``), as often as needed, and the call is
cancelled only at ``handler_timeout_ms`` (or at the lock, if a RENEW is refused). A handler that
ignores the cancellation (catches ``CancelledError``, or blocks the event loop) is *stuck*;
when every handler task is stuck, the member RELEASEs the records queued for them and acquires
nothing until one returns (log ``share_agent_handlers_stuck``, gauge
``queueflow_share_agent_stuck_handlers``), so nothing waits behind a hung handler.

Acknowledgements are batched per share-partition and ride along with that share-partition's next
ShareFetch; one batch is applied atomically by the leader (all through its
:class:`~queueflow.member.session.ShareFetchSession`). Faust's own offset tracking is not used at
all (see faust-streaming issue #606). The host (:mod:`queueflow.faust_app`) starts and stops the
agent with the worker.

Batch handlers (``batch=True``): ``async def handler(records: list[ShareRecord])`` is called
with the records of one ShareFetch (at most ``batch_size`` of them when set; a larger ShareFetch
is split into several calls) and returns one outcome per record, in order, or one outcome for
the whole batch. Every record then gets exactly the outcome the per-record path would give it:

=================================================  ===============================================
handler does                                       outcome of each record of the batch
=================================================  ===============================================
returns a sequence of ``len(records)`` outcomes    that record's outcome (``None`` means ACCEPT)
returns one outcome (or ``None``)                  that outcome
raises                                             RELEASE, as a raising per-record handler; one
                                                   error log line for the batch
returns anything else (wrong length or type)       RELEASE, as an invalid per-record outcome; one
                                                   error log line naming the agent, what was
                                                   returned and what was expected
=================================================  ===============================================

Records that can't be decoded are REJECTed before the call and left out of ``records``, and
records whose acquisition lock expired (or ends within the margin) while queued are released
unhandled, both exactly as on the per-record path (the handler is not called when none is
left).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import structlog

from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.member.context import MemberContext
from queueflow.member.flow import Backoff, FlowControl
from queueflow.member.session import ShareFetchSession, ranges_text
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

__all__ = [
    "FETCHES_IN_FLIGHT",
    "AgentStats",
    "BatchHandler",
    "Decoder",
    "Handler",
    "RecordHandler",
    "ShareAgent",
    "batch_outcomes",
    "outcome_of",
]

log = structlog.get_logger("queueflow.member.agent")

#: ``async def handler(record) -> ACCEPT | RELEASE | REJECT | None``.
RecordHandler = Callable[[ShareRecord], Awaitable[Any]]
#: ``async def handler(records) -> Sequence[ACCEPT | RELEASE | REJECT | None]`` (one per record,
#: in order) or one ``ACCEPT | RELEASE | REJECT | None`` for the whole batch (``batch=True``).
BatchHandler = Callable[[list[ShareRecord]], Awaitable[Any]]
#: What a share agent runs: a :data:`RecordHandler`, or a :data:`BatchHandler` with ``batch=True``.
Handler = RecordHandler | BatchHandler
#: Replaces ``record.value`` (and ``record.key``) by their decoded form; raises if it can't.
Decoder = Callable[[ShareRecord], None]
#: ShareFetch loops per assigned share-partition: one can be in flight while the handlers work
#: through the records of the other.
FETCHES_IN_FLIGHT = 2
#: Real seconds between the watchdog's checks of running handler calls against their deadlines
#: (it sleeps while no handler runs).
HANDLER_WATCH_INTERVAL_S = 0.1
#: How long (s) stop() waits for its tasks after cancelling them; a handler that ignores
#: cancellation is abandoned then (its record's lock expires at the leader).
STOP_TASKS_TIMEOUT_S = 5.0
_OUTCOMES = (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT)


def outcome_of(result: Any) -> AcknowledgeType | None:
    """Map a handler's return value to an acknowledge type; ``None`` if it is not one."""
    if result is None:
        return AcknowledgeType.ACCEPT
    if isinstance(result, AcknowledgeType) and result in _OUTCOMES:
        return result
    return None


def batch_outcomes(result: Any, count: int) -> list[AcknowledgeType] | AcknowledgeType | None:
    """Map a batch handler's return value for ``count`` records to their outcomes.

    Args:
        result: what the handler returned: a sequence (not ``str``/``bytes``) of ``count``
            outcomes (``ACCEPT``, ``RELEASE``, ``REJECT`` or ``None`` each), or one of those for
            the whole batch.
        count: the records the handler was called with.

    Returns:
        One outcome per record, in order; a single outcome for all of them; or ``None`` when
        ``result`` is none of the above (wrong length, an element that is not an outcome, or
        another type). Never raises.
    """
    single = outcome_of(result)
    if single is not None:
        return single
    if not isinstance(result, Sequence) or isinstance(result, (str, bytes, bytearray)):
        return None
    if len(result) != count:
        return None
    outcomes: list[AcknowledgeType] = []
    append = outcomes.append
    accept = AcknowledgeType.ACCEPT
    for item in result:
        if item is None:
            append(accept)
        elif isinstance(item, AcknowledgeType) and item in _OUTCOMES:
            append(item)
        else:
            return None
    return outcomes


class AgentStats:
    """Counters of one share agent in this process.

    ``lock_expired``: records released unhandled because their acquisition lock expired while
    they waited for a handler; ``acks_dropped``: outcomes the leader refused as stale;
    ``handler_timeouts``: records RELEASEd because their handler call passed its deadline;
    ``renewed``: record lock renewals (RENEW) sent for handler calls still running.
    """

    def __init__(self) -> None:
        self.delivered = 0
        self.accepted = 0
        self.released = 0
        self.rejected = 0
        self.redelivered = 0
        self.handler_errors = 0
        self.undecodable = 0
        self.lock_expired = 0
        self.acks_dropped = 0
        self.handler_timeouts = 0
        self.renewed = 0

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return dict(vars(self))


class ShareAgent:
    """A share-group member that runs ``handler`` on each record, or on batches of records.

    Args:
        ctx: the member context of the app.
        handler: ``async def handler(record: ShareRecord) -> ACCEPT | RELEASE | REJECT | None``;
            with ``batch=True``, ``async def handler(records: list[ShareRecord]) ->
            Sequence[ACCEPT | RELEASE | REJECT | None]`` (one outcome per record, in order) or a
            single outcome for the whole batch (see the module docstring for every case).
        topic: the source topic name.
        group: the share group id.
        concurrency: handler tasks in this process (concurrent handler calls: with
            ``batch=True``, batches handled at once).
        name: the agent's name (defaults to the handler's qualified name).
        lock_duration_ms: this member's acquisition lock duration (ms), bounded by
            ``group.share.max.record.lock.duration.ms``; ``None`` uses the group's.
        decode: decodes each record before the handler sees it (None: raw bytes).
        client_id: the Kafka client id (defaults to the agent's name).
        batch: call ``handler`` with a list of records (the records of one ShareFetch) instead
            of once per record.
        batch_size: with ``batch=True``, the most records per handler call (``None``: the
            records of one ShareFetch, at most ``max.poll.records``).
        handler_timeout_ms: cancel a handler call (and RELEASE its records) this many ms after
            it started; ``None``: only when its records' acquisition lock is about to expire
            (see the module docstring). When set and the group allows RENEW
            (``share.renew.acknowledge.enable``), the records' locks are renewed (KIP-1222)
            while the call runs, up to this timeout.

    Raises:
        ConfigurationError: concurrency < 1, batch_size < 1 or set without ``batch=True``,
            handler_timeout_ms < 1, or a lock duration out of range (at declaration); an unknown
            topic (at :meth:`start`).
    """

    def __init__(
        self,
        ctx: MemberContext,
        handler: Handler,
        topic: str,
        group: str,
        concurrency: int = 1,
        name: str | None = None,
        lock_duration_ms: int | None = None,
        decode: Decoder | None = None,
        client_id: str | None = None,
        batch: bool = False,
        batch_size: int | None = None,
        handler_timeout_ms: int | None = None,
    ) -> None:
        if handler_timeout_ms is not None and handler_timeout_ms < 1:
            raise ConfigurationError(
                f"share_agent handler_timeout_ms={handler_timeout_ms}; must be >= 1 (ms), or "
                "None to bound handler calls by their records' acquisition locks only"
            )
        if concurrency < 1:
            raise ConfigurationError(f"share_agent concurrency={concurrency}; must be >= 1")
        if batch_size is not None and not batch:
            raise ConfigurationError(
                f"share_agent batch_size={batch_size} needs batch=True (a batch handler)"
            )
        if batch_size is not None and batch_size < 1:
            raise ConfigurationError(f"share_agent batch_size={batch_size}; must be >= 1")
        settings = ctx.settings
        low, high = settings.min_record_lock_duration_ms, settings.max_record_lock_duration_ms
        if lock_duration_ms is not None and not low <= lock_duration_ms <= high:
            raise ConfigurationError(
                f"share_agent lock_duration_ms={lock_duration_ms} is out of range; allowed "
                f"[{low}..{high}] (group.share.min.record.lock.duration.ms .. "
                "group.share.max.record.lock.duration.ms)"
            )
        self.ctx = ctx
        self.handler = handler
        # The same callable, typed for each path.
        self._call_record = cast(RecordHandler, handler)
        self._call_batch = cast(BatchHandler, handler)
        self.topic_name = topic
        self.group = group
        self.concurrency = concurrency
        self.name = name or f"{handler.__module__}.{handler.__qualname__}"
        self.lock_duration_ms = lock_duration_ms
        self.decode = decode
        self.client_id = client_id or self.name
        self.batch = batch
        self.batch_size = batch_size
        self.handler_timeout_ms = handler_timeout_ms
        self.stats = AgentStats()
        self.session: ShareFetchSession | None = None
        self.flow = FlowControl(
            concurrency,
            settings.max_poll_records,
            (lock_duration_ms or settings.record_lock_duration_ms) / 1000,
        )
        self._backoff = Backoff()
        # Records waiting for a handler; workers wait on _queued when it is empty (a deque and
        # an event: asyncio.Queue's per-item wake-ups cost more than a no-op handler).
        self._queue: collections.deque[ShareRecord] = collections.deque()
        # With batch=True: batches (the records of one ShareFetch, split by batch_size) instead.
        self._batches: collections.deque[list[ShareRecord]] = collections.deque()
        self._queued = asyncio.Event()
        # Set when the records outstanding drop to the refill level (fetch loops wait on it).
        self._room_free = asyncio.Event()
        self._untimed_reservers = 0  # fetch loops in _reserve waiting without a timeout
        self._fetchers: dict[TopicPartition, list[asyncio.Task[None]]] = {}
        # Monotonic start times of the ShareFetches in flight per share-partition, and set when
        # an outcome was recorded: see _send_acks_while_parked.
        self._in_flight: dict[TopicPartition, list[float]] = {}
        self._outcome_recorded = asyncio.Event()
        self._long_polled: dict[TopicPartition, bool] = {}
        # Share-partitions whose last ShareFetch acquired nothing (see _reserve).
        self._idle_partitions: set[TopicPartition] = set()
        self._idle_polls: dict[TopicPartition, asyncio.Lock] = {}  # one long poll at a time
        self._tasks: set[asyncio.Task[None]] = set()
        self._workers: list[asyncio.Task[None]] = []
        self._busy = 0  # handler calls in progress
        # One per handler task: the call it runs, watched by _watch_handlers.
        self._calls = [_HandlerCall() for _ in range(concurrency)]
        self._handlers_busy = asyncio.Event()  # wakes the watchdog
        self._all_stuck = False
        self._unstuck = asyncio.Event()  # set when a stuck handler returns
        self._stuck_gauge = ctx.metrics.stuck_handlers.labels(group, topic)
        self._idle = asyncio.Event()  # set when _busy drops to 0 while stopping
        self._stopping = False
        self._stopped = False
        self._log = log.bind(group=group, topic=topic, agent=self.name)
        m, labels = ctx.metrics, (group, topic)
        self._delivered = m.delivered.labels(*labels)
        self._redelivered = m.redelivered.labels(*labels)
        self._fetch_seconds = m.share_fetch_seconds.labels(*labels)
        self._ack_latency = m.ack_latency_seconds.labels(*labels)
        self._lock_expired = m.lock_expired_unhandled.labels(*labels)
        self._last_expired_deadline = 0.0  # one log line per expired batch, not per record
        self._acknowledged = {
            kind: m.acknowledgements.labels(*labels, kind.name.lower()) for kind in _OUTCOMES
        }
        self._ack_counts = dict.fromkeys(_OUTCOMES, 0)  # published per ShareFetch

    def __call__(self, record: Any) -> Awaitable[Any]:
        """Call the handler directly (for unit tests of the handler itself): with a
        :class:`ShareRecord`, or with a list of them for a batch handler."""
        return cast(Callable[[Any], Awaitable[Any]], self.handler)(record)

    @property
    def high_water(self) -> int:
        """Records this process keeps acquired at most (see :attr:`FlowControl.high_water`)."""
        return self.flow.high_water

    @property
    def member_id(self) -> str | None:
        """This member's id once started."""
        return None if self.session is None else self.session.member_id

    # -- lifecycle -------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self) -> None:
        """Join the share group and start the fetch loops and handler tasks.

        A join no coordinator answered within ``queueflow.member.join.timeout.ms`` is logged
        (``share_agent_join_failed``) and tried again: in a worker, the app's leader workers
        may still be starting. A ShareConsumer fails instead.

        Raises:
            ConfigurationError: the topic does not exist, or the app's internal topics don't
                (a wrong app id, or no leader worker ever ran).
            ShareGroupError: the coordinator refused the join.
        """
        while True:
            self.session = ShareFetchSession(
                self.ctx, self.group, [self.topic_name], self.client_id, self.lock_duration_ms
            )
            try:
                await self.session.start()
                break
            except ShareGroupError as exc:
                retry = exc.code is ErrorCode.REQUEST_TIMED_OUT and not self._stopping
                if retry:  # said first: closing the clients may be slow with the broker gone
                    self._log.error(
                        "share_agent_join_failed",
                        error=str(exc),
                        note="trying again; a worker of the app with role 'all' or 'leader' "
                        "must be running",
                    )
                await self.session.close(leave=False)
                if not retry:
                    raise
        self._log = self._log.bind(member_id=self.session.member_id)  # known once joined
        worker = self._batch_worker if self.batch else self._worker
        self._workers = [self._spawn(worker(i)) for i in range(self.concurrency)]
        self._spawn(self._supervise())
        self._spawn(self._send_acks_while_parked())
        self._spawn(self._watch_handlers())
        self._log.info(
            "share_agent_started",
            concurrency=self.concurrency,
            batch=self.batch,
            batch_size=self.batch_size,
        )

    async def stop(self) -> None:
        """Graceful drain (seed 004): stop fetching, let running handlers finish within
        ``queueflow.shutdown.timeout.ms``, release what was not started, flush acknowledgements
        and leave the group (the leaders release anything still held)."""
        if self._stopped:
            return
        self._stopped = True
        clock = self.ctx.clock
        started = clock.monotonic()
        self._stopping = True
        for tasks in self._fetchers.values():
            for task in tasks:
                task.cancel()
        self._release_queued()
        if self._busy:
            timeout = self.ctx.settings.shutdown_timeout_ms / 1000
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except asyncio.TimeoutError:
                # Those handlers are cancelled below (CancelledError); their records go back
                # when the member leaves.
                self._log.warning("drain_timeout", unfinished=self._busy, timeout_s=timeout)
        self._release_queued()  # records of a ShareFetch that completed meanwhile
        await self._flush_all()
        if self.session is not None:
            await self.session.close(leave=True)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, abandoned = await asyncio.wait(tasks, timeout=STOP_TASKS_TIMEOUT_S)
            if abandoned:  # handlers that ignore cancellation: their locks expire
                self._log.error("share_agent_tasks_abandoned", tasks=len(abandoned))
        drain_s = clock.monotonic() - started
        self.ctx.metrics.drain_seconds.labels(self.group, self.name).set(drain_s)
        if self.session is not None:
            self.stats.acks_dropped = self.session.acks_dropped
        self._log.info("share_agent_drained", drain_ms=int(drain_s * 1000), **self.stats.as_dict())

    def _acknowledge(self, record: ShareRecord, kind: AcknowledgeType) -> None:
        if record.delivered_at and kind is not AcknowledgeType.RENEW:
            self._ack_latency.observe(self.ctx.clock.monotonic() - record.delivered_at)
        if self.session is not None:
            self.session.acknowledge(
                TopicPartition(record.topic, record.partition), record.offset, kind
            )

    def _release_queued(self) -> int:
        """RELEASE every record waiting for a handler; returns how many."""
        released = 0
        while self._queue:
            self._acknowledge(self._queue.popleft(), AcknowledgeType.RELEASE)
            released += 1
        while self._batches:
            for record in self._batches.popleft():
                self._acknowledge(record, AcknowledgeType.RELEASE)
                released += 1
        self.stats.released += released
        self._wake_untimed_reservers()
        return released

    # -- fetching --------------------------------------------------------------------------
    async def _supervise(self) -> None:
        """Start and stop one fetch loop per assigned share-partition; send acknowledgements
        of share-partitions no longer assigned (their records finished after a reassignment)."""
        session = self.session
        assert session is not None
        while not self._stopping:
            wanted = set(session.assignment)
            for tp in wanted - set(self._fetchers):
                session.prepare(tp)
                self._fetchers[tp] = [
                    self._spawn(self._fetch_loop(tp)) for _ in range(FETCHES_IN_FLIGHT)
                ]
            for tp in set(self._fetchers) - wanted:
                tasks = self._fetchers.pop(tp)
                for task in tasks:
                    task.cancel()
                await session.end_long_polls(tp)  # parked fetches: answered now, empty
                # Not awaited here: a cancelled loop finishes its ShareFetch in flight (up to
                # the request timeout), and the other share-partitions' acknowledgements must
                # not wait for it or their locks could expire.
                self._spawn(self._retire(tp, tasks))
            for tp in session.acks.partitions():
                if tp not in self._fetchers:
                    await self._flush(tp)
            session.assignment_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(session.assignment_changed.wait(), timeout=0.5)

    async def _retire(self, tp: TopicPartition, tasks: list[asyncio.Task[None]]) -> None:
        """Wait for the cancelled fetch loops of a share-partition no longer assigned, then
        close its reader unless it was assigned again meanwhile."""
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if tp not in self._fetchers and self.session is not None:
            await self.session.drop(tp)

    async def _reserve(self, tp: TopicPartition, idle: bool) -> int:
        """How many records the next ShareFetch of ``tp`` may acquire.

        An ``idle`` share-partition (its last ShareFetch acquired nothing) asks for
        :meth:`FlowControl.idle_fetch_limit` records at once, outside the room: its fetch
        waits at the leader (long poll), and waiting for room, or holding room while it waits,
        would let one share-partition's empty long polls starve another's records. Its records
        count once delivered. Otherwise (its fetch is answered at once, see
        :meth:`_fetch_loop`): wait until the records outstanding drop to half of
        :attr:`high_water` (or until acknowledgements have lingered long enough), then reserve
        the room up to it. A batch is handled as a whole and frees its room only at the end:
        at most half of the room per ShareFetch, so that the other fetch loop acquires the
        next batch meanwhile."""
        # With outcomes pending, woken after the linger period even without room: they must
        # not wait for room (that can take seconds with slow handlers) or their locks expire.
        # With none, it sleeps until room frees or an outcome is recorded (an idle member's
        # second fetch loop, behind a parked long poll, must not wake every linger period).
        linger_s = max(self.ctx.settings.acknowledgement_linger_ms / 1000, 0.005)
        session = self.session
        assert session is not None
        while self._all_stuck and not self._stopping:
            await self._unstuck.wait()  # no handler could start what this would acquire
        limit = max(self.flow.high_water // 2, 1) if self.batch else None
        if idle:
            fetches = max(len(self._fetchers), 1) * FETCHES_IN_FLIGHT
            return min(self.flow.idle_fetch_limit(fetches), limit or self.flow.max_poll_records)
        while self.flow.must_wait():
            self._room_free.clear()
            if not session.acks.pending(tp):
                self._untimed_reservers += 1
                try:
                    await self._room_free.wait()
                finally:
                    self._untimed_reservers -= 1
                continue
            try:
                await asyncio.wait_for(self._room_free.wait(), timeout=linger_s)
            except asyncio.TimeoutError:
                if session.acks.pending(tp):
                    break  # no room, but acknowledgements have waited long enough: send them
        return self.flow.reserve(limit)

    def _unreserve(self, count: int) -> None:
        if self.flow.release(count) and not self._room_free.is_set():
            self._room_free.set()
        if count > 0:
            self._outcome_recorded.set()
            self._wake_untimed_reservers()

    def _wake_untimed_reservers(self) -> None:
        """An outcome was recorded: fetch loops waiting for room without a timeout start
        their linger period (see :meth:`_reserve`)."""
        if self._untimed_reservers and not self._room_free.is_set():
            self._room_free.set()

    async def _send_acks_while_parked(self) -> None:
        """Send outcomes alone (KIP-932 ShareAcknowledge), after the linger period, when
        every fetch loop of their share-partition has a ShareFetch in flight (held by the
        leader in a long poll): they would otherwise wait for it (``fetch.max.wait.ms``)."""
        linger_s = max(self.ctx.settings.acknowledgement_linger_ms / 1000, 0.005)
        while not self._stopping:
            await self._outcome_recorded.wait()
            self._outcome_recorded.clear()
            await asyncio.sleep(linger_s)
            session = self.session
            if session is None:
                continue
            # Outcomes still pending were recorded after every fetch in flight was sent (a
            # fetch takes the pending ones along): with all fetch loops in flight, none would
            # leave before a long poll ends.
            # So would an idle share-partition's: its other loop waits for the long poll.
            for tp in session.acks.partitions():
                in_flight = len(self._in_flight.get(tp, ()))
                if in_flight >= FETCHES_IN_FLIGHT or (in_flight and tp in self._idle_partitions):
                    await self._flush(tp)

    async def _fetch_loop(self, tp: TopicPartition) -> None:
        clock = self.ctx.clock
        while not self._stopping:
            idle_until = self._backoff.idle_until(tp)
            if idle_until > clock.monotonic():
                await asyncio.sleep(idle_until - clock.monotonic())
                continue
            # Only an idle share-partition's fetch waits at the leader for records (long
            # poll), one at a time: the other loop waits for it. A busy share-partition's
            # fetches hold room, so they must not wait there: one that finds nothing is
            # answered at once, and the next fetch is an idle one.
            if tp in self._idle_partitions:
                async with self._idle_polls.setdefault(tp, asyncio.Lock()):
                    if tp in self._idle_partitions:  # still, after the other loop's poll
                        await self._fetch_round(tp, idle=True)
                        continue
            await self._fetch_round(tp, idle=False)

    async def _fetch_round(self, tp: TopicPartition, idle: bool) -> None:
        """Reserve, send one ShareFetch of ``tp`` (a long poll when ``idle``), queue what it
        brings and settle the reservation."""
        clock = self.ctx.clock
        want = await self._reserve(tp, idle)
        # Shielded: when the share-partition is reassigned mid-request, the request still
        # completes and its records are handled, instead of staying locked until expiry.
        fetch = asyncio.ensure_future(self._fetch_once(tp, want, None if idle else 0))
        try:
            delivered = await asyncio.shield(fetch)
        except asyncio.CancelledError:
            delivered = 0
            with contextlib.suppress(Exception):
                delivered = await asyncio.wait_for(
                    fetch, self.ctx.settings.request_timeout_ms / 1000
                )
            self._settle_reservation(idle, want, delivered)
            raise
        except Exception as exc:  # keep fetching whatever goes wrong; say what it was
            self._log.warning(
                "share_fetch_failed", topic=tp.topic, partition=tp.partition, error=repr(exc)
            )
            delivered = -1
        self._settle_reservation(idle, want, delivered)
        # An empty long poll already waited at the leader, and an empty busy fetch is
        # followed by a long poll: no back-off on top of either.
        waited = delivered == 0 and (self._long_polled.pop(tp, False) or not idle)
        self._backoff.observe(tp, clock.monotonic(), delivered, 0 if waited else want)
        if delivered > 0:
            self._idle_partitions.discard(tp)
        else:
            # Idle only if it asked for records and found none: a fetch that only carried
            # acknowledgements (no room) says nothing, and marking the share-partition idle
            # then let its other loop acquire outside the room again and again.
            if want > 0 and delivered == 0:
                self._idle_partitions.add(tp)
            # The loops woken by room just freed reserve first (they wait in order).
            await asyncio.sleep(0)

    def _settle_reservation(self, idle: bool, want: int, delivered: int) -> None:
        """After a ShareFetch that asked for ``want`` records and queued ``delivered`` (-1 on
        an error): give back the room it did not use, or, for an idle share-partition's fetch
        (which reserved none, see :meth:`_reserve`), take room for what it delivered."""
        if idle:
            self.flow.take(max(delivered, 0))
        else:
            self._unreserve(want - max(delivered, 0))

    async def _fetch_once(
        self, tp: TopicPartition, want: int, max_wait_ms: int | None = None
    ) -> int:
        """One ShareFetch with the pending acknowledgements of ``tp`` riding along; the
        leader may hold it ``max_wait_ms`` (``None``: ``fetch.max.wait.ms``) for records.

        Returns:
            records queued for the handlers (0 when none were acquired), -1 on an error.
        """
        session = self.session
        assert session is not None
        self._publish_ack_counts()
        clock = self.ctx.clock
        started = clock.monotonic()
        in_flight = self._in_flight.setdefault(tp, [])
        in_flight.append(started)
        try:
            result = await session.fetch(tp, want, max_wait_ms)
        finally:
            in_flight.remove(started)
        self._long_polled[tp] = result.long_polled and not result.acquired
        if result.round_trip_s:
            self._fetch_seconds.observe(result.round_trip_s)
        if result.error is not None:
            self._log.error(
                "share_fetch_error",
                topic=tp.topic,
                partition=tp.partition,
                error=result.error.code.value,
                detail=result.error.message,
            )
            return -1
        if not result.acquired:
            return 0
        if result.lock_timeout_ms:
            self.flow.lock_s = result.lock_timeout_ms / 1000
        records = result.records
        self.flow.observe_fetch_cycle(clock.monotonic() - started)
        redelivered = sum(1 for r in records if r.delivery_count > 1)
        self.stats.delivered += len(records)
        self.stats.redelivered += redelivered
        self._delivered.inc(len(records))
        self._redelivered.inc(redelivered)
        if self._all_stuck:  # acquired by a ShareFetch already in flight: nobody can start them
            for record in records:
                self._acknowledge(record, AcknowledgeType.RELEASE)
            self.stats.released += len(records)
            self._spawn(self._flush(tp))
            return 0
        if not self.batch:
            self._queue.extend(records)
        elif self.batch_size is None or len(records) <= self.batch_size:
            self._batches.append(records)
        else:
            size = self.batch_size
            self._batches.extend(records[i : i + size] for i in range(0, len(records), size))
        self._queued.set()
        return len(records)

    async def _flush(self, tp: TopicPartition) -> None:
        if self.session is None:
            return
        error = await self.session.flush(tp)
        if error is not None and error.code.retriable:
            self._log.warning("acknowledgement_flush_failed", error=str(error))

    def _publish_ack_counts(self) -> None:
        for kind, count in self._ack_counts.items():
            if count:
                self._acknowledged[kind].inc(count)
                self._ack_counts[kind] = 0

    async def _flush_all(self) -> None:
        self._publish_ack_counts()
        if self.session is not None:
            for tp in self.session.acks.partitions():
                await self._flush(tp)

    # -- handling --------------------------------------------------------------------------
    async def _worker(self, index: int) -> None:
        # The handler runs inline: a task per record would cost more than a no-op handler.
        # stop() waits (within the drain timeout) for the handlers in progress, then cancels
        # this task.
        queue, queued, clock = self._queue, self._queued, self.ctx.clock
        call = self._calls[index]
        call.task = asyncio.current_task()
        while not self._stopping:
            if not queue:
                queued.clear()
                await queued.wait()
                continue
            record = queue.popleft()
            if self._too_late(record, clock.monotonic()):
                self._lock_expired_unhandled(record)
                continue
            self._busy += 1
            if not self._handlers_busy.is_set():
                self._handlers_busy.set()
            try:
                await self._handle_one(record, call)
            finally:
                self._busy -= 1
                if self._stopping and not self._busy:
                    self._idle.set()

    def _too_late(self, record: ShareRecord, now: float) -> bool:
        """True if ``record``'s acquisition lock ends within the lock margin of monotonic time
        ``now`` (s): a handler starting now would be cancelled at once, or finish with its
        outcome reaching the leader after the lock elapsed (the record then goes to another
        member as well: a duplicate)."""
        return record.lock_deadline - self._lock_margin_s() <= now

    def _lock_expired_unhandled(self, record: ShareRecord) -> None:
        """The record's acquisition lock expired, or would within the lock margin, while it
        waited for a handler: the leader may have delivered it to another member already, or
        would before its outcome arrived, so don't process it; RELEASE it (refused harmlessly
        if the leader expired the lock first)."""
        self.stats.lock_expired += 1
        self._lock_expired.inc()
        self._acknowledge(record, AcknowledgeType.RELEASE)
        self._unreserve(1)
        if record.lock_deadline != self._last_expired_deadline:
            self._last_expired_deadline = record.lock_deadline
            self._log.warning(
                "acquisition_lock_expired_before_handling",
                queued=len(self._queue) + sum(len(batch) for batch in self._batches),
                note="released unhandled; the handlers are slower than the lock "
                "duration allows (raise group.share.record.lock.duration.ms "
                "or lower max.poll.records)",
                **self._where(record),
            )

    async def _handle_one(self, record: ShareRecord, call: _HandlerCall) -> None:
        clock = self.ctx.clock
        started = clock.monotonic()
        outcome = await self._process(record, call)
        self.flow.observe_handler(clock.monotonic() - started)
        self._ack_counts[outcome] += 1
        self._acknowledge(record, outcome)
        if outcome is AcknowledgeType.RELEASE and self.session is not None:
            self.session.remember_released(record)
        self._unreserve(1)

    # -- handler deadlines ------------------------------------------------------------------
    def _lock_margin_s(self) -> float:
        """How long (s) before a record's lock expires its handler call is cancelled: a tenth
        of the lock duration, at least two acknowledgement lingers, at most 1 s."""
        linger_s = max(self.ctx.settings.acknowledgement_linger_ms / 1000, 0.005)
        return min(max(self.flow.lock_s / 10, 2 * linger_s), 1.0)

    def _arm(self, call: _HandlerCall, records: list[ShareRecord]) -> None:
        """Set the deadline of a handler call starting now on ``records`` (monotonic s), and
        when their locks are renewed instead (see the module docstring)."""
        lock_end = min(r.lock_deadline for r in records) - self._lock_margin_s()
        call.started = self.ctx.clock.monotonic()
        if self.handler_timeout_ms is None:
            call.deadline = lock_end
            return
        timeout_end = self.ctx.clock.monotonic() + self.handler_timeout_ms / 1000
        if self.ctx.settings.renew_acknowledge_enable and timeout_end > lock_end:
            call.deadline, call.renew_at, call.records = timeout_end, lock_end, records
        else:
            call.deadline = min(lock_end, timeout_end)

    def _renew(self, call: _HandlerCall, now: float) -> None:
        """RENEW the locks of a running call's records (KIP-1222); they leave at once. If the
        leader refuses, the call is cancelled a margin before the old lock elapses."""
        session = self.session
        records = call.records
        if session is None or not records:
            call.renew_at = math.inf
            return
        old_end = min(r.lock_deadline for r in records) - self._lock_margin_s()
        lock_s = self.flow.lock_s
        tps = sorted({TopicPartition(r.topic, r.partition) for r in records})
        for r in records:
            session.acknowledge(
                TopicPartition(r.topic, r.partition), r.offset, AcknowledgeType.RENEW
            )
            r.lock_deadline = now + lock_s
        call.renew_at = now + lock_s - self._lock_margin_s()
        self.stats.renewed += len(records)
        self._log.info(
            "handler_locks_renewed",
            records=len(records),
            running_s=round(now - call.started, 3),
            handler_timeout_ms=self.handler_timeout_ms,
            **(self._where(records[0]) if len(records) == 1 else self._where_batch(records)),
        )

        async def send() -> None:
            for tp in tps:
                error = await session.flush(tp)
                if error is not None and call.records is records:
                    call.renew_at = math.inf
                    call.deadline = min(call.deadline, old_end)
                    self._log.warning(
                        "handler_lock_renewal_refused",
                        error=str(error),
                        note="the call is cancelled before the old lock elapses",
                        **self._where(records[0]),
                    )

        self._spawn(send())

    def _end_call(self, call: _HandlerCall) -> bool:
        """The handler call returned or raised: stop watching it. Returns True when the
        watchdog had cancelled it (the CancelledError is then its timeout, not a stop)."""
        timed_out = call.cancelled_at is not None
        # Ours, consumed here (Python 3.11+ counts cancellations; a stop() cancel still counts).
        cancelling = getattr(call.task, "cancelling", None)
        if timed_out and cancelling is not None and cancelling():
            call.task.uncancel()  # type: ignore[union-attr]
        was_stuck = call.stuck
        call.deadline, call.cancelled_at, call.stuck = math.inf, None, False
        call.renew_at, call.records = math.inf, []
        if was_stuck:
            self._check_stuck()
        return timed_out and not self._stopping

    def _timed_out(self, records: list[ShareRecord]) -> AcknowledgeType:
        """Count and log handler calls cancelled at their deadline; their records are
        RELEASEd (delivered again at once, the lock still holding)."""
        count = len(records)
        self.stats.handler_timeouts += count
        self.stats.released += count
        self.ctx.metrics.handler_errors.labels(self.group, records[0].topic, "timeout").inc(count)
        self._log.error(
            "handler_timed_out_records_released",
            records=count,
            handler_timeout_ms=self.handler_timeout_ms,
            note="cancelled before the acquisition lock expired; raise handler_timeout_ms or "
            "group.share.record.lock.duration.ms if the handler needs longer",
            **(self._where(records[0]) if count == 1 else self._where_batch(records)),
        )
        return AcknowledgeType.RELEASE

    async def _watch_handlers(self) -> None:
        """Cancel handler calls past their deadline; mark those that ignore it as stuck."""
        clock, calls = self.ctx.clock, self._calls
        while not self._stopping:
            if not self._busy:
                self._handlers_busy.clear()
                await self._handlers_busy.wait()
                continue
            now = clock.monotonic()
            for index, call in enumerate(calls):
                if call.deadline == math.inf or call.task is None:
                    continue
                if call.cancelled_at is None:
                    if now >= call.deadline:
                        call.cancelled_at = now
                        call.task.cancel()
                    elif now >= call.renew_at:
                        self._renew(call, now)
                elif not call.stuck and now - call.cancelled_at >= self._lock_margin_s():
                    call.stuck = True
                    self._log.error(
                        "handler_ignores_cancellation",
                        handler=index,
                        note="a handler call past its deadline did not end when cancelled "
                        "(it catches CancelledError or blocks the event loop)",
                    )
                    self._check_stuck()
            await asyncio.sleep(HANDLER_WATCH_INTERVAL_S)

    def _check_stuck(self) -> None:
        """Publish the stuck handler calls; when all are stuck, RELEASE the queued records and
        stop acquiring, until one returns."""
        stuck = sum(call.stuck for call in self._calls)
        self._stuck_gauge.set(stuck)
        if stuck == len(self._calls) and not self._all_stuck:
            self._all_stuck = True
            self._unstuck.clear()
            released = self._release_queued()
            self._unreserve(released)
            self._log.error(
                "share_agent_handlers_stuck",
                stuck=stuck,
                queued_released=released,
                note="every handler call is stuck; this member acquires nothing until one "
                "returns, and the records they hold go to other members when their locks expire",
            )
            self._spawn(self._flush_all())  # the RELEASEs leave now
        elif stuck < len(self._calls) and self._all_stuck:
            self._all_stuck = False
            self._unstuck.set()
            self._log.warning("share_agent_handlers_recovered", stuck=stuck)

    def _where(self, record: ShareRecord) -> dict[str, Any]:
        return {
            "group": self.group,
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "delivery_count": record.delivery_count,
        }

    async def _process(self, record: ShareRecord, call: _HandlerCall) -> AcknowledgeType:
        errors = self.ctx.metrics.handler_errors
        if self.decode is not None:
            try:
                self.decode(record)
            except Exception as exc:
                self.stats.undecodable += 1
                self.stats.rejected += 1
                errors.labels(self.group, record.topic, "undecodable").inc()
                self._log.error(
                    "undecodable_record_rejected", error=repr(exc), **self._where(record)
                )
                return AcknowledgeType.REJECT
        self._arm(call, [record])
        try:
            result = await self._call_record(record)
        except asyncio.CancelledError:
            if self._end_call(call):
                return self._timed_out([record])
            self.stats.released += 1
            raise
        except Exception as exc:
            self._end_call(call)
            self.stats.handler_errors += 1
            self.stats.released += 1
            errors.labels(self.group, record.topic, "raised").inc()
            self._log.error(
                "handler_raised_record_released",
                error=repr(exc),
                exc_info=True,
                **self._where(record),
            )
            return AcknowledgeType.RELEASE
        self._end_call(call)
        outcome = outcome_of(result)
        if outcome is None:
            self.stats.handler_errors += 1
            self.stats.released += 1
            errors.labels(self.group, record.topic, "invalid_outcome").inc()
            self._log.error(
                "handler_returned_invalid_outcome_record_released",
                returned=repr(result)[:200],
                expected="queueflow.ACCEPT, queueflow.RELEASE, queueflow.REJECT or None",
                **self._where(record),
            )
            return AcknowledgeType.RELEASE
        if outcome is AcknowledgeType.ACCEPT:
            self.stats.accepted += 1
        elif outcome is AcknowledgeType.RELEASE:
            self.stats.released += 1
        else:
            self.stats.rejected += 1
        return outcome

    # -- batch handling (batch=True) -------------------------------------------------------
    async def _batch_worker(self, index: int) -> None:
        # As _worker, one batch (the records of one ShareFetch, split by batch_size) per call.
        batches, queued = self._batches, self._queued
        call = self._calls[index]
        call.task = asyncio.current_task()
        while not self._stopping:
            if not batches:
                queued.clear()
                await queued.wait()
                continue
            batch = batches.popleft()
            self._busy += 1
            if not self._handlers_busy.is_set():
                self._handlers_busy.set()
            try:
                await self._handle_batch(batch, call)
            finally:
                self._busy -= 1
                if self._stopping and not self._busy:
                    self._idle.set()

    def _admit(self, batch: list[ShareRecord]) -> list[ShareRecord]:
        """The records of ``batch`` to pass to the handler: those whose lock expired are
        released unhandled and undecodable ones REJECTed, as on the per-record path."""
        now = self.ctx.clock.monotonic()
        decode = self.decode
        if decode is None and not any(self._too_late(record, now) for record in batch):
            return batch  # the common case: no new list
        admitted: list[ShareRecord] = []
        for record in batch:
            if self._too_late(record, now):
                self._lock_expired_unhandled(record)
                continue
            if decode is not None:
                try:
                    decode(record)
                except Exception as exc:
                    self._undecodable(record, exc)
                    continue
            admitted.append(record)
        return admitted

    def _undecodable(self, record: ShareRecord, exc: Exception) -> None:
        """REJECT a record the decoder refused, as :meth:`_process` does."""
        self.stats.undecodable += 1
        self.stats.rejected += 1
        self.ctx.metrics.handler_errors.labels(self.group, record.topic, "undecodable").inc()
        self._log.error("undecodable_record_rejected", error=repr(exc), **self._where(record))
        self._ack_counts[AcknowledgeType.REJECT] += 1
        self._acknowledge(record, AcknowledgeType.REJECT)
        self._unreserve(1)

    async def _handle_batch(self, batch: list[ShareRecord], call: _HandlerCall) -> None:
        records = self._admit(batch)
        if not records:
            return
        count = len(records)
        clock = self.ctx.clock
        started = clock.monotonic()
        outcomes = await self._process_batch(records, call)
        # FlowControl thinks in records: feed it the time per record.
        self.flow.observe_handler((clock.monotonic() - started) / count)
        session = self.session
        if session is not None:
            first = records[0]
            tp = TopicPartition(first.topic, first.partition)  # one ShareFetch: one partition
            acknowledge = session.acknowledge
            if isinstance(outcomes, AcknowledgeType):
                for record in records:
                    acknowledge(tp, record.offset, outcomes)
                if outcomes is AcknowledgeType.RELEASE:
                    for record in records:
                        session.remember_released(record)
            else:
                for record, outcome in zip(records, outcomes, strict=True):
                    acknowledge(tp, record.offset, outcome)
                    if outcome is AcknowledgeType.RELEASE:
                        session.remember_released(record)
        self._unreserve(count)

    def _where_batch(self, records: list[ShareRecord]) -> dict[str, Any]:
        first = records[0]
        return {
            "group": self.group,
            "topic": first.topic,
            "partition": first.partition,
            "offsets": ranges_text(sorted(record.offset for record in records)),
            "records": len(records),
            "max_delivery_count": max(record.delivery_count for record in records),
        }

    async def _process_batch(
        self, records: list[ShareRecord], call: _HandlerCall
    ) -> list[AcknowledgeType] | AcknowledgeType:
        """Call the batch handler; returns one outcome per record or one for all, and counts
        them (in :attr:`stats` and the acknowledgement counters) as :meth:`_process` does."""
        count = len(records)
        stats, topic = self.stats, records[0].topic
        errors = self.ctx.metrics.handler_errors
        release = AcknowledgeType.RELEASE
        self._arm(call, records)
        try:
            # A list of its own: whatever the handler does to it, every record is acknowledged.
            result = await self._call_batch(records.copy())
        except asyncio.CancelledError:
            if self._end_call(call):
                self._ack_counts[release] += count
                return self._timed_out(records)
            stats.released += count
            raise
        except Exception as exc:
            self._end_call(call)
            stats.handler_errors += count
            stats.released += count
            self._ack_counts[release] += count
            errors.labels(self.group, topic, "raised").inc(count)
            self._log.error(
                "handler_raised_batch_released",
                error=repr(exc),
                exc_info=True,
                **self._where_batch(records),
            )
            return release
        self._end_call(call)
        outcomes = batch_outcomes(result, count)
        if outcomes is None:
            stats.handler_errors += count
            stats.released += count
            self._ack_counts[release] += count
            errors.labels(self.group, topic, "invalid_outcome").inc(count)
            self._log.error(
                "batch_handler_returned_invalid_outcome_records_released",
                returned=repr(result)[:200],
                returned_type=type(result).__name__,
                returned_length=len(result) if isinstance(result, Sequence) else None,
                expected=f"a sequence of {count} outcomes (one per record, in order: "
                "queueflow.ACCEPT, queueflow.RELEASE, queueflow.REJECT or None), or one "
                "outcome for the whole batch",
                **self._where_batch(records),
            )
            return release
        if isinstance(outcomes, AcknowledgeType):
            self._count(outcomes, count)
        else:
            for kind in _OUTCOMES:
                n = outcomes.count(kind)
                if n:
                    self._count(kind, n)
        return outcomes

    def _count(self, kind: AcknowledgeType, n: int) -> None:
        self._ack_counts[kind] += n
        if kind is AcknowledgeType.ACCEPT:
            self.stats.accepted += n
        elif kind is AcknowledgeType.RELEASE:
            self.stats.released += n
        else:
            self.stats.rejected += n


@dataclass(slots=True, eq=False)
class _HandlerCall:
    """The handler call one handler task is running, as the watchdog sees it."""

    #: The handler task (cancelled at the deadline).
    task: asyncio.Task[Any] | None = None
    #: Monotonic seconds at which the call is cancelled; ``inf`` while no call runs.
    deadline: float = math.inf
    #: When the watchdog cancelled it, or ``None``.
    cancelled_at: float | None = None
    #: Still running a lock margin after the cancellation.
    stuck: bool = False
    #: Monotonic seconds at which the records' locks are renewed (``inf``: never).
    renew_at: float = math.inf
    #: The call's records (set only while their locks are renewed).
    records: list[ShareRecord] = field(default_factory=list)
    #: Monotonic seconds at which the call started.
    started: float = 0.0
