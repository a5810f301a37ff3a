"""The ShareFetch session of one member: the one place that fetches and acknowledges.

Both :class:`~queueflow.ShareConsumer` and ``@share_agent`` (:class:`~queueflow.ShareAgent`)
run on a :class:`ShareFetchSession`. It owns

* membership (join, heartbeats, leave) and the request/reply transport;
* the acknowledgement buffer: outcomes ride along with the next ShareFetch of their
  share-partition, or go alone (ShareAcknowledge) in :meth:`ShareFetchSession.flush`
  (KIP-932 "Batching");
* what happens when a leader refuses a request's acknowledgements as a whole (KIP-932 applies a
  request's acknowledgements atomically): the stale offsets it names are dropped and the others
  are sent again on their own (:meth:`~queueflow.member.acks.AcknowledgementBuffer.refused`);
* reading the acquired records by offset, with GAP for offsets without a record and RELEASE
  for every acquired offset when the read fails, and each record's lock deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog
from aiokafka.errors import CorruptRecordException, KafkaError

from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.logging import SkipLogLimiter, get_logger
from queueflow.member.context import MemberContext
from queueflow.member.corrupt import release_corrupt
from queueflow.member.direct import DirectClient
from queueflow.member.lifecycle import SESSION_TRANSITIONS, Lifecycle, SessionState
from queueflow.member.membership import Membership
from queueflow.member.reader import ReadResult, carried_records
from queueflow.member.routing import FetchRouter
from queueflow.member.transport import Requester
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics as internal
from queueflow.protocol.roles import ControlAuth
from queueflow.protocol.sealed_replies import reply_route
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

__all__ = [
    "AcknowledgementCallback",
    "Acquisition",
    "FetchResult",
    "ShareFetchSession",
    "ranges_text",
]

log = structlog.get_logger("queueflow.member.session")

#: ``callback(tp, offsets, error)`` after a leader answered acknowledgements: the offsets
#: applied (``error`` None), or refused for good (``error`` the leader's).
AcknowledgementCallback = Callable[[TopicPartition, list[int], ShareGroupError | None], None]

#: Acknowledgement errors after which the still-valid outcomes are sent again.
_SPLITTABLE = {ErrorCode.INVALID_RECORD_STATE.value, ErrorCode.INVALID_REQUEST.value}


def ranges_text(offsets: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` → ``"1..3,7"`` (sorted offsets, for log lines)."""
    out: list[str] = []
    for _, run in itertools.groupby(enumerate(offsets), key=lambda item: item[1] - item[0]):
        block = [offset for _, offset in run]
        out.append(str(block[0]) if len(block) == 1 else f"{block[0]}..{block[-1]}")
    return ",".join(out)


def _offsets(acks: list[protocol.WireAck]) -> list[int]:
    return [o for first, last, _ in acks for o in range(first, last + 1)]


@dataclass(slots=True)
class FetchResult:
    """What one ShareFetch brought.

    Attributes:
        records: the acquired records, in offset order, with their lock deadline set.
        error: the leader's error for the fetch as a whole (e.g. ``CORRUPT_STATE``), or None.
        round_trip_s: request to answer, in seconds.
        acquired: how many offsets were acquired (records plus gaps).
        lock_timeout_ms: their acquisition lock duration as the leader said (KIP-1222
            ``AcquisitionLockTimeoutMs``), 0 if it did not.
        long_polled: the request went to a leader that holds empty polls (the direct path
            with ``fetch.max.wait.ms`` > 0; it answers at once only when it acquired records or
            the request carried acknowledgements), so an empty answer needs no back-off.
        undecodable: acquired records that could not be decoded (REJECTed, not in
            ``records``).
        lock_deadline: the records' acquisition lock deadline (monotonic s: the request's
            send time plus ``lock_timeout_ms``; ``inf`` when unknown), one for the whole fetch.
        batches: with :attr:`ShareFetchSession.forward_batches` on, the Kafka v2 record
            batches a direct-path answer carried, as the broker stored them (possibly
            compressed; bytes of the answer, not copied), once they parsed: every record of
            ``records`` whose offset lies inside one of them is in it; they may hold offsets
            that were not acquired. ``b""`` otherwise (nothing carried, the request topics, or
            the bytes did not parse and the records were read from Kafka).
    """

    records: list[ShareRecord] = field(default_factory=list)
    error: ShareGroupError | None = None
    round_trip_s: float = 0.0
    acquired: int = 0
    lock_timeout_ms: int = 0
    long_polled: bool = False
    undecodable: int = 0
    lock_deadline: float = math.inf
    batches: bytes = b""


