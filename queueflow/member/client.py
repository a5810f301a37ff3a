"""A share-group member's connection to the cluster: heartbeats, ShareFetch and record reads.

:class:`MemberClient` is the I/O half of a member. It

* joins the share group and heartbeats to the coordinator (KIP-932 ShareGroupHeartbeat),
  keeping :attr:`MemberClient.assignment` current;
* sends ShareFetch / ShareAcknowledge requests to share-partition leaders and awaits their
  responses (:meth:`MemberClient.share_fetch`);
* reads the acquired records from the source topic through Kafka's own fetch path
  (:meth:`MemberClient.read_records`), reporting offsets that hold no record as gaps.

Both :class:`~queueflow.member.consumer.ShareConsumer` and ``@share_agent`` workers are built on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from queueflow.clock import SYSTEM_CLOCK
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.kafka.admin import ensure_topic, partition_counts
from queueflow.kafka.config import KafkaClientConfig
from queueflow.member.acks import AcknowledgementBuffer
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics as internal
from queueflow.settings import ShareGroupSettings
from queueflow.structs import AcknowledgeType, ShareRecord

log = structlog.get_logger("queueflow.member")


def now_ms() -> int:
    """Wall-clock time in ms (locks and deadlines are compared across processes)."""
    return SYSTEM_CLOCK.now_ms()


class MemberClient:
    """The network side of one share-group member.

    Args:
        bootstrap: ``host:port[,host:port]``.
        namespace: the queueflow app id whose leaders and coordinator serve this group.
        group: the share group id.
        topics: topics to subscribe to.
        settings: share-group settings (heartbeat interval, timeouts, lock duration).
        client_id: shown by admin tooling.

    Raises (from :meth:`start`):
        ConfigurationError: a subscribed topic does not exist.
        ShareGroupError: ``REQUEST_TIMED_OUT`` when no coordinator answers the join in
            ``queueflow.request.timeout.ms`` (is a leader worker running for this app?).
    """

    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        group: str,
        topics: Iterable[str],
        settings: ShareGroupSettings,
        client_id: str = "queueflow",
    ) -> None:
        self.bootstrap = bootstrap
        self.namespace = namespace
        self.group = group
        self.topics = sorted(set(topics))
        self.settings = settings
        self.client_id = client_id
        self.member_id = str(uuid.uuid4())
        self.member_epoch = 0
        self.assignment: set[tuple[str, int]] = set()
        self.assignment_changed = asyncio.Event()
        self.partitions: dict[str, int] = {}
        self.reply_partition = random.randrange(internal.REPLY_PARTITIONS)
        self._next_request = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._producer: AIOKafkaProducer | None = None
        self._replies: AIOKafkaConsumer | None = None
        self._readers: dict[tuple[str, int], _PartitionReader] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._log = log.bind(group=group, member_id=self.member_id)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, check the topics, join the group and start heartbeating."""
        self.partitions = await partition_counts(KafkaClientConfig(self.bootstrap), self.topics)
        await ensure_topic(
            KafkaClientConfig(self.bootstrap),
            internal.reply_topic(self.namespace),
            internal.REPLY_PARTITIONS,
            internal.CONTROL_TOPIC_CONFIG,
        )
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=0, acks=1, client_id=self.client_id
        )
        await self._producer.start()
        self._replies = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=500,
            client_id=self.client_id,
        )
        await self._replies.start()
        tp = TopicPartition(internal.reply_topic(self.namespace), self.reply_partition)
        self._replies.assign([tp])
        await self._replies.seek_to_end(tp)
        await self._replies.position(tp)
        self._tasks.append(asyncio.create_task(self._read_replies(), name="queueflow-replies"))
        await self._join()
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="queueflow-heartbeat"))

    async def close(self, leave: bool = True) -> None:
        """Leave the group (so leaders release what this member holds) and disconnect."""
        self._closing = True
        if leave and self._producer is not None:
            try:
                await asyncio.wait_for(self._heartbeat(leave=True), timeout=5)
            except (asyncio.TimeoutError, ShareGroupError, KafkaError) as exc:
                self._log.warning("leave_failed", error=repr(exc))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for reader in self._readers.values():
            await reader.close()
        self._readers.clear()
        if self._replies is not None:
            await self._replies.stop()
        if self._producer is not None:
            await self._producer.stop()
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()

    # -- requests --------------------------------------------------------------------------
    def _request_id(self) -> int:
        self._next_request += 1
        return self._next_request

    async def _call(self, topic: str, partition: int, request_id: int, payload: bytes) -> Any:
        assert self._producer is not None, "MemberClient.start() was not called"
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        try:
            await self._producer.send(
                topic, payload, key=self.member_id.encode(), partition=partition
            )
            return await asyncio.wait_for(fut, self.settings.request_timeout_ms / 1000)
        except asyncio.TimeoutError:
            raise ShareGroupError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"no answer from {topic}[{partition}] within "
                f"{self.settings.request_timeout_ms} ms; "
                f"is a queueflow leader worker for app {self.namespace!r} running?",
            ) from None
        finally:
            self._pending.pop(request_id, None)

    async def share_fetch(
        self,
        topic: str,
        partition: int,
        max_records: int,
        acks: list[protocol.WireAck],
        lock_duration_ms: int | None = None,
    ) -> protocol.ShareFetchResponse:
        """ShareFetch (or ShareAcknowledge when ``max_records == 0``) to the leader of
        ``topic[partition]``; acknowledgements ride along with the fetch.

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` when the leader doesn't answer in time.
        """
        rid = self._request_id()
        request = protocol.ShareFetchRequest(
            group=self.group,
            topic=topic,
            partition=partition,
            member_id=self.member_id,
            request_id=rid,
            reply_partition=self.reply_partition,
            max_records=max_records,
            acks=acks,
            lock_duration_ms=lock_duration_ms,
            deadline_ms=now_ms() + self.settings.request_timeout_ms,
        )
        response: protocol.ShareFetchResponse = await self._call(
            internal.fetch_topic(self.namespace, topic), partition, rid, protocol.encode(request)
        )
        return response

    async def _read_replies(self) -> None:
        assert self._replies is not None
        while True:
            batches = await self._replies.getmany(timeout_ms=1000)
            for messages in batches.values():
                for message in messages:
                    if message.key != self.member_id.encode():
                        continue
                    try:
                        reply = protocol.decode(message.value)
                    except ShareGroupError as exc:
                        self._log.error("undecodable_reply", error=str(exc))
                        continue
                    fut = self._pending.get(getattr(reply, "request_id", -1))
                    if fut is not None and not fut.done():
                        fut.set_result(reply)

    # -- membership ------------------------------------------------------------------------
    async def _heartbeat(self, join: bool = False, leave: bool = False) -> None:
        epoch = -1 if leave else (0 if join else self.member_epoch)
        rid = self._request_id()
        request = protocol.HeartbeatRequest(
            group=self.group,
            member_id=self.member_id,
            member_epoch=epoch,
            subscribed_topics=self.topics,
            reply_partition=self.reply_partition,
            request_id=rid,
            client_id=self.client_id,
            host=socket.gethostname(),
        )
        response: protocol.HeartbeatResponse = await self._call(
            internal.coordinator_topic(self.namespace),
            internal.coordinator_partition(self.group),
            rid,
            protocol.encode(request),
        )
        if response.error == ErrorCode.UNKNOWN_MEMBER_ID.value and not leave:
            # The coordinator dropped us (session timeout): rejoin; our records were released.
            self._log.warning("member_rejoining", reason=response.error_message)
            self.member_epoch = 0
            return await self._heartbeat(join=True)
        if response.error != ErrorCode.NONE.value:
            raise ShareGroupError(ErrorCode(response.error), response.error_message)
        if leave:
            self.assignment = set()
            self.assignment_changed.set()
            return None
        self.member_epoch = response.member_epoch
        new = {(t, p) for t, parts in response.assignment.items() for p in parts}
        if new != self.assignment:
            self._log.info("assignment", member_epoch=self.member_epoch, assignment=sorted(new))
            self.assignment = new
            self.assignment_changed.set()
        return None

    async def _join(self, attempts: int = 6) -> None:
        """Join, retrying with backoff while no coordinator answers (e.g. during a leader
        failover); the last failure is raised."""
        for attempt in range(attempts):
            try:
                return await self._heartbeat(join=True)
            except ShareGroupError as exc:
                if exc.code is not ErrorCode.REQUEST_TIMED_OUT or attempt == attempts - 1:
                    raise
                self._log.warning("join_retry", attempt=attempt + 1, error=str(exc))
                await asyncio.sleep(min(2**attempt, 10))
        return None

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        while not self._closing:
            await asyncio.sleep(interval)
            try:
                await self._heartbeat()
            except (ShareGroupError, KafkaError) as exc:
                self._log.warning("heartbeat_failed", error=str(exc))

    # -- records ---------------------------------------------------------------------------
    async def read_records(
        self, topic: str, partition: int, acquired: list[protocol.WireAcquired]
    ) -> tuple[list[ShareRecord], list[int]]:
        """Read the acquired ranges of ``topic[partition]`` from Kafka.

        Returns:
            (records in offset order, gap offsets: acquired offsets that hold no record, such as
            transaction markers or compacted-away records).
        """
        key = (topic, partition)
        reader = self._readers.get(key)
        if reader is None:
            reader = self._readers[key] = _PartitionReader(self.bootstrap, topic, partition)
        return await reader.read(acquired, self.settings.request_timeout_ms)

    async def read_acquired(
        self,
        tp: tuple[str, int],
        acquired: list[protocol.WireAcquired],
        acks: AcknowledgementBuffer,
        lock_deadline: float = math.inf,
    ) -> list[ShareRecord]:
        """:meth:`read_records`, recording the outcomes that need no handler in ``acks``:
        GAP for acquired offsets without a record, and RELEASE for every acquired offset if the
        read fails (rather than let the records sit until their locks expire).
        ``lock_deadline`` (``time.monotonic()`` s) is set on every record returned.

        Raises:
            ShareGroupError, KafkaError: the read failed (after the RELEASEs were recorded).
        """
        try:
            records, gaps = await self.read_records(tp[0], tp[1], acquired)
        except Exception:
            for first, last, _count in acquired:
                for offset in range(first, last + 1):
                    acks.add(tp, offset, AcknowledgeType.RELEASE)
            raise
        for offset in gaps:
            acks.add(tp, offset, AcknowledgeType.GAP)
        if lock_deadline != math.inf:
            for record in records:
                record.lock_deadline = lock_deadline
        return records

    @staticmethod
    def lock_deadline(sent: float, response: protocol.ShareFetchResponse) -> float:
        """The ``time.monotonic()`` s by which the records of ``response`` must be acknowledged:
        ``sent`` (when the ShareFetch was sent, monotonic s) plus their lock duration, so never
        later than the leader's own deadline; ``inf`` if the leader did not say."""
        return sent + response.lock_timeout_ms / 1000 if response.lock_timeout_ms else math.inf

    def remember_released(self, record: ShareRecord) -> None:
        """Keep a RELEASEd record so that its redelivery to this member needs no Kafka read."""
        reader = self._readers.get((record.topic, record.partition))
        if reader is not None and record.raw_value is not None:
            reader.remember_released(record)

    async def drop_reader(self, topic: str, partition: int) -> None:
        """Close the reader of a share-partition no longer assigned."""
        reader = self._readers.pop((topic, partition), None)
        if reader is not None:
            await reader.close()


