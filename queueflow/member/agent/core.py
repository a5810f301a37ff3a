"""The share agent itself: its options, parts and lifecycle (start, drain, stop).

:class:`ShareAgent` owns the :class:`~queueflow.member.session.ShareFetchSession` and the
:class:`~queueflow.member.lifecycle.AgentState` lifecycle, and composes the
:class:`~queueflow.member.agent.dispatch.Dispatcher` (fetching), the
:class:`~queueflow.member.agent.runner.HandlerRunner` (handler calls) and the
:class:`~queueflow.member.agent.deadlines.Deadlines` (their deadlines, lock renewal, stuck
handlers). See :mod:`queueflow.member.agent` for what a handler may return.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import structlog

from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.logging import get_logger
from queueflow.member.agent.deadlines import Deadlines
from queueflow.member.agent.dispatch import Dispatcher
from queueflow.member.agent.options import Decoder, Handler, ShareAgentOptions
from queueflow.member.agent.publishing import Encoder, PlainEncoder, Publisher
from queueflow.member.agent.results import AgentStats, safe_repr
from queueflow.member.agent.runner import HandlerRunner
from queueflow.member.agent.transactions import TransactionalPublisher
from queueflow.member.context import MemberContext
from queueflow.member.flow import FlowControl
from queueflow.member.key_ordering import check_key_ordered
from queueflow.member.lifecycle import AGENT_STOPPING, AGENT_TRANSITIONS, AgentState, Lifecycle
from queueflow.member.session import ShareFetchSession

__all__ = ["STOP_TASKS_TIMEOUT_S", "ShareAgent"]

log = structlog.get_logger("queueflow.member.agent")

#: How long (s) stop() waits for its tasks after cancelling them; a handler that ignores
#: cancellation is abandoned then (its record's lock expires at the leader).
STOP_TASKS_TIMEOUT_S = 5.0


class ShareAgent:
    """A share-group member that runs ``handler`` on each record, or on batches of records.

    Args:
        ctx: the member context of the app.
        handler: ``async def handler(record: ShareRecord) -> ACCEPT | RELEASE | REJECT | None``;
            with ``batch=True``, ``async def handler(records: list[ShareRecord]) ->
            Sequence[ACCEPT | RELEASE | REJECT | None]`` (one outcome per record, in order) or a
            single outcome for the whole batch (see :mod:`queueflow.member.agent`).
        topic: the source topic name.
        group: the share group id.
        options: how it runs the handler (:class:`ShareAgentOptions`; default: its defaults).
        decode: decodes each record before the handler sees it (None: raw bytes).
        encode: names the destinations of results and encodes them (None:
            :class:`~queueflow.member.agent.publishing.PlainEncoder`, topic names only).
        client_id: the Kafka client id (defaults to the agent's name).
        **fields: :class:`ShareAgentOptions` fields (``concurrency=``, ``name=``,
            ``lock_duration_ms=``, ``batch=``, ``batch_size=``, ``handler_timeout_ms=``), on top
            of ``options``.

    Raises:
        ConfigurationError: an invalid option (see :class:`ShareAgentOptions`), a lock
            duration out of the group's range, or an async generator handler with
            ``batch=True`` (at declaration); an unknown topic (at :meth:`start`).
        TypeError: an unknown option field.
    """

    def __init__(
        self,
        ctx: MemberContext,
        handler: Handler,
        topic: str,
        group: str,
        options: ShareAgentOptions | None = None,
        *,
        decode: Decoder | None = None,
        encode: Encoder | None = None,
        client_id: str | None = None,
        **fields: Any,
    ) -> None:
        options = options or ShareAgentOptions()
        if fields:
            options = dataclasses.replace(options, **fields)
        options.check_lock_duration(ctx.settings)
        name = options.agent_name(handler)
        if options.batch and inspect.isasyncgenfunction(handler):
            raise ConfigurationError(
                f"share agent {name}: an async generator handler can't "
                "be a batch handler (batch=True); return one queueflow.Result per record instead"
            )
        self.ctx = ctx
        self.handler = handler
        self.options = options
        self.topic_name = topic
        self.group = group
        self.name = options.agent_name(handler)
        self.decode = decode
        self.client_id = client_id or self.name
        self.stats = AgentStats()
        self.session: ShareFetchSession | None = None
        settings = ctx.settings
        self.flow = FlowControl(
            options.concurrency,
            settings.max_poll_records,
            (options.lock_duration_ms or settings.record_lock_duration_ms) / 1000,
        )
        self.lifecycle: Lifecycle[AgentState] = Lifecycle(
            f"share agent {self.name}", AgentState.CREATED, AGENT_TRANSITIONS
        )
        self.log = get_logger("queueflow.member.agent", group=group, topic=topic, agent=self.name)
        self._tasks: set[asyncio.Task[None]] = set()
        self.dispatch = Dispatcher(self)
        self.deadlines = Deadlines(self)
        self.runner = HandlerRunner(self)
        #: Publishes results (its producer opens on first use: none for agents without any).
        self.publisher = Publisher(self, encode or PlainEncoder())
        #: ``processing_guarantee``, resolved (None: the app's
        #: ``queueflow.processing.guarantee``).
        self.processing_guarantee = str(
            options.processing_guarantee or ctx.settings.processing_guarantee
        )
        if self.processing_guarantee != str(ctx.settings.processing_guarantee) == "at_least_once":
            # The leaders read the ack topic only on an exactly_once app: the transactional
            # acknowledgements of this agent would never be applied.
            raise ConfigurationError(
                f"share agent {self.name}: processing_guarantee='exactly_once' needs "
                "queueflow.processing.guarantee=exactly_once on the app (share_settings or "
                "QUEUEFLOW_PROCESSING_GUARANTEE), so that its leaders apply transactional "
                "acknowledgements"
            )
        #: The exactly_once commit path (set at start), or None.
        self.transactions: TransactionalPublisher | None = None

    # -- options ---------------------------------------------------------------------------
    @property
    def concurrency(self) -> int:
        """Handler tasks in this process."""
        return self.options.concurrency

    @property
    def lock_duration_ms(self) -> int | None:
        """This member's acquisition lock duration (ms), or ``None`` for the group's."""
        return self.options.lock_duration_ms

    @property
    def batch(self) -> bool:
        """The handler is a batch handler."""
        return self.options.batch

    @property
    def batch_size(self) -> int | None:
        """With :attr:`batch`, the most records per handler call."""
        return self.options.batch_size

    @property
    def handler_timeout_ms(self) -> int | None:
        """A handler call's timeout (ms), or ``None``: bounded by its records' locks only."""
        return self.options.handler_timeout_ms

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
    @property
    def state(self) -> AgentState:
        """Where the agent is in its lifecycle."""
        return self.lifecycle.state

    @property
    def stopping(self) -> bool:
        """:meth:`stop` was called (``STOPPING`` or ``STOPPED``): loops end, nothing starts."""
        return self.lifecycle.state in AGENT_STOPPING

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task of the agent (cancelled by :meth:`stop`)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def spawn_handler_task(self, index: int) -> None:
        """Start handler task ``index``; one that ends while the agent runs is logged and
        started again (it never should: a handler's raise or cancellation costs its records
        only, see :meth:`HandlerRunner.call`)."""
        task = self.spawn(self.runner.worker(index))
        task.add_done_callback(lambda done: self._handler_task_ended(index, done))

    def _handler_task_ended(self, index: int, task: asyncio.Task[None]) -> None:
        if self.stopping:
            return
        error = None if task.cancelled() else task.exception()
        self.log.error(
            "share_agent_handler_task_restarted",
            task=index,
            error="cancelled" if error is None and task.cancelled() else safe_repr(error),
            exc_info=error,
            note="a handler task ended while the agent runs; a new one takes its place",
        )
        self.deadlines.end_call(self.deadlines.calls[index])  # no deadline left behind
        self.spawn_handler_task(index)

    async def start(self) -> None:
        """Join the share group and start the fetch loops and handler tasks.

        A join no coordinator answered within ``queueflow.member.join.timeout.ms`` is logged
        (``share_agent_join_failed``) and tried again: in a worker, the app's leader workers
        may still be starting. A ShareConsumer fails instead.

        Raises:
            ConfigurationError: the topic does not exist, or the app's internal topics don't
                (a wrong app id, or no leader worker ever ran).
            ShareGroupError: the coordinator refused the join.
            IllegalTransitionError: the agent was started before.
        """
        self.lifecycle.move(AgentState.STARTING)
        while True:
            self.session = ShareFetchSession(
                self.ctx,
                self.group,
                [self.topic_name],
                self.client_id,
                self.lock_duration_ms,
            )
            self.session.lazy_records = self.options.lazy_records
            try:
                await self.session.start()
                if self.options.ordering == "key":  # the group must be key-ordered
                    check_key_ordered(self.group, self.session.router.membership.ticket)
                break
            except (ShareGroupError, ConfigurationError) as exc:
                retry = (
                    isinstance(exc, ShareGroupError)
                    and exc.code is ErrorCode.REQUEST_TIMED_OUT
                    and not self.stopping
                )
                if retry:  # said first: closing the clients may be slow with the broker gone
                    self.log.error(
                        "share_agent_join_failed",
                        error=str(exc),
                        note="trying again; a worker of the app with role 'all' or 'leader' "
                        "must be running",
                    )
                await self.session.close(leave=False)
                if not retry:
                    raise
        self.log = get_logger(  # the member id is known once joined
            "queueflow.member.agent",
            group=self.group,
            topic=self.topic_name,
            agent=self.name,
            member_id=self.session.member_id,
        )
        if self.stopping:  # stopped while it joined: its tasks would end at once
            return
        await self.publisher.check_destinations()
        if self.processing_guarantee == "exactly_once":
            await self._start_transactions(self.session.member_id)
        if self.stopping:
            return
        self.lifecycle.move(AgentState.RUNNING)
        dispatch = self.dispatch
        for index in range(self.concurrency):
            self.spawn_handler_task(index)
        self.spawn(dispatch.supervise())
        self.spawn(dispatch.send_acks_while_parked())
        self.spawn(self.deadlines.watch())
        if self.transactions is not None:
            self.spawn(self.transactions.run())
        self.log.info(
            "share_agent_started",
            concurrency=self.concurrency,
            batch=self.batch,
            batch_size=self.batch_size,
        )

    async def _start_transactions(self, member_id: str) -> None:
        """Open the exactly_once agent's transactional producer.

        Raises:
            ConfigurationError: it could not start (no transactions on the cluster, or the
                member's principal lacks the transactional-id ACLs); the error names why.
        """
        transactions = TransactionalPublisher(self)
        try:
            await transactions.start(member_id)
        except Exception as exc:
            assert self.session is not None
            await self.session.close(leave=True)
            raise ConfigurationError(
                f"share agent {self.name}: processing_guarantee='exactly_once' needs Kafka "
                f"transactions, and its transactional producer could not start: {exc!r}. "
                "The brokers need transaction.state.log.* set up (a replication factor they "
                "can meet); the member's principal needs Write and Describe on the "
                f"transactional-id prefix {self.ctx.app_id}-share-txn- and Write on the ack "
                'topic (docs/operations.md "Minimal ACLs")'
            ) from exc
        self.transactions = transactions

    async def stop(self) -> None:
        """Graceful drain: stop fetching, let running handlers finish within
        ``queueflow.shutdown.timeout.ms``, release what was not started, flush acknowledgements
        and leave the group (the leaders release anything still held). Calling it again (or
        while it runs) does nothing."""
        if self.stopping:
            return
        self.lifecycle.move(AgentState.STOPPING)
        clock = self.ctx.clock
        started = clock.monotonic()
        runner, dispatch = self.runner, self.dispatch
        dispatch.cancel_fetchers()
        await dispatch.end_long_polls()  # a parked ShareFetch could be held for seconds
        runner.release_queued()
        if runner.unfinished:
            timeout = self.ctx.settings.shutdown_timeout_ms / 1000
            if not await runner.drain(timeout):
                # Those handlers are cancelled below (CancelledError); their records go back
                # when the member leaves.
                self.log.warning("drain_timeout", unfinished=runner.unfinished, timeout_s=timeout)
        runner.release_queued()  # records of a ShareFetch that completed meanwhile
        if self.transactions is not None:
            await self.transactions.flush()
        await dispatch.flush_all()
        if self.session is not None:
            await self.session.close(leave=True)
        tasks = [*self._tasks, *runner.publishing]  # publishing: its records go back too
        for task in tasks:
            task.cancel()
        if tasks:
            _, abandoned = await asyncio.wait(tasks, timeout=STOP_TASKS_TIMEOUT_S)
            if abandoned:  # handlers that ignore cancellation: their locks expire
                self.log.error("share_agent_tasks_abandoned", tasks=len(abandoned))
        await self.publisher.close()
        if self.transactions is not None:
            await self.transactions.close()
        drain_s = clock.monotonic() - started
        self.ctx.metrics.drain_seconds.labels(self.group, self.name).set(drain_s)
        if self.session is not None:
            self.stats.acks_dropped = self.session.acks_dropped
        self.lifecycle.move(AgentState.STOPPED)
        self.log.info("share_agent_drained", drain_ms=int(drain_s * 1000), **self.stats.as_dict())