@dataclass(slots=True)
class Acquisition:
    """What one ShareFetch acquired, as coordinates (see :meth:`ShareFetchSession.acquire`).

    Attributes:
        tp: the share-partition.
        ranges: acquired offset ranges ``(first, last, delivery_count)``, inclusive, in order.
        lock_timeout_ms: their acquisition lock duration as the leader said (KIP-1222
            ``AcquisitionLockTimeoutMs``), 0 if it did not.
        sent: ``ctx.clock.monotonic()`` seconds when the request was sent: the locks last at
            least until ``sent + lock_timeout_ms / 1000``.
        error: the leader's error for the fetch as a whole, or None.
        read_committed: the group reads committed records only: read ``ranges`` with a
            ``read_committed`` fetch (``share.isolation.level``).
    """

    tp: TopicPartition
    ranges: list[tuple[int, int, int]] = field(default_factory=list)
    lock_timeout_ms: int = 0
    sent: float = 0.0
    error: ShareGroupError | None = None
    read_committed: bool = False

    @property
    def count(self) -> int:
        """How many offsets were acquired."""
        return sum(last - first + 1 for first, last, _ in self.ranges)


class ShareFetchSession:
    """One member's ShareFetch session.

    Args:
        ctx: the member context.
        group: the share group id.
        topics: the subscribed topics.
        client_id: shown by admin tooling.
        lock_duration_ms: this member's own acquisition lock duration (ms), or None for the
            group's (KIP-932 lets a consumer ask for its own, bounded by
            ``group.share.max.record.lock.duration.ms``).
        on_acknowledged: called after each answered acknowledgement batch.
        member_id: the member id (default: a new UUID).
        membership: builds the membership (:class:`Membership`'s arguments): another one acts
            for a member that heartbeats elsewhere (queueflow.listener.delegated).

    Raises (from :meth:`start`):
        ConfigurationError: a subscribed topic does not exist.
        ShareGroupError: ``REQUEST_TIMED_OUT`` when no coordinator answers the join.
    """

    def __init__(
        self,
        ctx: MemberContext,
        group: str,
        topics: Iterable[str],
        client_id: str,
        lock_duration_ms: int | None = None,
        on_acknowledged: AcknowledgementCallback | None = None,
        *,
        member_id: str | None = None,
        membership: Callable[..., Membership] = Membership,
    ) -> None:
        self.ctx = ctx
        self.group = group
        self.lock_duration_ms = lock_duration_ms
        #: Carried records as lazy views (a share agent's ``lazy_records=True``; see
        #: :mod:`queueflow.member.lazy_records`).
        self.lazy_records = False
        #: Keep the record batches a leader's answer carried in :attr:`FetchResult.batches`
        #: (the Kafka-protocol listener forwards them to its client as they are).
        self.forward_batches = False
        self.on_acknowledged = on_acknowledged
        self.partitions: dict[str, int] = {}
        #: Outcomes the leaders refused as stale (their records are delivered again).
        self.acks_dropped = 0
        self.member_id = member_id or str(uuid.uuid4())
        s = ctx.settings
        # hmac: requests encrypted to the workers' key with this member's own key pair, and
        # replies sealed to it, keyed by a pseudonym of it rather than the member id
        # (queueflow.protocol.envelope, queueflow.protocol.sealed_replies)
        auth = ControlAuth.from_settings(s, ctx.app_id, role="member")
        reply_key = auth.reply_key
        self._request_key = self.member_id if reply_key is None else reply_route(reply_key.public)
        self._requester = Requester(
            ctx.io.transport(self._request_key, client_id),
            ctx.app_id,
            ctx.settings.request_timeout_ms,
            auth,
            metrics=ctx.metrics,
        )
        self._membership = membership(
            self._requester,
            ctx.app_id,
            group,
            topics,
            ctx.settings,
            client_id,
            self.member_id,
            metrics=ctx.metrics,
            principal=ctx.io.principal,
        )
        self._direct = DirectClient(auth, ctx.direct_ssl)
        #: Sends the ShareFetches (direct path or request topic, ticket refresh).
        self.router = FetchRouter(
            ctx,
            group,
            self.member_id,
            lock_duration_ms,
            self._requester,
            self._membership,
            self._direct,
        )
        self.acks = self.router.acks
        self._lifecycle: Lifecycle[SessionState] = Lifecycle(
            f"ShareFetch session of member {self.member_id}",
            SessionState.CREATED,
            SESSION_TRANSITIONS,
        )
        self._source = ctx.io.record_source()
        #: Records REJECTed because they could not be decoded (``_reject_undecodable``).
        self.undecodable = 0
        self._undecodable_log = SkipLogLimiter(lambda: int(ctx.clock.monotonic() * 1000))
        self._log = get_logger("queueflow.member.session", group=group, member_id=self.member_id)

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def state(self) -> SessionState:
        """Where the session is in its lifecycle."""
        return self._lifecycle.state

    @property
    def topics(self) -> list[str]:
        """The subscribed topics."""
        return self._membership.topics

    @property
    def assignment(self) -> set[TopicPartition]:
        """The share-partitions the coordinator assigned to this member."""
        return self._membership.assignment

    @property
    def assignment_changed(self) -> asyncio.Event:
        """Set whenever :attr:`assignment` changes (clear it after reading)."""
        return self._membership.assignment_changed

    async def start(self) -> None:
        """Check the topics, connect, join the group and start heartbeating.

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` when the reply channel could not be set up
                within ``queueflow.member.join.timeout.ms`` (the broker went away meanwhile;
                a share agent then starts over, waiting for the broker), or the join failed
                (see :meth:`Membership.join`).
            ConfigurationError: a topic or the app's internal topics are missing.
        """
        io = self.ctx.io
        # the broker up, the source topics and the app's internal topics there
        self.partitions = await io.prepare(self.ctx.settings, self.topics)
        self._membership.coordinator_partition = internal.coordinator_partition(
            self.group, await io.coordinator_partitions()
        )
        if self._lifecycle.state is SessionState.CLOSED:  # closed while it checked the topics
            return
        self._lifecycle.move(SessionState.STARTED)
        await self._start_requester()
        await self._membership.join()

    async def _start_requester(self) -> None:
        # Bounded: a broker that goes away here leaves aiokafka's offset lookup of the reply
        # partition retrying with no limit of its own, and the member would never start over.
        limit_ms = self.ctx.settings.join_timeout_ms
        try:
            await asyncio.wait_for(self._requester.start(), limit_ms / 1000)
        except (asyncio.TimeoutError, KafkaError) as exc:
            what = "timed out" if isinstance(exc, asyncio.TimeoutError) else repr(exc)
            raise ShareGroupError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"the reply channel of member {self.member_id} could not be set up within "
                f"{limit_ms} ms ({what}): is the broker reachable? "
                f"(queueflow.member.join.timeout.ms)",
            ) from None

    async def close(self, leave: bool = True) -> None:
        """Leave the group (so leaders release what this member holds) and disconnect."""
        if self._lifecycle.move(SessionState.CLOSED) is SessionState.STARTED:
            if leave:
                await self._membership.leave()
            else:
                await self._membership.stop()
        await self._source.close()
        await self._direct.close()
        await self._requester.close()

    # -- acknowledgements ------------------------------------------------------------------
    def acknowledge(
        self,
        tp: TopicPartition,
        offset: int,
        kind: AcknowledgeType,
        error: protocol.AckError | None = None,
        *,
        delay_ms: int = 0,
        undelivered: bool = False,
    ) -> None:
        """Record the outcome of one record; it leaves with the next request of ``tp``.
        ``error`` and the RELEASE options: :meth:`AcknowledgementBuffer.add`."""
        self.acks.add(tp, offset, kind, error, delay_ms=delay_ms, undelivered=undelivered)

    def acknowledge_range(
        self, tp: TopicPartition, first: int, last: int, kind: AcknowledgeType
    ) -> None:
        """Record one outcome for the offsets ``first..last`` (inclusive) of ``tp``, e.g. a
        RENEW (KIP-1222) of records still being worked on, or the outcome of a batch acquired
        with :meth:`acquire`; it leaves with the next request of ``tp`` (or :meth:`flush`)."""
        self.acks.add_range(tp, first, last, kind)

    def acknowledge_message(
        self, tp: TopicPartition, acks: list[protocol.WireAck], topic: str
    ) -> tuple[bytes, bytes]:
        """See :meth:`FetchRouter.acknowledge_message` (keyed as this member's requests)."""
        return self.router.acknowledge_message(tp, acks, topic, self._request_key.encode())

    def remember_released(self, record: ShareRecord) -> None:
        """Keep a RELEASEd record so that its redelivery to this member needs no Kafka read."""
        self._source.remember_released(record)

    async def flush(self, tp: TopicPartition) -> ShareGroupError | None:
        """Send the pending acknowledgements of ``tp`` now (ShareAcknowledge), one request per
        batch (a batch whose earlier request failed goes alone first), and wait for the answers.

        Returns:
            None if the last batch was applied, else its error. A request that got no answer
            stops the flush: its acknowledgements are kept to be sent again, and its error
            (``REQUEST_TIMED_OUT``) is returned.
        """
        result: ShareGroupError | None = None
        while acks := self.acks.take(tp):
            try:
                response, _ = await self._request(tp, 0, acks)
            except ShareGroupError as exc:
                self.acks.restore(tp, acks)  # the leader may not have seen them
                return exc
            result = self._acknowledged(tp, acks, response)
        return result

    async def flush_all(self) -> dict[TopicPartition, ShareGroupError | None]:
        """:meth:`flush` every share-partition with pending acknowledgements."""
        return {tp: await self.flush(tp) for tp in self.acks.partitions()}

    # -- fetching --------------------------------------------------------------------------
    async def fetch(
        self, tp: TopicPartition, max_records: int, max_wait_ms: int | None = None
    ) -> FetchResult:
        """One ShareFetch of ``tp`` for up to ``max_records`` records (0: acknowledge only),
        with the pending acknowledgements of ``tp`` riding along, then read the records.

        ``max_wait_ms`` (default ``fetch.max.wait.ms``) is how long the leader may hold the
        request when nothing is available (KIP-932 ``MaxWaitMs``; the direct path only).

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` (the acknowledgements are kept to be sent
                again), or the read of the acquired records failed (they were RELEASEd).
            aiokafka.errors.KafkaError: the request could not be sent.
        """
        acks = self.acks.take(tp)
        if not max_records and not acks:
            return FetchResult()
        clock = self.ctx.clock
        sent = clock.monotonic()
        wait_ms = self.ctx.settings.fetch_max_wait_ms if max_wait_ms is None else max_wait_ms
        try:
            response, direct = await self._request(tp, max_records, acks, wait_ms)
        except Exception:
            self.acks.restore(tp, acks)  # the leader may not have seen them: send them again
            raise
        result = FetchResult(
            round_trip_s=clock.monotonic() - sent,
            long_polled=direct and bool(max_records and wait_ms),
        )
        if acks:
            self._acknowledged(tp, acks, response)
        if response.error != ErrorCode.NONE.value:
            result.error = ShareGroupError(ErrorCode(response.error), response.error_message)
            return result
        if response.acquired:
            result.acquired = sum(last - first + 1 for first, last, _ in response.acquired)
            result.lock_timeout_ms = response.lock_timeout_ms
            deadline = (
                sent + response.lock_timeout_ms / 1000 if response.lock_timeout_ms else math.inf
            )
            before = self.undecodable
            result.lock_deadline = deadline
            result.records = await self._read(tp, response, result)
            result.undecodable = self.undecodable - before
        return result

    async def acquire(
        self, tp: TopicPartition, max_records: int, max_wait_ms: int = 0
    ) -> Acquisition:
        """One ShareFetch of ``tp`` for up to ``max_records`` records that returns their
        coordinates without reading them (for members whose records are read elsewhere, such
        as a Spark source's executors); pending acknowledgements of ``tp`` ride along.
        ``max_wait_ms``: as in :meth:`fetch` (default 0: answer at once).

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` (the acknowledgements are kept to be sent
                again).
            aiokafka.errors.KafkaError: the request could not be sent.
        """
        acks = self.acks.take(tp)
        sent = self.ctx.clock.monotonic()
        try:
            response, _ = await self._request(tp, max_records, acks, max_wait_ms)
        except Exception:
            self.acks.restore(tp, acks)
            raise
        if acks:
            self._acknowledged(tp, acks, response)
        result = Acquisition(tp, sent=sent, read_committed=response.read_committed)
        if response.error != ErrorCode.NONE.value:
            result.error = ShareGroupError(ErrorCode(response.error), response.error_message)
        else:
            result.ranges = list(response.acquired)
            result.lock_timeout_ms = response.lock_timeout_ms
        return result

    def prepare(self, tp: TopicPartition) -> None:
        """``tp`` was just assigned: its record source connects in the background."""
        self._source.prepare(tp)

    async def drop(self, tp: TopicPartition) -> None:
        """Forget a share-partition no longer assigned (close its reader)."""
        await self._source.drop(tp)

    async def _request(
        self,
        tp: TopicPartition,
        max_records: int,
        acks: list[protocol.WireAck],
        max_wait_ms: int = 0,
    ) -> tuple[protocol.ShareFetchResponse, bool]:
        """Send one ShareFetch through the :class:`~queueflow.member.routing.FetchRouter`;
        returns the answer and whether it came over the direct path.

        Raises:
            RuntimeError: :meth:`start` was not called.
        """
        if self._lifecycle.state is SessionState.CREATED:
            raise RuntimeError("ShareFetchSession.start() was not called")
        return await self.router.request(tp, max_records, acks, max_wait_ms)

    async def end_long_polls(self, tp: TopicPartition) -> None:
        """Have the leader answer this member's parked ShareFetches of ``tp`` now, with nothing
        acquired (call it when ``tp`` was reassigned: a parked request would otherwise acquire
        records for a member that no longer fetches them)."""
        await self.router.end_long_polls(tp)

    async def _read(
        self, tp: TopicPartition, response: protocol.ShareFetchResponse, result: FetchResult
    ) -> list[ShareRecord]:
        """Take the records the answer carried (:func:`~queueflow.member.reader.carried_records`)
        and read the other acquired ranges (``read_committed`` if the leader says so); GAP the
        gaps, RELEASE every acquired offset if the read fails (rather than wait for their
        locks). Every record gets ``result.lock_deadline`` and its delivery time: the carried
        ones from the parser as it builds them, the ones read apart afterwards."""
        try:
            records, gaps, undecodable = await self._take_or_read(tp, response, result)
        except Exception:
            for first, last, _count in response.acquired:
                for offset in range(first, last + 1):  # no handler saw them
                    self.acks.add(tp, offset, AcknowledgeType.RELEASE, undelivered=True)
            raise
        for offset in gaps:
            self.acks.add(tp, offset, AcknowledgeType.GAP)
        self.ctx.metrics.acknowledgements.labels(self.group, tp.topic, "gap").inc(len(gaps))
        for record, reason in undecodable:
            self._reject_undecodable(record, reason)
        return records

    async def _take_or_read(
        self, tp: TopicPartition, response: protocol.ShareFetchResponse, result: FetchResult
    ) -> ReadResult:
        """The acquired records: those the answer carried (their bytes kept in
        ``result.batches`` with :attr:`forward_batches`), the rest read from Kafka; each with
        ``result.lock_deadline`` and its delivery time set."""
        lock_deadline = result.lock_deadline
        carried, rest = _take_carried(self, tp, response, result)
        if not rest:
            return carried
        try:
            records, gaps, undecodable = await self._source.read(
                tp, rest, self.ctx.settings.request_timeout_ms, response.read_committed
            )
        except CorruptRecordException as exc:  # check.crcs: what was read before it goes on
            records, gaps, undecodable = release_corrupt(self, tp, rest, exc)
        now = self.ctx.clock.monotonic()
        for record in records:
            record.delivered_at = now
            if lock_deadline != math.inf:
                record.lock_deadline = lock_deadline
        if not carried[0] and not carried[1] and not carried[2]:
            return records, gaps, undecodable
        return carried[0] + records, carried[1] + gaps, carried[2] + undecodable

    def _reject_undecodable(self, record: ShareRecord, reason: str) -> None:
        """REJECT a record that can't be decoded (:func:`_reject_undecodable`)."""
        _reject_undecodable(self, record, reason)

    def _acknowledged(
        self,
        tp: TopicPartition,
        acks: list[protocol.WireAck],
        response: protocol.ShareFetchResponse,
    ) -> ShareGroupError | None:
        """Handle the leader's answer to a request's acknowledgements; returns its error
        (:func:`_acknowledged`)."""
        return _acknowledged(self, tp, acks, response)


