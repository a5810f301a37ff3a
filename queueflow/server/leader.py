"""Share-partition leaders: a Faust agent per source topic that serves ShareFetch requests.

The worker that owns partition ``p`` of the request topic ``<app>-share-fetch-<topic>`` (which is
co-partitioned with ``<topic>`` and with the state table's changelog) leads every share-partition
``(group, <topic>, p)``. Leadership therefore moves with Faust's rebalances, the state is local to
the leader (RocksDB), and every state change happens inside a Faust stream event of partition
``p``, which is what Faust tables require.

Per request, in order (KIP-932 "ShareFetch API"): expire elapsed locks, apply the piggy-backed
acknowledgements atomically, acquire up to ``max_records`` records, write the state change as one
delta, answer on the reply topic. The engine (:mod:`queueflow.engine.partition`) owns the rules;
:mod:`~queueflow.engine.fencing` decides when this worker may serve a partition;
this module owns the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from queueflow import metrics
from queueflow.engine.fencing import FenceOutcome, LeaderFencing
from queueflow.engine.partition import (
    AcknowledgementBatch,
    AcknowledgeType,
    SharePartitionConfig,
)
from queueflow.errors import CorruptStateError, ErrorCode, FencedStateEpochError, ShareGroupError
from queueflow.member.client import now_ms
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.server.durable import DurableSharePartition

if TYPE_CHECKING:
    from faust.types import EventT, StreamT

    from queueflow.faust_app import App

log = structlog.get_logger("queueflow.server.leader")

#: How often the end offsets of source partitions being fetched are refreshed (s), and how long
#: after the last ShareFetch they stay watched (s).
LOG_END_REFRESH_S = 0.005
LOG_END_WATCH_S = 2.0
#: Resend an own fence not read back within this many ms (see :mod:`queueflow.engine.fencing`).
FENCE_RESEND_MS = 1000


async def send_control(
    app: App, topic: str, partition: int, value: bytes, key: bytes | None = None
) -> None:
    """Produce a control message through the worker's aiokafka producer: no Faust channel,
    codec or producer buffer on the way (they cost more than the leader's own work)."""
    await app.producer.send(topic, key, value, partition, None, None)


async def send_reply(app: App, member_id: str, reply_partition: int, value: bytes) -> None:
    """Answer a member on the reply topic partition it reads."""
    await send_control(
        app, topics.reply_topic(app.share_namespace), reply_partition, value, member_id.encode()
    )


def monotonic_ms() -> int:
    """Monotonic clock in ms (the stall guard's and fence resends' clock)."""
    return int(time.monotonic() * 1000)


def engine_config(app: App) -> SharePartitionConfig:
    """The engine limits from the app's share-group settings."""
    s = app.share_settings
    return SharePartitionConfig(
        max_in_flight_records=s.partition_max_record_locks,
        delivery_count_limit=s.delivery_count_limit,
        record_lock_duration_ms=s.record_lock_duration_ms,
        max_record_lock_duration_ms=s.max_record_lock_duration_ms,
    )


def raw_table(app: App, name: str, partitions: int | None = None) -> Any:
    """A Faust table with bytes keys and values (queueflow encodes its own records)."""
    table = app.Table(name, partitions=partitions)
    # Faust derives serializers from key_type/value_type (json). The changelog topic decodes
    # during recovery, so it needs raw serializers too.
    for obj in (table, table.changelog_topic):
        obj.key_serializer = "raw"
        obj.value_serializer = "raw"
    return table


class LogOffsets:
    """Log start and end offsets of source partitions, from a group-less consumer.

    The end offsets of partitions fetched from recently are refreshed in the background every
    :data:`LOG_END_REFRESH_S`, so a ShareFetch that finds nothing to acquire need not wait for a
    ListOffsets round trip (which would hold up every request behind it in the leader agent).
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._consumer: AIOKafkaConsumer | None = None
        self.end: dict[TopicPartition, int] = {}
        self._watched: dict[TopicPartition, float] = {}  # partition -> last asked (monotonic s)
        self._refresher: asyncio.Task[None] | None = None

    def cached_end(self, tp: TopicPartition) -> int | None:
        """The last known high watermark of ``tp`` (``None`` if unknown); keeps it refreshed in
        the background for :data:`LOG_END_WATCH_S`."""
        self._watched[tp] = time.monotonic()
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.ensure_future(self._refresh_watched())
        return self.end.get(tp)

    async def _refresh_watched(self) -> None:
        while self._watched:
            await asyncio.sleep(LOG_END_REFRESH_S)
            now = time.monotonic()
            for tp in [tp for tp, at in self._watched.items() if now - at > LOG_END_WATCH_S]:
                del self._watched[tp]
            if not self._watched:
                return
            try:
                consumer = await self._client()
                self.end.update(await consumer.end_offsets(list(self._watched)))
            except Exception as exc:  # the broker may be restarting: keep the last values
                log.warning("log_end_refresh_failed", error=repr(exc))
                await asyncio.sleep(1.0)

    async def _client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, enable_auto_commit=False
            )
            await self._consumer.start()
        return self._consumer

    async def log_end(self, tp: TopicPartition) -> int:
        """Refresh and return the high watermark of ``tp``."""
        consumer = await self._client()
        self.end[tp] = (await consumer.end_offsets([tp]))[tp]
        return self.end[tp]

    async def log_start(self, tp: TopicPartition) -> int:
        """The log start offset of ``tp``."""
        consumer = await self._client()
        return (await consumer.beginning_offsets([tp]))[tp]

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refresher
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None


class ShareLeader:
    """The share-partition leaders of one source topic on this worker.

    Args:
        app: the queueflow app (role ``all`` or ``leader``).
        topic: the source topic name.
    """

    def __init__(self, app: App, topic: str, offsets: LogOffsets) -> None:
        self.app = app
        self.topic = topic
        self.offsets = offsets
        self.config = engine_config(app)
        self.fetch_topic = app.topic(
            topics.fetch_topic(app.share_namespace, topic),
            internal=True,
            key_serializer="raw",
            value_serializer="raw",
            config=topics.CONTROL_TOPIC_CONFIG,
        )
        self.table = raw_table(app, topics.state_table(topic))
        self.partitions: dict[tuple[str, int], DurableSharePartition] = {}
        self.refused: dict[tuple[str, int], CorruptStateError] = {}
        # Share-partitions of partitions this worker lost, kept in case a rebalance gives the
        # partition straight back (see DurableSharePartition.resume).
        self._retained: dict[tuple[str, int], DurableSharePartition] = {}
        # Request partition -> offset of the last request handled here. Faust resumes a
        # partition from its committed offset, which lags (commit interval, and faust-streaming
        # #606), so requests this worker already applied come round again; applied twice, an
        # old RELEASE would release a record acquired since.
        self._applied: dict[int, int] = {}
        self._gauge_cache: dict[tuple[str, int], tuple[Any, Any, Any]] = {}
        conf = app.conf
        self.fencing = LeaderFencing(
            int((conf.broker_session_timeout + conf.broker_heartbeat_interval) * 1000)
        )
        self.agent = app.agent(self.fetch_topic, name=f"share-leader-{topic}")(self._run)
        self._log = log.bind(topic=topic)
        self._state_writes = metrics.STATE_WRITES.labels(topic)

    def set_partition_count(self, count: int) -> None:
        """Co-partition the request topic and the state table with the source topic.

        Called once at start-up, before Faust declares the topics.
        """
        self.fetch_topic.partitions = count
        self.table.partitions = count
        self.table.changelog_topic.partitions = count

    def assign(self, partitions: set[int], epoch: int) -> None:
        """Lead ``partitions`` under leader epoch ``epoch`` (the Faust consumer generation);
        the stall guard announces it once Faust has recovered the tables."""
        self.fencing.assign(partitions, epoch)
        for key in [k for k in self._retained if k[1] not in partitions]:
            del self._retained[key]  # led elsewhere now: reload if it ever comes back
        self._log.info("leader_assigned", partitions=sorted(partitions), leader_epoch=epoch)

    async def send_fences(self) -> None:
        """Append this worker's fence to the partitions it leads but isn't live on yet, once
        Faust has finished rebalancing (see :mod:`queueflow.engine.fencing`)."""
        if self.app.rebalancing or not self.app.flow_control.is_active():
            return  # what the stream fetches now would be dropped, the fence with it
        for p in self.fencing.fences_due(monotonic_ms(), FENCE_RESEND_MS):
            epoch = self.fencing.partitions[p].epoch
            payload = protocol.encode(protocol.Fence(leader_epoch=epoch, sent_ms=now_ms()))
            await send_control(self.app, self.fetch_topic.get_topic_name(), p, payload)
            self._log.info("leader_fence_sent", partition=p, leader_epoch=epoch)

    def revoke(self, partitions: set[int]) -> None:
        """Forget the share-partitions of revoked partitions; their new leader restores them.
        A request still in progress for one of them can no longer write its state."""
        self.fencing.revoke(partitions)
        self._drop(partitions, fenced="its partition was revoked by a Faust rebalance")

    def _drop(self, partitions: set[int], fenced: str | None = None) -> None:
        for key in [k for k in self.partitions if k[1] in partitions]:
            durable = self.partitions.pop(key)
            if fenced is not None:
                durable.fence(fenced)
            self._retained[key] = durable
        for key in [k for k in self.refused if k[1] in partitions]:
            del self.refused[key]

    def step_down(self, partitions: list[int], reason: str) -> None:
        """Stop serving ``partitions``: fence their share-partitions so any later write is
        refused with ``FENCED_STATE_EPOCH``, and log why."""
        if not partitions:
            return
        self._drop(set(partitions), fenced=reason)
        metrics.LEADER_STEP_DOWNS.labels(self.topic).inc(len(partitions))
        self._log.warning(
            "leader_stepped_down",
            partitions=sorted(partitions),
            reason=reason,
            code=ErrorCode.FENCED_STATE_EPOCH.value,
        )

    async def watch_stalls(self, now_monotonic_ms: int) -> None:
        """The stall guard (called every 100 ms): step down after a stall longer than the
        Faust session timeout; take the partitions back if the membership survived it; send
        own fences that are due."""
        stalled = self.fencing.alive(now_monotonic_ms)
        if stalled:
            self.step_down(stalled, self.fencing.partitions[stalled[0]].fenced or "stalled")
        resumed = self.fencing.resume_after_stall(
            now_monotonic_ms, self.app.consumer_generation_id, self.app.rebalancing
        )
        for p in resumed:
            self._log.info(
                "leader_resumed_after_stall",
                partition=p,
                leader_epoch=self.fencing.partitions[p].epoch,
            )
        await self.send_fences()

    async def _run(self, stream: StreamT[Any]) -> None:
        async for event in stream.events():
            try:
                await self._handle(event)
            except FencedStateEpochError as exc:  # stepped down while handling it
                self._log.warning(
                    "stale_write_refused",
                    partition=event.message.partition,
                    error=str(exc),
                    code=exc.code.value,
                )
            except Exception:  # never let one bad request stop the leader
                self._log.exception("leader_request_failed", partition=event.message.partition)

    async def _handle(self, event: EventT[Any]) -> None:
        partition, offset = event.message.partition, event.message.offset
        if offset <= self._applied.get(partition, -1):
            return  # handled here before (Faust re-delivers from its committed offset)
        self._applied[partition] = offset
        try:
            message = protocol.decode(event.value)
        except ShareGroupError as exc:
            self._log.error("undecodable_request", partition=partition, error=str(exc))
            return
        now = now_ms()
        if isinstance(message, protocol.Fence):
            self._on_fence(partition, message.leader_epoch)
            return
        try:
            self.fencing.check(partition)
        except FencedStateEpochError:
            return  # stepped down: the partition's new leader answers
        if isinstance(message, protocol.Tick):
            for (_group, p), durable in self.partitions.items():
                if p == partition and durable.engine.expire_locks(now):
                    durable.persist()
        elif isinstance(message, protocol.ReleaseMember):
            durable = await self._share_partition(message.group, partition)
            released = durable.engine.release_member(message.member_id, now)
            if released:
                durable.persist()
                self._log.info(
                    "member_records_released",
                    group=message.group,
                    partition=partition,
                    member_id=message.member_id,
                    records=released,
                    reason=message.reason,
                )
        elif isinstance(message, protocol.ShareFetchRequest):
            # A request before this worker's own fence belongs to the previous leader, which may
            # have answered it already: apply its acknowledgements (atomic, so a repeat is
            # refused harmlessly) but acquire nothing, or the records would be locked for a
            # member not waiting for them.
            live = self.fencing.is_live(partition)
            response = await self._share_fetch(message, partition, now, acquire=live)
            await send_reply(
                self.app, message.member_id, message.reply_partition, protocol.encode(response)
            )

    def _epoch(self, partition: int) -> int:
        lead = self.fencing.partitions.get(partition)
        return lead.epoch if lead is not None else -1

    def _on_fence(self, partition: int, epoch: int) -> None:
        outcome = self.fencing.on_fence(partition, epoch)
        if outcome is FenceOutcome.LIVE:
            self._log.info("leader_live", partition=partition, leader_epoch=epoch)
        elif outcome is FenceOutcome.SUPERSEDED:
            self.step_down([partition], self.fencing.partitions[partition].fenced or "fenced")
        else:
            self._log.debug("fence_ignored", partition=partition, leader_epoch=epoch)

    async def _share_partition(self, group: str, partition: int) -> DurableSharePartition:
        key = (group, partition)
        durable = self.partitions.get(key)
        if durable is not None:
            return durable
        if key in self.refused:
            raise self.refused[key]
        retained = self._retained.pop(key, None)
        if retained is not None and retained.resume(self._epoch(partition)):
            self.partitions[key] = retained
            self._log.info(
                "share_partition_resumed",
                group=group,
                partition=partition,
                start_offset=retained.engine.start_offset,
                end_offset=retained.engine.end_offset,
                acquired=retained.engine.acquired_count,
                state_epoch=retained.state_epoch,
            )
            return retained
        try:
            durable = DurableSharePartition.load(
                self.table,
                group,
                self.topic,
                partition,
                self.config,
                self.app.share_settings.snapshot_update_records_per_snapshot,
                leader_epoch=self._epoch(partition),
            )
        except CorruptStateError as exc:
            self.refused[key] = exc
            self._log.error(
                "share_partition_refused", group=group, partition=partition, error=str(exc)
            )
            raise
        if durable is None:
            tp = TopicPartition(self.topic, partition)
            if self.app.share_settings.auto_offset_reset == "earliest":
                start = await self.offsets.log_start(tp)
            else:
                start = await self.offsets.log_end(tp)
            durable = DurableSharePartition.create(
                self.table,
                group,
                self.topic,
                partition,
                self.config,
                self.app.share_settings.snapshot_update_records_per_snapshot,
                start,
                leader_epoch=self._epoch(partition),
            )
            self._log.info(
                "share_partition_initialised", group=group, partition=partition, start_offset=start
            )
        else:
            self._log.info(
                "share_partition_restored",
                group=group,
                partition=partition,
                start_offset=durable.engine.start_offset,
                end_offset=durable.engine.end_offset,
                state_epoch=durable.state_epoch,
            )
        self.partitions[key] = durable
        return durable

    async def _share_fetch(
        self, request: protocol.ShareFetchRequest, partition: int, now: int, acquire: bool = True
    ) -> protocol.ShareFetchResponse:
        response = protocol.ShareFetchResponse(
            member_id=request.member_id,
            request_id=request.request_id,
            topic=self.topic,
            partition=partition,
        )
        try:
            durable = await self._share_partition(request.group, partition)
        except CorruptStateError as exc:
            response.error, response.error_message = exc.code.value, exc.message
            return response
        engine = durable.engine
        engine.expire_locks(now)
        if request.acks:
            try:
                engine.acknowledge(
                    request.member_id,
                    [
                        AcknowledgementBatch(first, last, tuple(AcknowledgeType(t) for t in types))
                        for first, last, types in request.acks
                    ],
                    now,
                )
            except (ShareGroupError, ValueError) as exc:
                code = exc.code if isinstance(exc, ShareGroupError) else ErrorCode.INVALID_REQUEST
                response.ack_error, response.ack_error_message = code.value, str(exc)
                response.ack_stale = engine.stale_acknowledgements(
                    request.member_id,
                    [AcknowledgementBatch(first, last, ()) for first, last, _ in request.acks],
                )
        if acquire and request.max_records > 0 and now < request.deadline_ms:
            tp = TopicPartition(self.topic, partition)
            log_end = self.offsets.cached_end(tp)
            if log_end is None:
                log_end = await self.offsets.log_end(tp)
            try:
                acquired = engine.acquire(
                    request.member_id, request.max_records, log_end, now, request.lock_duration_ms
                )
            except ShareGroupError as exc:
                response.error, response.error_message = exc.code.value, exc.message
                acquired = []
            response.acquired = [
                (a.first_offset, a.last_offset, a.delivery_count) for a in acquired
            ]
            response.lock_timeout_ms = (
                request.lock_duration_ms or self.config.record_lock_duration_ms
            )
        if durable.persist():
            self._state_writes.inc()
        in_flight, acquired_gauge, start = self._gauges(request.group, partition)
        in_flight.set(engine.in_flight_count)
        acquired_gauge.set(engine.acquired_count)
        start.set(engine.start_offset)
        return response

    def _gauges(self, group: str, partition: int) -> tuple[Any, Any, Any]:
        key = (group, partition)
        gauges = self._gauge_cache.get(key)
        if gauges is None:
            labels = (group, self.topic, str(partition))
            gauges = self._gauge_cache[key] = (
                metrics.IN_FLIGHT.labels(*labels),
                metrics.ACQUIRED.labels(*labels),
                metrics.START_OFFSET.labels(*labels),
            )
        return gauges


class LeaderTicker:
    """Sends :class:`~queueflow.protocol.messages.Tick` events into the request partitions this
    worker
    owns, so lock expiry and session expiry run inside stream events of those partitions."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def tick(self) -> None:
        """Send one tick to every owned request partition (called by a Faust timer)."""
        owned = self.app.assignor.assigned_actives()
        names = {
            leader.fetch_topic.get_topic_name(): leader
            for leader in self.app.share_leaders.values()
        }
        names[topics.coordinator_topic(self.app.share_namespace)] = None
        payload = protocol.encode(protocol.Tick(sent_ms=now_ms()))
        for tp in owned:
            if tp.topic in names:
                with contextlib.suppress(asyncio.CancelledError):
                    await send_control(self.app, tp.topic, tp.partition, payload)
