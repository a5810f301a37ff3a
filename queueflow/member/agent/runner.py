"""The handler runner of a share agent: one path for record and batch handlers.

Records wait in one queue of *units*: a record handler's unit is one record (a batch of one),
a batch handler's the records of one ShareFetch (split by ``batch_size``). ``concurrency``
worker tasks take units, drop the records whose lock expired or that can't be decoded
(:meth:`HandlerRunner.admit`), call the handler (:meth:`HandlerRunner.call`), have
:func:`~queueflow.member.agent.results.judge` work out a
:class:`~queueflow.member.agent.results.HandlerResult`, and apply it
(:meth:`HandlerRunner.apply`: acknowledge, count, log).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from queueflow.member.agent.accepts import accept_all, plain_accepts
from queueflow.member.agent.deadlines import HandlerCall
from queueflow.member.agent.failures import log_failure
from queueflow.member.agent.giveback import retry_alone
from queueflow.member.agent.outputs import DeadLetter, Routes, Yielded, sort_outputs
from queueflow.member.agent.results import (
    OUTCOMES,
    CallEnd,
    Failure,
    HandlerResult,
    Raised,
    Returned,
    TimedOut,
    judge,
    safe_repr,
)
from queueflow.member.agent.units import FetchUnit, unit_lock_deadline
from queueflow.member.lifecycle import AGENT_STOPPING
from queueflow.member.session import ranges_text
from queueflow.metrics import PendingObservations
from queueflow.protocol.messages import AckError
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

if TYPE_CHECKING:
    from queueflow.member.agent.core import ShareAgent

__all__ = ["HandlerRunner", "collect_yields"]

_ACCEPT = AcknowledgeType.ACCEPT
_RELEASE = AcknowledgeType.RELEASE
_REJECT = AcknowledgeType.REJECT


def collect_yields(handler: Callable[[Any], Any]) -> Callable[[Any], Awaitable[Yielded]]:
    """Make an async generator handler a coroutine handler returning what it yielded (a
    :class:`~queueflow.member.agent.outputs.Yielded`), so that it runs under the same deadline
    and cancellation as any call: a raise or a cancellation mid-generator ends the call with
    nothing returned (so nothing published), and the generator is closed."""

    async def collect(arg: Any) -> Yielded:
        generator = cast(AsyncGenerator[Any, None], handler(arg))
        items = Yielded()
        try:
            async for item in generator:
                items.append(item)
        finally:
            await generator.aclose()
        return items

    return collect


class HandlerRunner:
    """The queue of records waiting for a handler, and the handler tasks that work it off.

    Args:
        agent: the share agent (its handler, options, session, flow control, stats).
    """

    def __init__(self, agent: ShareAgent) -> None:
        self.agent = agent
        self.batch = agent.batch
        self.batch_size = agent.batch_size
        handler = cast(Callable[[Any], Any], agent.handler)
        self._handler = collect_yields(handler) if inspect.isasyncgenfunction(handler) else handler
        options = agent.options
        #: Where results go by default; None: no sink= and no dead_letter= (judge's fast path).
        self.routes: Routes | None = None
        if options.sink or options.dead_letter is not None:
            self.routes = Routes(tuple(options.sink), options.dead_letter, agent.group)
        # Units waiting for a handler; workers wait on _queued when it is empty (a deque and
        # an event: asyncio.Queue's per-item wake-ups cost more than a no-op handler).
        self._queue: collections.deque[list[ShareRecord]] = collections.deque()
        self._queued = asyncio.Event()
        #: Records waiting for a handler.
        self.queued = 0
        #: Handler calls in progress.
        self.busy = 0
        #: At-least-once publishing of handler calls' results, each applied when done.
        self._publishing: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()  # set when busy drops to 0 while stopping
        m, labels = agent.ctx.metrics, (agent.group, agent.topic_name)
        self._errors = m.handler_errors
        self.ack_latency = PendingObservations(m.ack_latency_seconds.labels(*labels))
        self._lock_expired = m.lock_expired_unhandled.labels(*labels)
        self._acknowledged = {
            kind: m.acknowledgements.labels(*labels, kind.name.lower()) for kind in OUTCOMES
        }
        self.ack_counts = dict.fromkeys(OUTCOMES, 0)  # published per ShareFetch
        self._last_expired_deadline = 0.0  # one log line per expired batch, not per record

    # -- the queue -------------------------------------------------------------------------
    def enqueue(self, records: list[ShareRecord], lock_deadline: float | None = None) -> None:
        """Queue the records of one ShareFetch for the handlers; ``lock_deadline``: the
        fetch's (monotonic s), kept once per batch unit (:class:`FetchUnit`)."""
        queue = self._queue
        size = self.batch_size
        if not self.batch:
            queue.extend([record] for record in records)
        elif size is None or len(records) <= size:
            queue.append(FetchUnit(records, lock_deadline))
        else:
            chunks = range(0, len(records), size)
            queue.extend(FetchUnit(records[i : i + size], lock_deadline) for i in chunks)
        self.queued += len(records)
        self._queued.set()

    def release_queued(self) -> int:
        """RELEASE every record waiting for a handler, its delivery given back (it never
        reached one: docs/concepts.md "Delivery counts"); returns how many."""
        released, queue = 0, self._queue
        while queue:
            for record in queue.popleft():
                self.acknowledge(record, _RELEASE, undelivered=True)
                released += 1
        self.queued = 0
        self.agent.stats.released += released
        self.agent.dispatch.wake_untimed_reservers()
        return released

    @property
    def publishing(self) -> list[asyncio.Task[None]]:
        """The tasks publishing handler calls' results (at-least-once), a copy."""
        return list(self._publishing)

    @property
    def unfinished(self) -> int:
        """Handler calls in progress plus calls whose results are being published."""
        return self.busy + len(self._publishing)

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the handler calls in progress and the publishing of
        their results (the agent is stopping); True if none is left."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        if self.busy:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except asyncio.TimeoutError:
                return False
        if self._publishing:
            left = max(deadline - asyncio.get_running_loop().time(), 0.0)
            _, pending = await asyncio.wait(set(self._publishing), timeout=left)
            return not pending
        return True

    # -- handler tasks ---------------------------------------------------------------------
    async def worker(self, index: int) -> None:
        """Handler task ``index``: take units and run the handler on them until stopping.

        The handler runs inline: a task per call would cost more than a no-op handler.
        ``stop()`` waits (within the drain timeout) for the calls in progress, then cancels
        this task.
        """
        agent = self.agent
        queue, queued = self._queue, self._queued
        deadlines = agent.deadlines
        handlers_busy = deadlines.handlers_busy
        call = deadlines.calls[index]
        call.task = asyncio.current_task()
        lifecycle = agent.lifecycle  # its state read directly: this loop runs once per record
        while lifecycle.state not in AGENT_STOPPING:
            if not queue:
                queued.clear()
                await queued.wait()
                continue
            unit = queue.popleft()
            self.queued -= len(unit)
            margin_s = deadlines.lock_margin_s()
            records = self.admit(unit, margin_s)
            if not records:
                continue
            self.busy += 1
            if not handlers_busy.is_set():
                handlers_busy.set()
            try:
                await self.run(records, call, margin_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a fault past the handler: this unit only
                self.unit_failed(records, exc)
            finally:
                self.busy -= 1
                if agent.stopping and not self.busy:
                    self._idle.set()

    def unit_failed(self, records: list[ShareRecord], exc: Exception) -> None:
        """Applying a handler call's result failed (a fault in queueflow, not the handler's):
        RELEASE its records, free their room and log it; the handler task goes on."""
        agent = self.agent
        for record in records:
            self.acknowledge(record, _RELEASE)
        agent.stats.released += len(records)
        agent.dispatch.unreserve(len(records))
        agent.log.error(
            "handler_result_not_applied_records_released",
            error=safe_repr(exc),
            exc_info=exc,
            **self.where_batch(records),
        )

    def admit(self, unit: list[ShareRecord], margin_s: float | None = None) -> list[ShareRecord]:
        """The records of ``unit`` to pass to the handler: those whose lock expired (or ends
        within the lock margin) are released unhandled and undecodable ones REJECTed."""
        agent = self.agent
        if margin_s is None:
            margin_s = agent.deadlines.lock_margin_s()
        # A record is too late (Deadlines.too_late) when its lock ends before this.
        limit = agent.ctx.clock.monotonic() + margin_s
        decode = agent.decode
        first = unit[0].lock_deadline if len(unit) == 1 else unit_lock_deadline(unit)
        if decode is None and first > limit:
            return unit  # the common case: one check per unit, no new list
        admitted: list[ShareRecord] = []
        for record in unit:
            if record.lock_deadline <= limit:
                self.lock_expired_unhandled(record)
                continue
            if decode is not None:
                try:
                    decode(record)
                except Exception as exc:
                    self.undecodable(record, exc)
                    continue
            admitted.append(record)
        return admitted

    async def run(
        self, records: list[ShareRecord], call: HandlerCall, margin_s: float | None = None
    ) -> None:
        """Call the handler on ``records`` and apply the result (``margin_s``: the lock margin,
        :meth:`Deadlines.lock_margin_s`, if the caller has it)."""
        clock = self.agent.ctx.clock
        started = clock.monotonic()
        ended = await self.call(records, call, margin_s)
        now = clock.monotonic()  # FlowControl: the call's time per record, records waiting
        self.agent.flow.observe_handled(now - started, len(records), now, self.queued)
        result = judge(ended, records, self.batch, self.routes)
        transactions = self.agent.transactions
        if len(records) > 1 and result.failure is Failure.RAISED and transactions is None:
            await retry_alone(self, result, call)
            return
        if transactions is not None:  # exactly_once: ACCEPT/REJECT and results in a transaction
            result = transactions.submit(result)
        elif result.outputs is not None:
            # Published (acks=all) before the outcomes are recorded; the handler task goes on
            # meanwhile, so a produce round trip doesn't bound the handlers' throughput.
            task = asyncio.ensure_future(self._publish_then_apply(result))
            self._publishing.add(task)
            task.add_done_callback(self._publishing.discard)
            return
        self.apply(result)

    async def _publish_then_apply(self, result: HandlerResult) -> None:
        """Publish ``result``'s outputs, then apply it (RELEASEing its records if they could
        not be published)."""
        try:
            self.apply(await self.agent.publisher.publish(result))
        except Exception as exc:  # a fault past the handler: this call's records only
            self.unit_failed(list(result.records), exc)

    async def call(
        self, records: list[ShareRecord], call: HandlerCall, margin_s: float | None = None
    ) -> CallEnd:
        """Run one handler call under its deadline; how it ended.

        Raises:
            asyncio.CancelledError: the agent is stopping (its records go back when the member
                leaves); a cancellation at the call's deadline is returned as :class:`TimedOut`.
        """
        agent = self.agent
        deadlines = agent.deadlines
        first = records[0].lock_deadline if len(records) == 1 else unit_lock_deadline(records)
        deadlines.arm(call, records, margin_s, first)
        try:
            # A batch handler gets a list of its own: whatever it does to it, every record is
            # acknowledged.
            value = await self._handler(records.copy() if self.batch else records[0])
        except asyncio.CancelledError as exc:
            if deadlines.end_call(call):
                return TimedOut()
            # cancel() requested (Python 3.11+ counts them): the agent's stop
            cancelling = getattr(call.task, "cancelling", None)
            if agent.stopping or (cancelling is not None and cancelling()):
                agent.stats.released += len(records)
                raise  # the agent's stop: its records go back when the member leaves
            return Raised(exc)  # raised by the handler itself: a failure of these records
        except (KeyboardInterrupt, SystemExit):
            deadlines.end_call(call)
            raise  # process-level: the worker exits
        except BaseException as exc:  # GeneratorExit, a BaseException subclass
            deadlines.end_call(call)
            return Raised(exc)
        deadlines.end_call(call)
        return Returned(value)

    # -- applying results ------------------------------------------------------------------
    def apply(self, result: HandlerResult) -> None:
        """Count and log ``result``, acknowledge each record with its outcome, remember the
        RELEASEd ones (their redelivery to this member needs no Kafka read) and free their
        room."""
        agent = self.agent
        records = result.records
        failed = result.failure is not None
        if failed:
            self._failed(result)
        if not failed and plain_accepts(result):
            accept_all(self, records)  # the common case: one range per run of offsets
            agent.dispatch.unreserve(len(records))
            return
        session, delays, ended = agent.session, result.delays, result.ended
        error = AckError.of(ended.error) if isinstance(ended, Raised) else None
        stats, ack_counts = agent.stats, self.ack_counts
        acknowledge = self.acknowledge
        for i, (record, outcome) in enumerate(zip(records, result.outcomes, strict=True)):
            if not failed:  # a failed call's records were counted by _failed
                ack_counts[outcome] += 1
                stats.count(outcome)
            why = error if outcome is not _ACCEPT else None
            acknowledge(record, outcome, why, delay_ms=(delays[i] or 0) if delays else 0)
            if outcome is _RELEASE and session is not None:
                session.remember_released(record)
        agent.dispatch.unreserve(len(records))

    def counted(self, kind: AcknowledgeType) -> None:
        """Count one outcome recorded outside :meth:`apply` (an exactly_once commit)."""
        self.ack_counts[kind] += 1
        self.agent.stats.count(kind)

    def _failed(self, result: HandlerResult) -> None:
        """Count and log a call whose records are all RELEASEd (``result.failure``)."""
        agent = self.agent
        records, stats = result.records, agent.stats
        count = len(records)
        failure = result.failure
        assert failure is not None
        stats.released += count
        self.ack_counts[_RELEASE] += count
        self._errors.labels(agent.group, records[0].topic, failure.value).inc(count)
        if failure is Failure.TIMED_OUT:
            stats.handler_timeouts += count
        else:
            stats.handler_errors += count
        log_failure(agent, result)

    def acknowledge(
        self,
        record: ShareRecord,
        kind: AcknowledgeType,
        error: AckError | None = None,
        *,
        delay_ms: int = 0,
        undelivered: bool = False,
    ) -> None:
        """Record ``kind`` (``error``, RELEASE options: :meth:`ShareFetchSession.acknowledge`)
        and observe the delivery-to-outcome latency. A RELEASE after the lock expired is not
        sent: acknowledgements name offsets, and the leader may have delivered it again."""
        agent = self.agent
        if kind is _RELEASE and record.lock_deadline <= agent.ctx.clock.monotonic():
            return
        if record.delivered_at and kind is not AcknowledgeType.RENEW and not undelivered:
            self.ack_latency.observe(agent.ctx.clock.monotonic() - record.delivered_at)
        if agent.session is not None:
            agent.session.acknowledge(
                TopicPartition(record.topic, record.partition),
                record.offset,
                kind,
                error,
                delay_ms=delay_ms,
                undelivered=undelivered,
            )

    def publish_ack_counts(self) -> None:
        """Publish the outcomes counted and the acknowledgement latencies since the last call."""
        self.ack_latency.flush()
        for kind, count in self.ack_counts.items():
            if count:
                self._acknowledged[kind].inc(count)
                self.ack_counts[kind] = 0

    def lock_expired_unhandled(self, record: ShareRecord, undelivered: bool = True) -> None:
        """The record's acquisition lock expired, or would within the lock margin, while it
        waited for a handler: the leader may have delivered it to another member already, or
        would before its outcome arrived, so don't process it; RELEASE it (refused harmlessly
        if the leader expired the lock first)."""
        agent = self.agent
        agent.stats.lock_expired += 1
        self._lock_expired.inc()
        self.acknowledge(record, _RELEASE, undelivered=undelivered)  # unless a handler saw it
        agent.dispatch.unreserve(1)
        if record.lock_deadline != self._last_expired_deadline:
            self._last_expired_deadline = record.lock_deadline
            agent.log.warning(
                "acquisition_lock_expired_before_handling",
                queued=self.queued,
                note="released unhandled; the handlers are slower than the lock "
                "duration allows (raise group.share.record.lock.duration.ms "
                "or lower max.poll.records)",
                **self.where(record),
            )

    def undecodable(self, record: ShareRecord, exc: Exception) -> None:
        """REJECT a record the decoder refused (it is never passed to the handler); with
        ``dead_letter=``, its copy is published there first (:meth:`settle`)."""
        agent = self.agent
        agent.stats.undecodable += 1
        self._errors.labels(agent.group, record.topic, "undecodable").inc()
        agent.log.error("undecodable_record_rejected", error=safe_repr(exc), **self.where(record))
        routes = self.routes
        if routes is not None and routes.dead_letter is not None:
            letter = DeadLetter(reason=f"undecodable: {safe_repr(exc)}")
            outputs = (sort_outputs(_REJECT, [letter], record, routes),)
            agent.spawn(
                self.settle(HandlerResult([record], (_REJECT,), None, None, False, outputs))
            )
            return
        agent.stats.rejected += 1
        self.ack_counts[_REJECT] += 1
        self.acknowledge(record, _REJECT, AckError.of(exc, reason="undecodable"))
        agent.dispatch.unreserve(1)

    async def settle(self, result: HandlerResult) -> None:
        """Publish (or commit, exactly_once) and apply a result made outside a handler call."""
        transactions = self.agent.transactions
        if transactions is not None:
            result = transactions.submit(result)
        elif result.outputs is not None:
            result = await self.agent.publisher.publish(result)
        self.apply(result)

    # -- log fields ------------------------------------------------------------------------
    def where(self, record: ShareRecord) -> dict[str, Any]:
        """Log fields naming one record."""
        return {
            "group": self.agent.group,
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "delivery_count": record.delivery_count,
        }

    def where_batch(self, records: Sequence[ShareRecord]) -> dict[str, Any]:
        """Log fields naming the records of one batch (of one share-partition)."""
        first = records[0]
        return {
            "group": self.agent.group,
            "topic": first.topic,
            "partition": first.partition,
            "offsets": ranges_text(sorted(record.offset for record in records)),
            "records": len(records),
            "max_delivery_count": max(record.delivery_count for record in records),
        }