def _take_carried(
    session: ShareFetchSession,
    tp: TopicPartition,
    response: protocol.ShareFetchResponse,
    result: FetchResult,
) -> tuple[ReadResult, list[protocol.WireAcquired]]:
    """The acquired records ``response`` carried (:func:`~queueflow.member.reader.
    carried_records`) and the acquired ranges left to read; their bytes kept in
    ``result.batches`` with ``session.forward_batches``. Bytes that don't parse are logged and
    every acquired offset is left to read."""
    if not response.records:
        return ([], [], []), response.acquired
    try:
        carried = carried_records(
            response.records,
            tp.topic,
            tp.partition,
            response.acquired,
            response.records_end,
            check_crcs=session.ctx.settings.check_crcs,
            lazy=session.lazy_records,
            lock_deadline=result.lock_deadline,
            delivered_at=session.ctx.clock.monotonic(),
        )
    except Exception as exc:  # unreadable bytes: read every acquired offset instead
        session._log.warning(
            "carried_records_unreadable",
            topic=tp.topic,
            partition=tp.partition,
            error=repr(exc),
            note="the member reads the acquired records from the broker instead",
        )
        return ([], [], []), response.acquired
    if session.forward_batches:
        result.batches = response.records
    return carried


def _reject_undecodable(session: ShareFetchSession, record: ShareRecord, reason: str) -> None:
    """REJECT a record that can't be decoded (it would fail the same way on every delivery;
    docs/guide.md "Handler outcomes"), count it, log it (rate-limited)."""
    tp = TopicPartition(record.topic, record.partition)
    session.acks.add(tp, record.offset, AcknowledgeType.REJECT, _undecodable(reason))
    session.undecodable += 1
    session.ctx.metrics.handler_errors.labels(session.group, record.topic, "undecodable").inc()
    suppressed = session._undecodable_log.admit()
    if suppressed is not None:
        session._log.error(
            "undecodable_record_rejected",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            delivery_count=record.delivery_count,
            error=reason,
            suppressed=suppressed,
            note="REJECTed before any handler saw it: it can't be decoded on any delivery",
        )


