"""Exactly-once publishing: a share agent's outcomes and results in one Kafka transaction.

An ``exactly_once`` agent (``processing_guarantee="exactly_once"``) has one transactional
producer (``transactional_id = <app>-share-txn-<group>-<member id>``, its
``transaction.timeout.ms`` the setting ``queueflow.transaction.timeout.ms``). Its ACCEPTs and
REJECTs are collected for at most ``share.acknowledgement.linger`` and committed together:

1. records whose acquisition lock ends within the lock margin are left out (RELEASEd on the
   normal path: their outcome could reach the leader after the lock elapsed);
2. ``begin``; produce every result; produce ONE message per share-partition to the ack topic
   (:func:`queueflow.protocol.topics.ack_topic`, same partition), whose bytes are the standalone
   ShareAcknowledge the member would send to the request topic, sealed for the ack topic
   (:meth:`~queueflow.member.session.ShareFetchSession.acknowledge_message`);
3. every produce must be acknowledged by the brokers, and before the earliest lock deadline of
   the batch (minus the margin), else abort; then ``commit``.

After an abort or a failed commit the records are RELEASEd on the normal path and one error is
logged (``share_agent_transaction_aborted``). RELEASE outcomes never enter a transaction. The
leaders apply the committed acknowledgements from the ack topic (read_committed), so a record's
outcome and its results become visible together or not at all (docs/guide.md "Producing
results").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from queueflow.member.acks import to_wire
from queueflow.member.agent.committed import CommittedOffsets, Seen
from queueflow.member.agent.publishing import Encoded, PublishError, encode_all, produce_all
from queueflow.member.agent.results import HandlerResult, safe_repr
from queueflow.member.producer import ResultProducer
from queueflow.protocol import topics as internal
from queueflow.protocol.messages import WireAck
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

if TYPE_CHECKING:
    from queueflow.member.agent.core import ShareAgent

__all__ = ["Pending", "TransactionalPublisher", "ack_batches", "split_late", "transactional_id"]

_RELEASE = AcknowledgeType.RELEASE


class CommitUnknown(Exception):
    """The commit request itself failed: the transaction may or may not have committed.

    Attributes:
        error: what the producer raised.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(f"the transaction's commit failed, its outcome is unknown: {error!r}")
        self.error = error


def transactional_id(app_id: str, group: str, member_id: str) -> str:
    """The transactional id of a member's share agent: ``<app>-share-txn-<group>-<member>``
    (ACLs: transactional-id Write/Describe on the prefix ``<app>-share-txn-``)."""
    return f"{app_id}-share-txn-{group}-{member_id}"


@dataclass(slots=True)
class Pending:
    """One record waiting for a transaction: its outcome (ACCEPT or REJECT) and its results,
    encoded."""

    record: ShareRecord
    outcome: AcknowledgeType
    encoded: list[Encoded]


def split_late(
    pending: Sequence[Pending], now: float, margin_s: float
) -> tuple[list[Pending], list[Pending]]:
    """``pending`` split into those that may enter a transaction now (their lock ends more
    than ``margin_s`` after monotonic ``now``) and those too late for one."""
    ready: list[Pending] = []
    late: list[Pending] = []
    for item in pending:
        (ready if item.record.lock_deadline - now > margin_s else late).append(item)
    return ready, late


def ack_batches(pending: Sequence[Pending]) -> dict[TopicPartition, list[WireAck]]:
    """The acknowledgements of ``pending`` per share-partition, as wire ranges."""
    outcomes: dict[TopicPartition, dict[int, AcknowledgeType]] = defaultdict(dict)
    for item in pending:
        record = item.record
        outcomes[TopicPartition(record.topic, record.partition)][record.offset] = item.outcome
    return {tp: to_wire(by_offset) for tp, by_offset in outcomes.items()}


