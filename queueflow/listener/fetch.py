"""ShareFetch and ShareAcknowledge <-> the queueflow member's fetches and acknowledgements,
with KIP-932 share sessions and their epochs ("Share sessions": epoch 0 opens a session with
the partitions listed, each later request carries the next epoch and adds or forgets
partitions, -1 closes it)."""

from __future__ import annotations

import asyncio
import contextvars
import datetime
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i64

from queueflow.errors import ErrorCode as QueueflowError
from queueflow.errors import ShareGroupError
from queueflow.listener.apis import SHARE_ACKNOWLEDGE, SHARE_FETCH
from queueflow.listener.batches import answer_records
from queueflow.listener.held import HeldRecords
from queueflow.listener.leadership import Cluster
from queueflow.listener.members import KafkaMember, MemberRegistry, ShareSession
from queueflow.listener.metadata import TopicIds
from queueflow.member.session import FetchResult
from queueflow.structs import AcknowledgeType, TopicPartition

__all__ = [
    "CLIENT_FETCH_ERRORS",
    "CONNECTION",
    "ShareFetcher",
    "fetch_partition_error",
    "kafka_error",
]

log = structlog.get_logger("queueflow.listener")
_ZERO = datetime.timedelta(0)
_FINAL = -1

#: The client connection whose request is being answered (set by the listener's server in each
#: connection's task): a share session belongs to the connection that opened it.
CONNECTION: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "queueflow_listener_connection", default=None
)


#: The most offsets one request may acknowledge (bounds the work a request can ask for).
MAX_ACK_OFFSETS = 100_000
_KINDS = frozenset(int(k) for k in AcknowledgeType)


def ack_batches_error(topics: Iterable[Any]) -> str | None:
    """Why a request's acknowledgement batches are invalid (KIP-932: ``INVALID_REQUEST``), or
    None: a negative or reversed range, types neither one nor one per offset, an unknown
    type, or more than :data:`MAX_ACK_OFFSETS` offsets in all."""
    total = 0
    for topic in topics:
        for p in topic.partitions:
            for b in p.acknowledgement_batches:
                first, last, types = b.first_offset, b.last_offset, b.acknowledge_types
                count = last - first + 1
                if first < 0 or count < 1:
                    return f"acknowledgement batch {first}..{last} is not a range of offsets"
                total += count
                if total > MAX_ACK_OFFSETS:
                    return f"more than {MAX_ACK_OFFSETS} offsets acknowledged in one request"
                if len(types) not in (1, count):
                    return (
                        f"acknowledgement batch {first}..{last} has {len(types)} types: "
                        "give one, or one per offset"
                    )
                if not _KINDS.issuperset(types):
                    return f"unknown acknowledge type in {sorted(set(types) - _KINDS)}"
    return None


def _outcome(kind: int) -> AcknowledgeType:
    """The queueflow outcome of a Kafka acknowledge type: GAP (an offset with no record) is
    done, as ACCEPT."""
    return AcknowledgeType.ACCEPT if kind == AcknowledgeType.GAP else AcknowledgeType(kind)