def _acknowledged(
    session: ShareFetchSession,
    tp: TopicPartition,
    acks: list[protocol.WireAck],
    response: protocol.ShareFetchResponse,
) -> ShareGroupError | None:
    """Handle the leader's answer to ``session``'s acknowledgements; returns its error.

    Refused as stale (``INVALID_RECORD_STATE``, ``INVALID_REQUEST``): the offsets the leader
    names are dropped and the rest is sent again on its own (only the stale ones are lost,
    and their records are delivered again). Refused otherwise (``CORRUPT_STATE`` ...): all
    are lost and their records are delivered again.
    """
    callback = session.on_acknowledged
    if response.ack_error == ErrorCode.NONE.value:
        session.acks.settled(tp, _offsets(acks))
        if callback is not None:
            callback(tp, _offsets(acks), None)
        return None
    error = ShareGroupError(ErrorCode(response.ack_error), response.ack_error_message)
    if response.ack_error not in _SPLITTABLE:
        session.acks.settled(tp, _offsets(acks))
        session._log.warning(
            "acknowledgement_refused",
            topic=tp.topic,
            partition=tp.partition,
            error=response.ack_error,
            detail=response.ack_error_message,
            records=sum(last - first + 1 for first, last, _ in acks),
            note="these records will be delivered again",
        )
        if callback is not None:
            callback(tp, _offsets(acks), error)
        return error
    dropped = session.acks.refused(tp, acks, response.ack_stale)
    session.acks.settled(tp, dropped)
    if dropped:
        session.acks_dropped += len(dropped)
        session.ctx.metrics.acknowledgements_dropped.labels(session.group, tp.topic).inc(
            len(dropped)
        )
        session._log.warning(
            "stale_acknowledgements_dropped",
            topic=tp.topic,
            partition=tp.partition,
            offsets=ranges_text(dropped),
            error=response.ack_error,
            detail=response.ack_error_message,
            note=(
                "not held for this member any more (lock elapsed, settled, or below the "
                "SPSO): unsettled ones are delivered again"
            ),
        )
        if callback is not None:
            callback(tp, dropped, error)
    return error


def _undecodable(reason: str) -> protocol.AckError:
    """The error sent with the REJECT of an undecodable record (dead-letter reason
    ``undecodable``; docs/guide.md "Dead-letter topics")."""
    return protocol.AckError(message=reason[: protocol.ACK_ERROR_MESSAGE_MAX], reason="undecodable")