class TransactionalPublisher:
    """Commits one ``exactly_once`` share agent's outcomes with their results (see the module
    docstring).

    Args:
        agent: the share agent (started: its session knows the member id).
    """

    def __init__(self, agent: ShareAgent) -> None:
        self.agent = agent
        self._pending: list[Pending] = []
        self._wake = asyncio.Event()
        self._producer: ResultProducer | None = None
        self._lock = asyncio.Lock()  # one transaction at a time
        self._member_id = ""
        #: Transactions committed and aborted (for tests and the drain log).
        self.committed = 0
        self.aborted = 0
        #: Offsets in a transaction or just committed: a second delivery of one to this member
        #: publishes nothing again (:mod:`~queueflow.member.agent.committed`).
        self.offsets = CommittedOffsets(window_s=max(4 * agent.flow.lock_s, 120.0))
        #: Copies of such offsets delivered again and not handled (for tests and the log).
        self.duplicates = 0

    async def start(self, member_id: str) -> None:
        """Open the transactional producer (fencing an older one of the same id).

        Raises:
            Exception: the producer could not start within ``queueflow.member.join.timeout.ms``
                (no transactions on the cluster, or no transactional-id ACL: aiokafka's error,
                or ``asyncio.TimeoutError``).
        """
        agent = self.agent
        ctx = agent.ctx
        self._member_id = member_id
        producer = ctx.io.result_producer(
            f"{agent.client_id}:txn",
            transactional_id(ctx.app_id, agent.group, member_id),
            ctx.settings.transaction_timeout_ms,
        )
        try:  # bounded: a cluster without a transaction coordinator would be waited on
            await asyncio.wait_for(producer.start(), ctx.settings.join_timeout_ms / 1000)
        except BaseException:
            await producer.close()
            raise
        self._producer = producer

    def submit(self, result: HandlerResult) -> HandlerResult:
        """Take the ACCEPTs and REJECTs of ``result`` into the next transaction; returns what
        the runner applies on the normal path now (its RELEASEs; all of ``result`` when the
        call failed)."""
        if result.failure is not None:
            return result
        outputs = result.outputs
        records, outcomes = result.records, result.outcomes
        encoder = self.agent.publisher.encoder
        try:  # encoded now: a value the serializer refuses costs its own call's records only
            encoded = [
                encode_all(encoder, [outputs[i]]) if outputs else [] for i in range(len(records))
            ]
        except PublishError as exc:
            self.agent.publisher.not_published(result, exc)
            return result._replace(outcomes=(_RELEASE,) * len(records), outputs=None)
        now = self.agent.ctx.clock.monotonic()
        settled: list[ShareRecord] = []
        settled_outcomes: list[AcknowledgeType] = []
        for record, outcome, mine in zip(records, outcomes, encoded, strict=True):
            seen, committed = self.offsets.seen(record, now)
            if seen is not Seen.NEW:  # a second copy of an offset in or past a transaction
                if self._duplicate(record, seen, committed):
                    settled.append(record)
                    settled_outcomes.append(committed or outcome)
                else:
                    self.agent.dispatch.unreserve(1)
            elif outcome is _RELEASE:
                settled.append(record)
                settled_outcomes.append(_RELEASE)
            else:
                self.offsets.claim(record)
                self._pending.append(Pending(record, outcome, mine))
        self._wake.set()
        return result._replace(records=settled, outcomes=tuple(settled_outcomes), outputs=None)

    def screen(self, records: list[ShareRecord]) -> list[ShareRecord]:
        """The records of a ShareFetch a handler should see: a copy of an offset this member
        has in a transaction is dropped, one it committed recently is acknowledged with the
        committed outcome (see :mod:`~queueflow.member.agent.committed`)."""
        offsets = self.offsets
        if not len(offsets):
            return records
        now = self.agent.ctx.clock.monotonic()
        kept: list[ShareRecord] = []
        for record in records:
            seen, committed = offsets.seen(record, now)
            if seen is Seen.NEW:
                kept.append(record)
            elif self._duplicate(record, seen, committed):
                assert committed is not None
                self.agent.runner.acknowledge(record, committed)
        return kept  # the caller settles the room of those left out

    def _duplicate(
        self, record: ShareRecord, seen: Seen, committed: AcknowledgeType | None
    ) -> bool:
        """Log and count a second delivery of an offset already in or past a transaction;
        True if it is to be acknowledged (committed: with ``committed``), False if dropped."""
        agent = self.agent
        self.duplicates += 1
        agent.log.warning(
            "share_agent_duplicate_delivery",
            seen=seen.value,
            outcome=committed.name if committed is not None else None,
            note="delivered again to the member that has it in a transaction or committed it; "
            "not handled again, so nothing is published twice",
            **agent.runner.where(record),
        )
        return seen is Seen.COMMITTED

    async def run(self) -> None:
        """The agent's commit loop: a transaction every ``share.acknowledgement.linger`` while
        outcomes wait (a task of the agent, until cancelled)."""
        linger_s = max(self.agent.ctx.settings.acknowledgement_linger_ms / 1000, 0.005)
        while True:
            await self._wake.wait()
            await asyncio.sleep(linger_s)
            await self.flush()

    async def flush(self) -> None:
        """Commit what waits now, in one transaction; never raises."""
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        self._wake.clear()
        if not pending:
            return
        agent = self.agent
        now = agent.ctx.clock.monotonic()
        ready, late = split_late(pending, now, agent.deadlines.lock_margin_s())
        for item in late:
            self.offsets.unclaim(item.record)
            # RELEASE, counted (its handler ran) and logged
            agent.runner.lock_expired_unhandled(item.record, undelivered=False)
        if not ready:
            return
        try:
            await self.commit(ready)
        except Exception as exc:
            self.aborted += 1
            await self._abort(ready, exc)
            return
        self.committed += 1
        runner = agent.runner
        done = agent.ctx.clock.monotonic()
        for item in ready:
            runner.counted(item.outcome)
            self.offsets.committed(item.record, item.outcome, done)
        agent.dispatch.unreserve(len(ready))

    async def commit(self, ready: list[Pending]) -> None:
        """One transaction: results and the ack messages of ``ready``, committed only if every
        produce was acknowledged before the batch's earliest lock deadline minus the margin.

        Raises:
            PublishError: a result could not be encoded or produced.
            Exception: the transaction failed (its records are RELEASEd by the caller).
        """
        if self._producer is None:  # closed after a failed transaction: a fresh one
            await self.start(self._member_id)
        producer = self._producer
        assert producer is not None
        agent = self.agent
        clock, session = agent.ctx.clock, agent.session
        assert session is not None
        records: list[Encoded] = [one for p in ready for one in p.encoded]
        ack_topic = internal.ack_topic(agent.ctx.app_id, agent.topic_name)
        for tp, acks in ack_batches(ready).items():
            key, value = session.acknowledge_message(tp, acks, ack_topic)
            records.append((ack_topic, value, key, (), tp.partition))
        # Commit only while every lock holds: the leaders keep a record Acquired until its lock
        # deadline, even after this member's removal, and apply a committed acknowledgement
        # before they release it.
        limit = min(p.record.lock_deadline for p in ready) - agent.deadlines.lock_margin_s()
        await producer.begin()
        sent: list[tuple[str, asyncio.Future[Any]]] = []

        current = [ack_topic]  # the topic being sent or awaited, for the error

        try:
            budget_s = max(limit - clock.monotonic(), 0.001)
            await asyncio.wait_for(produce_all(producer, records, current, sent), budget_s)
        except asyncio.TimeoutError:
            raise PublishError(
                current[0], "not acknowledged before the records' lock deadline"
            ) from None
        except Exception as exc:
            raise PublishError(current[0], exc) from exc
        finally:
            for _, fut in sent:
                if fut.done() and not fut.cancelled():
                    fut.exception()
        if clock.monotonic() >= limit:
            raise PublishError(ack_topic, "acknowledged after the records' lock deadline")
        try:
            await producer.commit()
        except Exception as exc:
            raise CommitUnknown(exc) from exc

    async def _abort(self, ready: list[Pending], exc: Exception) -> None:
        """The transaction of ``ready`` failed: abort it, then start a fresh producer (a failed
        transaction can leave the producer unusable, e.g. its sequence numbers out of order).

        The records are RELEASEd on the normal path only when the transaction is known not to
        have committed (the abort succeeded and the commit was not sent). Otherwise they are
        left to their locks: a committed acknowledgement is applied before its records can be
        released (docs/architecture.md "Exactly-once: transactional acknowledgements"), so a
        RELEASE could only race it. One error is logged either way.
        """
        agent = self.agent
        producer, self._producer = self._producer, None
        aborted = False
        if producer is not None:
            try:
                await producer.abort()
                aborted = not isinstance(exc, CommitUnknown)
            except Exception:  # the transaction is in an unknown state: the next producer
                aborted = False  # of the same id fences it (the coordinator ends it)
            with contextlib.suppress(Exception):
                await producer.close()
        runner = agent.runner
        for item in ready:
            self.offsets.unclaim(item.record)
        if aborted:
            for item in ready:
                runner.acknowledge(item.record, _RELEASE)
                if agent.session is not None:
                    agent.session.remember_released(item.record)
            agent.stats.released += len(ready)
        agent.dispatch.unreserve(len(ready))
        cause = exc.error if isinstance(exc, (PublishError, CommitUnknown)) else exc
        records = [item.record for item in ready]
        agent.log.error(
            "share_agent_transaction_aborted",
            sink_topic=exc.topic if isinstance(exc, PublishError) else None,
            error=safe_repr(cause),
            released=aborted,
            note="records RELEASEd on the normal path; nothing of the transaction is visible to "
            "read_committed consumers"
            if aborted
            else "the transaction may have committed: the records are left to their locks (the "
            "leaders apply a committed acknowledgement first)",
            **runner.where_batch(records),
        )

    async def close(self) -> None:
        """Commit what waits, then close the producer."""
        if self._producer is not None:
            await self.flush()
            producer, self._producer = self._producer, None
            await producer.close()