def _next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (KIP-932: it wraps from Integer.MAX_VALUE to 1)."""
    return 1 if epoch >= 2_147_483_647 else epoch + 1


#: The share-partition errors of a ShareFetch answer that Kafka's clients handle: Java's
#: ShareFetchCollector (4.3) refreshes its metadata for the first five and throws
#: IllegalStateException, ending the consumer, for a code not listed here.
CLIENT_FETCH_ERRORS = frozenset(
    {
        ErrorCode.none,
        ErrorCode.not_leader_or_follower,
        ErrorCode.replica_not_available,
        ErrorCode.kafka_storage_error,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.offset_not_available,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.unknown_topic_id,
        ErrorCode.inconsistent_topic_id,
        ErrorCode.topic_authorization_failed,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.unknown_server_error,
        ErrorCode.corrupt_message,
    }
)


def fetch_partition_error(error: ShareGroupError | None) -> ErrorCode:
    """The ``ErrorCode`` of a share-partition in a ShareFetch answer for the leader's
    ``error``: Kafka's code of the same name when clients handle it there
    (:data:`CLIENT_FETCH_ERRORS`), else ``NOT_LEADER_OR_FOLLOWER``, after which they refresh
    their metadata and fetch again. A membership refusal (``UNKNOWN_MEMBER_ID``,
    ``FENCED_MEMBER_EPOCH``: the member's heartbeat sorts it out) or ``REQUEST_TIMED_OUT`` (a
    leader moving) thus never ends a Java consumer."""
    code = kafka_error(error)
    return code if code in CLIENT_FETCH_ERRORS else ErrorCode.not_leader_or_follower


def kafka_error(error: ShareGroupError | None) -> ErrorCode:
    """Kafka's code of a queueflow error (same names; unknown ones: UNKNOWN_SERVER_ERROR)."""
    if error is None:
        return ErrorCode.none
    return ErrorCode.__members__.get(error.code.name.lower(), ErrorCode.unknown_server_error)