#: RELEASEd records a partition reader keeps for their redelivery (oldest dropped first).
RELEASED_CACHE_RECORDS = 10_000


class _PartitionReader:
    """Reads acquired offset ranges of one source partition with a group-less consumer."""

    def __init__(self, bootstrap: str, topic: str, partition: int) -> None:
        self.tp = TopicPartition(topic, partition)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=50,
            max_partition_fetch_bytes=1 << 20,
        )
        self.position = -1
        self.released: OrderedDict[int, ShareRecord] = OrderedDict()
        self._lock = asyncio.Lock()  # one read at a time: reads seek
        self._started = False

    def remember_released(self, record: ShareRecord) -> None:
        """Keep a record its handler RELEASEd: it is likely acquired again by this member, and
        reading it back from Kafka would cost a seek and a fetch of its own."""
        self.released[record.offset] = record
        if len(self.released) > RELEASED_CACHE_RECORDS:
            self.released.popitem(last=False)

    def _take_released(
        self, first: int, last: int, delivery_count: int, out: list[ShareRecord]
    ) -> bool:
        """Serve ``first..last`` from the released records if all are there."""
        if any(o not in self.released for o in range(first, last + 1)):
            return False
        for offset in range(first, last + 1):
            r = self.released.pop(offset)
            out.append(
                ShareRecord(
                    r.topic,
                    r.partition,
                    offset,
                    r.raw_key,
                    r.raw_value,
                    r.headers,
                    r.timestamp,
                    delivery_count,
                    r.raw_value,
                    r.raw_key,
                )
            )
        return True

    async def start(self) -> None:
        async with self._lock:
            if not self._started:
                await self.consumer.start()
                self.consumer.assign([self.tp])
                self._started = True

    async def close(self) -> None:
        await self.consumer.stop()

    async def read(
        self, acquired: list[protocol.WireAcquired], timeout_ms: int
    ) -> tuple[list[ShareRecord], list[int]]:
        await self.start()
        async with self._lock:
            return await self._read(acquired, timeout_ms)

    async def _read(
        self, acquired: list[protocol.WireAcquired], timeout_ms: int
    ) -> tuple[list[ShareRecord], list[int]]:
        records: list[ShareRecord] = []
        gaps: list[int] = []
        deadline = time.monotonic() + timeout_ms / 1000
        for first, last, delivery_count in acquired:
            if first in self.released and self._take_released(first, last, delivery_count, records):
                continue
            if self.position != first:
                self.consumer.seek(self.tp, first)
                self.position = first
            expected = first
            while expected <= last:
                batch = await self.consumer.getmany(
                    self.tp, timeout_ms=200, max_records=last - expected + 1
                )
                messages = batch.get(self.tp, [])
                append = records.append
                for m in messages:
                    offset = m.offset
                    if offset != expected:  # offsets without records (compaction, markers)
                        gaps.extend(range(expected, min(offset, last + 1)))
                        if offset > last:
                            expected = last + 1
                            break
                    append(
                        ShareRecord(
                            m.topic,
                            m.partition,
                            offset,
                            m.key,
                            m.value,
                            m.headers,
                            m.timestamp,
                            delivery_count,
                            m.value,
                            m.key,
                        )
                    )
                    expected = offset + 1
                position = await self.consumer.position(self.tp)
                if not messages and position > expected:
                    # The consumer skipped offsets without records (control records).
                    gaps.extend(range(expected, min(position, last + 1)))
                    expected = min(position, last + 1)
                if time.monotonic() > deadline:
                    raise ShareGroupError(
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"{self.tp.topic}[{self.tp.partition}]: offsets {expected}..{last} were "
                        f"acquired but could not be read within {timeout_ms} ms",
                    )
            self.position = last + 1
            if (await self.consumer.position(self.tp)) != self.position:
                self.position = -1  # force a seek next time
        return records, gaps
