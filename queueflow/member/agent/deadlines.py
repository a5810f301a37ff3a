"""Handler-call deadlines of a share agent: cancellation, lock renewal, stuck handlers.

A handler call's deadline is its records' acquisition lock deadline minus a margin
(:meth:`Deadlines.lock_margin_s`), or ``handler_timeout_ms`` after it started when that is
sooner; with ``handler_timeout_ms`` set and RENEW allowed (``share.renew.acknowledge.enable``,
KIP-1222) the locks are renewed a margin before they elapse instead, up to the timeout. The
watchdog (:meth:`Deadlines.watch`) cancels calls past their deadline and marks those that
ignore the cancellation as stuck; when all are, the agent's :class:`HandlersHealth` is
``ALL_STUCK`` until one returns.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from queueflow.member.agent.giveback import release_expiring
from queueflow.member.agent.units import FetchUnit, unit_lock_deadline
from queueflow.member.lifecycle import HEALTH_TRANSITIONS, HandlersHealth, Lifecycle
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

if TYPE_CHECKING:
    from queueflow.member.agent.core import ShareAgent

__all__ = ["HANDLER_WATCH_INTERVAL_S", "Deadlines", "HandlerCall"]

#: Real seconds between the watchdog's checks of running handler calls against their deadlines
#: (it sleeps while no handler runs).
HANDLER_WATCH_INTERVAL_S = 0.1


@dataclass(slots=True, eq=False)
class HandlerCall:
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


class Deadlines:
    """The deadlines of one share agent's handler calls, one :class:`HandlerCall` per task.

    Args:
        agent: the share agent (its clock, settings, flow control, session and runner).
    """

    def __init__(self, agent: ShareAgent) -> None:
        self.agent = agent
        self.calls = [HandlerCall() for _ in range(agent.concurrency)]
        self.health: Lifecycle[HandlersHealth] = Lifecycle(
            f"handlers of share agent {agent.name}", HandlersHealth.WORKING, HEALTH_TRANSITIONS
        )
        #: Set when a stuck handler returns (fetch loops wait on it while all are stuck).
        self.unstuck = asyncio.Event()
        #: Wakes the watchdog when a handler call starts.
        self.handlers_busy = asyncio.Event()
        self._stuck_gauge = agent.ctx.metrics.stuck_handlers.labels(agent.group, agent.topic_name)
        # Two acknowledgement lingers (at least 10 ms): the least lock margin.
        self._least_margin_s = 2 * max(agent.ctx.settings.acknowledgement_linger_ms / 1000, 0.005)

    @property
    def all_stuck(self) -> bool:
        """Every handler call is stuck (:attr:`HandlersHealth.ALL_STUCK`)."""
        return self.health.state is HandlersHealth.ALL_STUCK

    def lock_margin_s(self) -> float:
        """How long (s) before a record's lock expires its handler call is cancelled: a tenth
        of the lock duration, at least two acknowledgement lingers, at most 1 s."""
        return min(max(self.agent.flow.lock_s / 10, self._least_margin_s), 1.0)

    def too_late(self, record: ShareRecord, now: float) -> bool:
        """True if ``record``'s acquisition lock ends within the lock margin of monotonic time
        ``now`` (s): a handler starting now would be cancelled at once, or finish with its
        outcome reaching the leader after the lock elapsed (the record then goes to another
        member as well: a duplicate)."""
        return record.lock_deadline - self.lock_margin_s() <= now

    def arm(
        self,
        call: HandlerCall,
        records: list[ShareRecord],
        margin_s: float | None = None,
        lock_deadline: float | None = None,
    ) -> None:
        """Set the deadline of a handler call starting now on ``records`` (monotonic s), and
        when their locks are renewed instead (see the module docstring). ``margin_s``: the
        lock margin (:meth:`lock_margin_s`) if the caller has it; ``lock_deadline``: the
        records' earliest lock deadline if the caller has it (one per ShareFetch,
        :func:`~queueflow.member.agent.units.unit_lock_deadline`)."""
        agent = self.agent
        if margin_s is None:
            margin_s = self.lock_margin_s()
        if lock_deadline is None:
            lock_deadline = unit_lock_deadline(records)
        lock_end = lock_deadline - margin_s
        call.started = agent.ctx.clock.monotonic()
        timeout_ms = agent.handler_timeout_ms
        if timeout_ms is None:
            call.deadline = lock_end
            return
        timeout_end = agent.ctx.clock.monotonic() + timeout_ms / 1000
        if agent.ctx.settings.renew_acknowledge_enable and timeout_end > lock_end:
            call.deadline, call.renew_at, call.records = timeout_end, lock_end, records
        else:
            call.deadline = min(lock_end, timeout_end)

    def renew(self, call: HandlerCall, now: float) -> None:
        """RENEW the locks of a running call's records (KIP-1222); they leave at once. If the
        leader refuses, the call is cancelled a margin before the old lock elapses."""
        agent = self.agent
        session = agent.session
        records = call.records
        if session is None or not records:
            call.renew_at = math.inf
            return
        old_end = unit_lock_deadline(records) - self.lock_margin_s()
        lock_s = agent.flow.lock_s
        tps = sorted({TopicPartition(r.topic, r.partition) for r in records})
        for r in records:
            session.acknowledge(
                TopicPartition(r.topic, r.partition), r.offset, AcknowledgeType.RENEW
            )
            r.lock_deadline = now + lock_s
        if type(records) is FetchUnit:
            records.lock_deadline = now + lock_s
        call.renew_at = now + lock_s - self.lock_margin_s()
        agent.stats.renewed += len(records)
        runner = agent.runner
        agent.log.info(
            "handler_locks_renewed",
            records=len(records),
            running_s=round(now - call.started, 3),
            handler_timeout_ms=agent.handler_timeout_ms,
            **(runner.where(records[0]) if len(records) == 1 else runner.where_batch(records)),
        )

        async def send() -> None:
            for tp in tps:
                error = await session.flush(tp)
                if error is not None and call.records is records:
                    call.renew_at = math.inf
                    call.deadline = min(call.deadline, old_end)
                    agent.log.warning(
                        "handler_lock_renewal_refused",
                        error=str(error),
                        note="the call is cancelled before the old lock elapses",
                        **runner.where(records[0]),
                    )

        agent.spawn(send())

    def end_call(self, call: HandlerCall) -> bool:
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
            self.check_stuck()
        return timed_out and not self.agent.stopping

    async def watch(self) -> None:
        """Cancel handler calls past their deadline; mark those that ignore it as stuck."""
        agent = self.agent
        clock, calls, runner = agent.ctx.clock, self.calls, agent.runner
        while not agent.stopping:
            if not runner.busy:
                self.handlers_busy.clear()
                await self.handlers_busy.wait()
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
                        self.renew(call, now)
                elif not call.stuck and now - call.cancelled_at >= self.lock_margin_s():
                    call.stuck = True
                    agent.log.error(
                        "handler_ignores_cancellation",
                        handler=index,
                        note="a handler call past its deadline did not end when cancelled "
                        "(it catches CancelledError or blocks the event loop)",
                    )
                    self.check_stuck()
            # Records still queued whose locks are about to end go back now, uncounted
            # (docs/concepts.md "Delivery counts"), rather than expire in the queue.
            if runner.queued and release_expiring(runner, now, 2 * self.lock_margin_s()):
                agent.spawn(agent.dispatch.flush_all())
            await asyncio.sleep(HANDLER_WATCH_INTERVAL_S)

    def check_stuck(self) -> None:
        """Publish the stuck handler calls; when all are stuck, RELEASE the queued records and
        stop acquiring, until one returns."""
        agent = self.agent
        stuck = sum(call.stuck for call in self.calls)
        self._stuck_gauge.set(stuck)
        if stuck == len(self.calls) and not self.all_stuck:
            self.health.move(HandlersHealth.ALL_STUCK)
            self.unstuck.clear()
            released = agent.runner.release_queued()
            agent.dispatch.unreserve(released)
            agent.log.error(
                "share_agent_handlers_stuck",
                stuck=stuck,
                queued_released=released,
                note="every handler call is stuck; this member acquires nothing until one "
                "returns, and the records they hold go to other members when their locks expire",
            )
            agent.spawn(agent.dispatch.flush_all())  # the RELEASEs leave now
        elif stuck < len(self.calls) and self.all_stuck:
            self.health.move(HandlersHealth.WORKING)
            self.unstuck.set()
            agent.log.warning("share_agent_handlers_recovered", stuck=stuck)
