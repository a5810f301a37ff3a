"""The one place a leader's results become I/O (Kafka's coordinator runtime, which appends a
``CoordinatorResult``'s records and then sends its response)."""

from __future__ import annotations

from collections.abc import Callable

from queueflow.logging import SkipLogLimiter, get_logger
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.envelope import topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.server.context import ServerContext
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader.cache import SharePartitionCache
from queueflow.server.leader.positions import RequestPositions
from queueflow.server.leader.reports import ArchivedCounter
from queueflow.server.leader.results import LeaderResult
from queueflow.server.tickets import TicketGate
from queueflow.server.transport import monotonic_ms, send_reply
from queueflow.settings import StateDurability

__all__ = ["ResultApplier"]


class ResultApplier:
    """Performs the :class:`~queueflow.server.leader.results.LeaderResult` of one leader.

    Args:
        ctx: the server context (sender, metrics, flush, settings).
        topic: the source topic.
        cache: the leader's share-partitions (creates and deletes change it).
        positions: where request positions are written.
        auth: seals what the leader sends.
        tickets: the reply keys of members' tickets (sealed replies).
        step_down: ``step_down(partitions, reason)`` of the leader.
    """

    def __init__(
        self,
        ctx: ServerContext,
        topic: str,
        cache: SharePartitionCache,
        positions: RequestPositions,
        auth: ControlAuth,
        tickets: TicketGate,
        step_down: Callable[[list[int], str], None],
    ) -> None:
        self.ctx = ctx
        self.topic = topic
        self.cache = cache
        self.positions = positions
        self.auth = auth
        self.tickets = tickets
        self._step_down = step_down
        #: Rate limiters of refusals and of undecodable requests.
        self.refusals = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        self.skipped = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        self.archived = ArchivedCounter()
        self._state_writes = ctx.metrics.state_writes.labels(topic)
        self._log = get_logger("queueflow.server.leader", topic=topic)

    async def apply(self, result: LeaderResult, partition: int, sender_key: bytes = b"") -> None:
        """Perform ``result`` for request partition ``partition``. In order: state deletes,
        creations and writes (one delta per share-partition), the request position, the flush
        (``queueflow.leader.state.durability=acked``), metrics and log lines, replies to
        members and to the coordinator, and a step-down.

        ``sender_key``: the member key the request was encrypted with (``hmac``; empty: none):
        replies are sealed to it (check_sender made sure a valid ticket binds the same key), so
        that a refusal of a ticket that binds none still reaches its member.

        Raises:
            FencedStateEpochError: a write was refused (the leader stepped down meanwhile);
                nothing after it happened.
            ShareGroupError: a share-partition could not be created (an invalid offset).
            Exception: what the flush or a send raises.
        """
        for durable in result.deletes:
            durable.delete()
            self.cache.deleted((durable.group, durable.partition))
        for new in result.creates:
            self.cache.create(new.group, new.partition, new.start_offset)
        for durable in result.writes:
            self.persist(durable)
        self.ctx.state_changed.set()  # a lock may have been taken: the idle ticker looks again
        if result.position is not None:
            self.positions.write(partition, result.position)
        if result.flush and self.ctx.settings.state_durability is StateDurability.ACKED:
            await self.ctx.flush_state()
        self.record(result)
        for reply in result.replies:
            request = reply.request
            await send_reply(
                self.ctx,
                self.auth,
                request.member_id,
                request.reply_partition,
                protocol.encode(reply.response),
                sender_key or self.tickets.reply_key(request.ticket),
            )
        for answer in result.coordinator_replies:
            coordinator = topics.coordinator_topic(self.ctx.app_id)
            p = self.ctx.coordinator_partition(answer.group)
            body = self.auth.seal(protocol.encode(answer), topic_dest(coordinator, p))
            await self.ctx.sender.send(coordinator, p, body)
        if result.step_down is not None:
            self._step_down(list(result.step_down[0]), result.step_down[1])

    def persist(self, durable: DurableSharePartition) -> None:
        """Write what changed (one delta), count the write and the records it Archived.

        Raises:
            FencedStateEpochError: the share-partition is fenced; nothing is written.
        """
        if durable.persist():
            self._state_writes.inc()
        archived = self.archived.advance(durable)
        if archived:
            labels = (durable.group, self.topic, str(durable.partition))
            self.ctx.metrics.archived.labels(*labels).inc(archived)

    def record(self, result: LeaderResult) -> None:
        """Count ``result``'s metrics and write its log lines (rate-limited ones through their
        limiter, with how many were suppressed)."""
        metrics = self.ctx.metrics
        for inc in result.metrics:
            getattr(metrics, inc.metric).labels(*inc.labels).inc(inc.amount)
        for event in result.logs:
            fields = dict(event.fields)
            if event.limiter is not None:
                limiter = self.refusals if event.limiter == "refusals" else self.skipped
                suppressed = limiter.admit()
                if suppressed is None:
                    continue
                fields["suppressed"] = suppressed
            getattr(self._log, event.level)(event.event, **fields)