class ShareFetcher:
    """Answers ShareFetch (v1, v2) and ShareAcknowledge (v1, v2) for the members of a
    :class:`MemberRegistry`.

    Args:
        members: the Kafka-protocol members.
        topic_ids: the listener's topic ids.
        cluster: the listener nodes and who leads what, now
            (:class:`~queueflow.listener.leadership.Cluster`): a share-partition led by another
            node is not fetched here (``NOT_LEADER_OR_FOLLOWER`` naming that node).
        max_wait_cap_ms: the longest a ShareFetch is held, whatever it asks for.
    """

    def __init__(
        self,
        members: MemberRegistry,
        topic_ids: TopicIds,
        cluster: Callable[[], Cluster],
        max_wait_cap_ms: int,
    ) -> None:
        self._members = members
        self._topic_ids = topic_ids
        self._cluster = cluster
        self._cap_ms = max_wait_cap_ms

    async def _check_request(
        self, request: Any, opening_allowed: bool
    ) -> tuple[KafkaMember | None, ErrorCode, str | None]:
        """A ShareFetch's or ShareAcknowledge's member (one heartbeating here, or one this
        listener acts for: :meth:`MemberRegistry.acting_for`), and what is wrong with its share
        session epoch or its acknowledgement batches (``ErrorCode.none``: nothing)."""
        member = await self._members.acting_for(request.group_id, request.member_id, None)
        error, message = self._check_session(member, request.share_session_epoch, opening_allowed)
        if error is ErrorCode.none and (message := ack_batches_error(request.topics)):
            error = ErrorCode.invalid_request
        return member, error, message

    def _check_session(
        self, member: KafkaMember | None, epoch: int, opening_allowed: bool
    ) -> tuple[ErrorCode, str | None]:
        if member is None:
            return ErrorCode.unknown_member_id, "the member is not in the group: heartbeat first"
        if epoch == 0:
            if not opening_allowed:
                return (
                    ErrorCode.invalid_share_session_epoch,
                    "ShareAcknowledge cannot open a session",
                )
            return ErrorCode.none, None
        if member.share_session is None:
            return ErrorCode.share_session_not_found, "no share session: open one with epoch 0"
        if epoch != _FINAL and epoch != member.share_session.next_epoch:
            return (
                ErrorCode.invalid_share_session_epoch,
                f"epoch {epoch}, expected {member.share_session.next_epoch}",
            )
        return ErrorCode.none, None

    def _add_acks(self, member: KafkaMember, topics: Iterable[Any]) -> set[TopicPartition]:
        """Record the acknowledgements of a request on the member's session; returns their
        share-partitions."""
        touched: set[TopicPartition] = set()
        held = member.share_session.held if member.share_session is not None else None
        for topic in topics:
            name = self._topic_ids.name_of(topic.topic_id)
            if name is None:
                continue
            for p in topic.partitions:
                tp = TopicPartition(name, p.partition_index)
                for batch in p.acknowledgement_batches:  # checked by ack_batches_error
                    types, first = batch.acknowledge_types, batch.first_offset
                    touched.add(tp)
                    if len(types) == 1:  # one type for the range (what clients mostly send)
                        kind = _outcome(types[0])
                        member.session.acknowledge_range(tp, first, batch.last_offset, kind)
                        if held is not None and kind is not AcknowledgeType.RENEW:
                            held.remove(tp, first, batch.last_offset)
                        continue
                    for i, offset in enumerate(range(first, batch.last_offset + 1)):
                        kind = _outcome(types[i])
                        member.session.acknowledge(tp, offset, kind)
                        if held is not None and kind is not AcknowledgeType.RENEW:
                            held.remove(tp, offset, offset)
        return touched

    async def share_fetch(self, version: int, request: Any) -> Any:
        """Answer one ShareFetch: acknowledgements ride along, then each share-partition of the
        session that is assigned to the member is fetched (held up to ``MaxWaitMs`` when
        nothing is available) and its records returned as one record batch."""
        m = load_payload_module(SHARE_FETCH, version, EntityType.response)
        member, error, message = await self._check_request(request, opening_allowed=True)
        epoch = request.share_session_epoch
        if error is not ErrorCode.none or member is None:
            return self._fetch_answer(m, error, message, {}, {}, 0, self._cluster())
        async with member.lock:
            if epoch == 0:  # tied to this connection, as Kafka 4.x ties it
                old = member.share_session
                member.share_session = ShareSession(connection=CONNECTION.get())
                if old is not None:  # reopened (a reconnect): what it held is still held
                    member.share_session.held = old.held
            share = member.share_session
            assert share is not None
            for topic in request.topics:
                name = self._topic_ids.name_of(topic.topic_id)
                if name is not None:
                    share.partitions.update(
                        TopicPartition(name, p.partition_index) for p in topic.partitions
                    )
            for topic in request.forgotten_topics_data:
                name = self._topic_ids.name_of(topic.topic_id)
                if name is not None:
                    share.partitions.difference_update(
                        TopicPartition(name, p) for p in topic.partitions
                    )
            touched = self._add_acks(member, request.topics)
            for tp in touched:
                member.ack_errors.pop(tp, None)  # only this request's errors are reported
            if epoch == _FINAL:
                flushed = {tp: await member.session.flush(tp) for tp in touched}
                await self._close_share(member, share, "final epoch")
            else:
                return await self._fetch(m, member, request, touched)
        await self._members.session_closed(member)
        return self._fetch_answer(m, ErrorCode.none, None, {}, flushed, 0, self._cluster())

    async def _fetch(
        self, m: Any, member: KafkaMember, request: Any, touched: set[TopicPartition]
    ) -> Any:
        """The records of a ShareFetch of an open session (``member.lock`` held)."""
        epoch = request.share_session_epoch
        share = member.share_session
        assert share is not None
        if epoch != 0:  # a session opened with epoch 0 expects 1 next
            share.next_epoch = _next_epoch(epoch)
        assigned = member.session.assignment
        fetched = sorted(share.partitions | touched)
        cluster = self._cluster()
        # Led by another node: acknowledgements riding along are applied (through queueflow's
        # path to the leader), nothing is acquired, and the client is sent to the leader.
        moved = {tp for tp in fetched if cluster.moved(tp) is not None}
        here = [tp for tp in fetched if tp not in moved]
        per_partition = max(int(request.max_records) // max(len(here), 1), 1)
        wait_ms = min(int(request.max_wait.total_seconds() * 1000), self._cap_ms)
        outcomes = await asyncio.gather(
            *(
                self._fetch_one(
                    member,
                    tp,
                    per_partition if tp in assigned and tp not in moved else 0,
                    wait_ms if here else 0,
                )
                for tp in fetched
            )
        )
        acked = {tp: member.ack_errors.pop(tp, None) for tp in touched}
        results = dict(zip(fetched, outcomes, strict=True))
        for tp in moved:
            results[tp] = _not_leader(tp, cluster)
        lock_ms = max(
            (r.lock_timeout_ms for r in results.values() if isinstance(r, FetchResult)), default=0
        )
        return self._fetch_answer(
            m, ErrorCode.none, None, results, acked, lock_ms, cluster, share.held
        )

    async def _fetch_one(
        self, member: KafkaMember, tp: TopicPartition, max_records: int, wait_ms: int
    ) -> FetchResult | ShareGroupError:
        if max_records:
            member.session.prepare(tp)
        try:
            return await member.session.fetch(tp, max_records, wait_ms if max_records else 0)
        except ShareGroupError as exc:
            return exc

    @staticmethod
    def _endpoints(m: Any, cluster: Cluster, tps: Iterable[TopicPartition]) -> tuple[Any, ...]:
        """The answer's ``NodeEndpoints``: this listener and the leaders of ``tps`` (KIP-951:
        the nodes its ``CurrentLeader`` fields name; ``m``: the kio response module of the API
        and version answered)."""
        return tuple(
            m.NodeEndpoint(node_id=i32(n.node_id), host=n.host, port=i32(n.port))
            for n in cluster.nodes(tps)
        )

    @staticmethod
    def _current_leader(m: Any, cluster: Cluster, tp: TopicPartition) -> Any:
        leader = cluster.leader_of(tp)
        return m.LeaderIdAndEpoch(
            leader_id=i32(leader.node.node_id), leader_epoch=i32(leader.epoch)
        )

    def _fetch_answer(
        self,
        m: Any,
        error: ErrorCode,
        message: str | None,
        results: dict[TopicPartition, FetchResult | ShareGroupError],
        acked: dict[TopicPartition, ShareGroupError | None],
        lock_ms: int,
        cluster: Cluster,
        held: HeldRecords | None = None,
    ) -> Any:
        """A ShareFetch answer; the records returned are added to ``held`` (the share
        session's)."""
        by_topic: dict[str, list[Any]] = {}
        for tp in sorted(results.keys() | acked.keys()):
            result = results.get(tp)
            if isinstance(result, FetchResult):
                data, ranges = answer_records(result.records, result.batches)
                fetch_error = fetch_partition_error(result.error)
                if held is not None:
                    for first, last, _count in ranges:
                        held.add(tp, first, last)
            else:
                data, ranges = b"", []
                fetch_error = fetch_partition_error(result)
            ack_error = kafka_error(acked.get(tp))
            by_topic.setdefault(tp.topic, []).append(
                m.PartitionData(
                    partition_index=i32(tp.partition),
                    error_code=fetch_error,
                    acknowledge_error_code=i16(ack_error.value),
                    current_leader=self._current_leader(m, cluster, tp),
                    records=data,
                    acquired_records=tuple(
                        m.AcquiredRecords(
                            first_offset=i64(first),
                            last_offset=i64(last),
                            delivery_count=i16(count),
                        )
                        for first, last, count in ranges
                    ),
                )
            )
        return m.ShareFetchResponse(
            throttle_time=_ZERO,
            error_code=error,
            error_message=message,
            acquisition_lock_timeout=datetime.timedelta(milliseconds=lock_ms),
            responses=tuple(
                m.ShareFetchableTopicResponse(
                    topic_id=self._topic_ids.id_of(topic), partitions=tuple(parts)
                )
                for topic, parts in sorted(by_topic.items())
            ),
            node_endpoints=self._endpoints(m, cluster, results.keys() | acked.keys()),
        )

    async def connection_closed(self, connection: object) -> None:
        """A client connection closed (the client exited, crashed or was killed): the share
        sessions it opened close (:meth:`_close_share`), as Kafka 4.x brokers close a share
        session with its connection. The member stays in its group (its heartbeats decide
        that); a member that left with its share session open is closed now."""
        opened = [
            member
            for member in list(self._members.members.values())
            if member.share_session is not None and member.share_session.connection is connection
        ]
        for member in opened:
            async with member.lock:  # after a ShareFetch still being answered
                share = member.share_session
                if share is None or share.connection is not connection:
                    continue
                await self._close_share(member, share, "connection closed")
            await self._members.session_closed(member)

    async def _close_share(self, member: KafkaMember, share: ShareSession, why: str) -> None:
        """Close ``member``'s share session (``member.lock`` held; the request's own
        acknowledgements already applied): the records it returned and that were not
        acknowledged are RELEASEd at once rather than when their locks end. The delivery
        counts, as with a client's own RELEASE (the next delivery has the count one higher; at
        ``share.delivery.count.limit`` the record is Archived): what Kafka 4.3.1's brokers do
        when a share consumer's connection closes (tests/integration/
        test_kafka_listener_bytes.py compares them)."""
        member.share_session = None
        held = share.held.runs()
        for tp, runs in held.items():
            for first, last in runs:
                member.session.acknowledge_range(tp, first, last, AcknowledgeType.RELEASE)
        errors = await member.session.flush_all() if held else {}
        log.info(
            "kafka_share_session_closed",
            group=member.group,
            member_id=member.member_id,
            queueflow_member_id=member.session.member_id,
            reason=why,
            released=len(share.held),
            errors={f"{tp.topic}[{tp.partition}]": str(e) for tp, e in errors.items() if e},
        )

    async def share_acknowledge(self, version: int, request: Any) -> Any:
        """Answer one ShareAcknowledge: the acknowledgements are sent to the leaders now; epoch
        -1 also closes the share session."""
        m = load_payload_module(SHARE_ACKNOWLEDGE, version, EntityType.response)
        member, error, message = await self._check_request(request, opening_allowed=False)
        epoch = request.share_session_epoch
        results: dict[TopicPartition, ShareGroupError | None] = {}
        if error is ErrorCode.none and member is not None:
            async with member.lock:
                touched = self._add_acks(member, request.topics)
                results = {tp: await member.session.flush(tp) for tp in sorted(touched)}
                if epoch == _FINAL and member.share_session is not None:
                    await self._close_share(member, member.share_session, "final epoch")
                elif member.share_session is not None:
                    member.share_session.next_epoch = _next_epoch(epoch)
            if epoch == _FINAL:
                await self._members.session_closed(member)
        cluster = self._cluster()
        by_topic: dict[str, list[Any]] = {}
        for tp, result in sorted(results.items()):
            by_topic.setdefault(tp.topic, []).append(
                m.PartitionData(
                    partition_index=i32(tp.partition),
                    error_code=kafka_error(result),
                    current_leader=self._current_leader(m, cluster, tp),
                )
            )
        extra: dict[str, Any] = {"acquisition_lock_timeout": _ZERO} if version >= 2 else {}
        return m.ShareAcknowledgeResponse(
            throttle_time=_ZERO,
            error_code=error,
            error_message=message,
            **extra,  # v2 (KIP-1222) only
            responses=tuple(
                m.ShareAcknowledgeTopicResponse(
                    topic_id=self._topic_ids.id_of(topic), partitions=tuple(parts)
                )
                for topic, parts in sorted(by_topic.items())
            ),
            node_endpoints=self._endpoints(m, cluster, results),
        )


def _not_leader(tp: TopicPartition, cluster: Cluster) -> ShareGroupError:
    """The error of a share-partition fetched from a node that does not lead it (KIP-932
    ``NOT_LEADER_OR_FOLLOWER``; the answer's ``CurrentLeader`` and ``NodeEndpoints`` name the
    leader, KIP-951)."""
    leader = cluster.moved(tp)
    where = (
        "another node" if leader is None else f"node {leader.node.node_id} ({leader.node.address})"
    )
    return ShareGroupError(
        QueueflowError.NOT_LEADER_OR_FOLLOWER,
        f"{tp.topic}[{tp.partition}] is led by {where}: fetch it there",
    )
