"""``@share_agent``: a handler that processes records of a share group, one outcome per record.

A :class:`ShareAgent` is a :class:`mode.Service` started by the Faust worker. It joins the share
group as a member, runs one fetch loop per assigned share-partition and ``concurrency`` handler
tasks, and acknowledges every record with the handler's outcome:

==============================  ==========================================================
handler does                    outcome
==============================  ==========================================================
returns ``None`` or ``ACCEPT``  ACCEPT: the record is Acknowledged
returns ``RELEASE``             RELEASE: delivered again (Archived at the delivery limit)
returns ``REJECT``              REJECT: Archived, never delivered again
raises                          RELEASE, with an error log line naming the record
returns anything else           RELEASE, with an error log line saying what was returned
value can't be deserialized     REJECT, with an error log line
==============================  ==========================================================

Acknowledgements are batched per share-partition and ride along with that share-partition's next
ShareFetch; one batch is applied atomically by the leader. Faust's own offset tracking is not
used at all (see faust-streaming issue #606).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mode
import structlog

from queueflow import metrics
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.kafka.config import bootstrap_servers
from queueflow.member.acks import AcknowledgementBuffer
from queueflow.member.client import MemberClient
from queueflow.protocol.messages import ShareFetchResponse, WireAck
from queueflow.structs import AcknowledgeType, ShareRecord

if TYPE_CHECKING:
    from queueflow.faust_app import App

log = structlog.get_logger("queueflow.member.agent")

Handler = Callable[[ShareRecord], Awaitable[Any]]
#: ShareFetch loops per assigned share-partition: one can be in flight while the handlers work
#: through the records of the other.
FETCHES_IN_FLIGHT = 2
_OUTCOMES = {AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT}
#: Acknowledgement errors after which the still-valid outcomes are sent again.
_SPLITTABLE = {ErrorCode.INVALID_RECORD_STATE.value, ErrorCode.INVALID_REQUEST.value}


def _ranges_text(offsets: list[int]) -> str:
    """``[1, 2, 3, 7]`` → ``"1..3,7"`` (sorted offsets, for log lines)."""
    out: list[str] = []
    for _, run in itertools.groupby(enumerate(offsets), key=lambda item: item[1] - item[0]):
        block = [offset for _, offset in run]
        out.append(str(block[0]) if len(block) == 1 else f"{block[0]}..{block[-1]}")
    return ",".join(out)


def outcome_of(result: Any) -> AcknowledgeType | None:
    """Map a handler's return value to an acknowledge type; ``None`` if it is not one."""
    if result is None:
        return AcknowledgeType.ACCEPT
    if isinstance(result, AcknowledgeType) and result in _OUTCOMES:
        return result
    return None


class AgentStats:
    """Counters of one share agent in this process.

    ``lock_expired``: records released unhandled because their acquisition lock expired while
    they waited for a handler; ``acks_dropped``: outcomes the leader refused as stale.
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

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class ShareAgent(mode.Service):
    """A share-group member that runs ``handler`` on each record.

    Args:
        app: the queueflow app.
        handler: ``async def handler(record: ShareRecord) -> ACCEPT | RELEASE | REJECT | None``.
        topic: the source topic (a Faust topic; its key/value types and serializers decode
            records).
        group: the share group id.
        concurrency: handler tasks in this process.
        name: the agent's name (defaults to the handler's qualified name).
        lock_duration_ms: this member's acquisition lock duration (ms), bounded by
            ``group.share.max.record.lock.duration.ms``; ``None`` uses the group's.

    Raises:
        ConfigurationError: concurrency < 1 or a lock duration out of range (at declaration);
            an unknown topic (at start-up).
    """

    def __init__(
        self,
        app: App,
        handler: Handler,
        topic: Any,
        group: str,
        concurrency: int = 1,
        name: str | None = None,
        lock_duration_ms: int | None = None,
        **kwargs: Any,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"share_agent concurrency={concurrency}; must be >= 1")
        settings = app.share_settings
        if lock_duration_ms is not None and not (
            1000 <= lock_duration_ms <= settings.max_record_lock_duration_ms
        ):
            raise ConfigurationError(
                f"share_agent lock_duration_ms={lock_duration_ms} is out of range; allowed "
                f"[1000..{settings.max_record_lock_duration_ms}] "
                "(group.share.max.record.lock.duration.ms)"
            )
        self.app = app
        self.handler = handler
        self.topic = topic
        self.topic_name: str = topic if isinstance(topic, str) else topic.get_topic_name()
        self.group = group
        self.concurrency = concurrency
        self.name = name or f"{handler.__module__}.{handler.__qualname__}"
        self.lock_duration_ms = lock_duration_ms
        self.stats = AgentStats()
        self.client: MemberClient | None = None
        # Records waiting for a handler; workers wait on _queued when it is empty (a deque and
        # an event: asyncio.Queue's per-item wake-ups cost more than a no-op handler).
        self._queue: collections.deque[ShareRecord] = collections.deque()
        self._queued = asyncio.Event()
        self._acks = AcknowledgementBuffer()
        self._outstanding = 0
        # Moving averages (s) of one handler call and of one ShareFetch cycle (round trip plus
        # reading the records); the start values are conservative, so first batches are small.
        self._handler_s = 0.1
        self._fetch_cycle_s = 0.005
        # This member's acquisition lock duration (s), as the leaders last said.
        self._lock_s = (lock_duration_ms or settings.record_lock_duration_ms) / 1000
        # Set when the records outstanding drop below high_water (fetch loops wait on it).
        self._room_free = asyncio.Event()
        self._refill_level = 0
        self._backoff: dict[tuple[str, int], float] = {}  # s, per share-partition
        self._idle_until: dict[tuple[str, int], float] = {}  # monotonic s
        self._fetchers: dict[tuple[str, int], list[asyncio.Task[None]]] = {}
        self._busy = 0  # handler calls in progress
        self._idle = asyncio.Event()  # set when _busy drops to 0 while stopping
        self._stopping = False
        self._log = log.bind(group=group, agent=self.name)
        labels = (group, self.topic_name)
        self._delivered = metrics.DELIVERED.labels(*labels)
        self._redelivered = metrics.REDELIVERED.labels(*labels)
        self._fetch_seconds = metrics.SHARE_FETCH_SECONDS.labels(*labels)
        self._acks_dropped = metrics.ACKNOWLEDGEMENTS_DROPPED.labels(*labels)
        self._lock_expired = metrics.LOCK_EXPIRED_UNHANDLED.labels(*labels)
        self._last_expired_deadline = 0.0  # one log line per expired batch, not per record
        self._acknowledged = {
            kind: metrics.ACKNOWLEDGEMENTS.labels(*labels, kind.name.lower()) for kind in _OUTCOMES
        }
        self._ack_counts = dict.fromkeys(_OUTCOMES, 0)  # published per ShareFetch
        self._decodes = self._needs_decoding(topic)
        super().__init__(**kwargs)

    def __call__(self, record: ShareRecord) -> Awaitable[Any]:
        """Call the handler directly (for unit tests of the handler itself)."""
        return self.handler(record)

    @property
    def _request_timeout_s(self) -> float:
        return self.app.share_settings.request_timeout_ms / 1000

    @property
    def high_water(self) -> int:
        """Records this process keeps acquired at most.

        Enough to keep every handler busy while the next ShareFetch is on its way (a refill
        starts at half of it): three times the records the handlers complete in one ShareFetch
        cycle, round trip plus read (measured, as moving averages), plus two per handler; at
        least ``2 * concurrency`` and at most ``max.poll.records``. Fast handlers get large
        batches (throughput); slow ones get small batches, so locks stay short and members
        sharing a partition share its records fairly. Never more than the handlers get through
        in half the acquisition lock duration, so that a record is not still queued when its
        lock expires (a slow ShareFetch, say while the broker restarts, would otherwise inflate
        the batch).
        """
        rate = self.concurrency / max(self._handler_s, 1e-6)  # records per second
        wanted = int(3 * rate * self._fetch_cycle_s) + 2 * self.concurrency
        wanted = min(wanted, int(rate * self._lock_s / 2), self.app.share_settings.max_poll_records)
        return max(2 * self.concurrency, wanted)

    # -- lifecycle -------------------------------------------------------------------------
    async def on_start(self) -> None:
        self.client = MemberClient(
            bootstrap_servers(self.app.conf.broker),
            self.app.share_namespace,
            self.group,
            [self.topic_name],
            self.app.share_settings,
            client_id=f"{self.app.conf.id}:{self.name}",
        )
        await self.client.start()
        for i in range(self.concurrency):
            self.add_future(self._worker(i))
        self.add_future(self._supervise())
        self._log.info(
            "share_agent_started",
            topic=self.topic_name,
            member_id=self.client.member_id,
            concurrency=self.concurrency,
        )

    async def on_stop(self) -> None:
        """Graceful drain (seed 004): stop fetching, let running handlers finish within
        ``queueflow.shutdown.timeout.ms``, release what was not started, flush acknowledgements
        and leave the group (the leaders release anything still held)."""
        started = time.monotonic()
        self._stopping = True
        for tasks in self._fetchers.values():
            for task in tasks:
                task.cancel()
        self._release_queued()
        if self._busy:
            timeout = self.app.share_settings.shutdown_timeout_ms / 1000
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except asyncio.TimeoutError:
                # The worker futures are cancelled after on_stop: those handlers get
                # CancelledError and their records go back when the member leaves.
                self._log.warning("drain_timeout", unfinished=self._busy, timeout_s=timeout)
        self._release_queued()  # records of a ShareFetch that completed meanwhile
        await self._flush_all()
        if self.client is not None:
            await self.client.close(leave=True)
        drain_s = time.monotonic() - started
        metrics.DRAIN_SECONDS.labels(self.group, self.name).set(drain_s)
        self._log.info("share_agent_drained", drain_ms=int(drain_s * 1000), **self.stats.as_dict())

    def _release_queued(self) -> None:
        while self._queue:
            record = self._queue.popleft()
            self._acks.add((record.topic, record.partition), record.offset, AcknowledgeType.RELEASE)
            self.stats.released += 1

    # -- fetching --------------------------------------------------------------------------
    async def _supervise(self) -> None:
        """Start and stop one fetch loop per assigned share-partition; send acknowledgements
        of share-partitions no longer assigned (their records finished after a reassignment)."""
        assert self.client is not None
        while not self._stopping:
            wanted = set(self.client.assignment)
            for tp in wanted - set(self._fetchers):
                self._fetchers[tp] = [
                    asyncio.create_task(self._fetch_loop(tp)) for _ in range(FETCHES_IN_FLIGHT)
                ]
            for tp in set(self._fetchers) - wanted:
                tasks = self._fetchers.pop(tp)
                for task in tasks:
                    task.cancel()
                # Not awaited here: a cancelled loop finishes its ShareFetch in flight (up to
                # the request timeout), and the other share-partitions' acknowledgements must
                # not wait for it or their locks could expire.
                self.add_future(self._retire(tp, tasks))
            for tp in self._acks.partitions():
                if tp not in self._fetchers:
                    await self._flush(tp)
            self.client.assignment_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.client.assignment_changed.wait(), timeout=0.5)

    async def _retire(self, tp: tuple[str, int], tasks: list[asyncio.Task[None]]) -> None:
        """Wait for the cancelled fetch loops of a share-partition no longer assigned, then
        close its reader unless it was assigned again meanwhile."""
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if tp not in self._fetchers and self.client is not None:
            await self.client.drop_reader(*tp)

    async def _reserve(self, tp: tuple[str, int]) -> int:
        """Wait until the records outstanding drop to half of :attr:`high_water` (or until
        acknowledgements have lingered long enough), then reserve the room up to it; returns
        how many records to acquire.

        Refilling at half, with :data:`FETCHES_IN_FLIGHT` loops per share-partition, keeps a
        ShareFetch in flight while the handlers work through the previous batch, without
        splitting the work into one-record ShareFetches.
        """
        # Woken every linger period even without room: outcomes recorded meanwhile must not
        # wait for room (that can take seconds with slow handlers) or their locks expire.
        linger_s = max(self.app.share_settings.acknowledgement_linger_ms / 1000, 0.005)
        while self._outstanding > self._refill_at():
            self._room_free.clear()
            try:
                await asyncio.wait_for(self._room_free.wait(), timeout=linger_s)
            except asyncio.TimeoutError:
                if self._acks.pending(tp):
                    break  # no room, but acknowledgements have waited long enough: send them
        want = min(
            max(self.high_water - self._outstanding, 0), self.app.share_settings.max_poll_records
        )
        self._outstanding += want
        return want

    def _refill_at(self) -> int:
        self._refill_level = self.high_water // 2
        return self._refill_level

    def _unreserve(self, count: int) -> None:
        if count:
            self._outstanding -= count
            # The threshold is the one computed when the waiting fetch loop last looked.
            if not self._room_free.is_set() and self._outstanding <= self._refill_level:
                self._room_free.set()

    async def _fetch_loop(self, tp: tuple[str, int]) -> None:
        # The back-off after empty or failed ShareFetches is shared by the share-partition's
        # loops, so an idle share-partition costs one request per back-off period, not two.
        while not self._stopping:
            idle_until = self._idle_until.get(tp, 0.0)
            if idle_until > time.monotonic():
                await asyncio.sleep(idle_until - time.monotonic())
                continue
            want = await self._reserve(tp)
            # Shielded: when the share-partition is reassigned mid-request, the request still
            # completes and its records are handled, instead of staying locked until expiry.
            fetch = asyncio.ensure_future(self._fetch_once(tp, want))
            try:
                delivered = await asyncio.shield(fetch)
            except asyncio.CancelledError:
                delivered = 0
                with contextlib.suppress(Exception):
                    delivered = await asyncio.wait_for(fetch, self._request_timeout_s)
                self._unreserve(want - max(delivered, 0))
                raise
            except Exception as exc:  # keep fetching whatever goes wrong; say what it was
                self._log.warning(
                    "share_fetch_failed", topic=tp[0], partition=tp[1], error=repr(exc)
                )
                delivered = -1
            self._unreserve(want - max(delivered, 0))
            if delivered > 0:
                self._backoff[tp] = 0.005
            elif want or delivered < 0:
                backoff = self._backoff.get(tp, 0.005)
                self._idle_until[tp] = time.monotonic() + backoff
                self._backoff[tp] = min(backoff * 2, 1.0 if delivered < 0 else 0.2)

    async def _fetch_once(self, tp: tuple[str, int], want: int) -> int:
        """One ShareFetch with the pending acknowledgements of ``tp`` riding along.

        Returns:
            records queued for the handlers (0 when none were acquired), -1 on an error.
        """
        assert self.client is not None
        self._publish_ack_counts()
        acks = self._acks.take(tp)
        if want == 0 and not acks:
            return 0
        started = time.monotonic()
        try:
            response = await self.client.share_fetch(
                tp[0], tp[1], want, acks, self.lock_duration_ms
            )
            self._fetch_seconds.observe(time.monotonic() - started)
        except Exception:
            self._acks.restore(tp, acks)  # the leader may not have seen them: send them again
            raise
        if response.ack_error != ErrorCode.NONE.value:
            self._acknowledgements_refused(tp, acks, response)
        if response.error != ErrorCode.NONE.value:
            self._log.error(
                "share_fetch_error",
                topic=tp[0],
                partition=tp[1],
                error=response.error,
                detail=response.error_message,
            )
            return -1
        if not response.acquired:
            return 0
        if response.lock_timeout_ms:
            self._lock_s = response.lock_timeout_ms / 1000
        records = await self.client.read_acquired(
            tp, response.acquired, self._acks, self.client.lock_deadline(started, response)
        )
        self._fetch_cycle_s += 0.2 * (time.monotonic() - started - self._fetch_cycle_s)
        redelivered = sum(1 for r in records if r.delivery_count > 1)
        self.stats.delivered += len(records)
        self.stats.redelivered += redelivered
        self._delivered.inc(len(records))
        self._redelivered.inc(redelivered)
        self._queue.extend(records)
        self._queued.set()
        return len(records)

    async def _flush(self, tp: tuple[str, int]) -> None:
        # One request per batch: a batch whose earlier request failed goes alone first.
        while self.client is not None and (acks := self._acks.take(tp)):
            try:
                response = await self.client.share_fetch(tp[0], tp[1], 0, acks)
                if response.ack_error != ErrorCode.NONE.value:
                    self._acknowledgements_refused(tp, acks, response)
            except ShareGroupError as exc:
                self._acks.restore(tp, acks)  # the leader may not have seen them
                self._log.warning("acknowledgement_flush_failed", error=str(exc))
                return

    def _acknowledgements_refused(
        self, tp: tuple[str, int], acks: list[WireAck], response: ShareFetchResponse
    ) -> None:
        """The leader refused a request's acknowledgements as a whole: send the ones that are
        still valid again (see :meth:`AcknowledgementBuffer.refused`); only the stale ones are
        lost, and their records are delivered again."""
        if response.ack_error not in _SPLITTABLE:
            self._log.warning(
                "acknowledgement_refused",
                topic=tp[0],
                partition=tp[1],
                error=response.ack_error,
                detail=response.ack_error_message,
                records=sum(last - first + 1 for first, last, _ in acks),
                note="these records will be delivered again",
            )
            return
        dropped = self._acks.refused(tp, acks, response.ack_stale)
        if dropped:
            self.stats.acks_dropped += len(dropped)
            self._acks_dropped.inc(len(dropped))
            self._log.warning(
                "stale_acknowledgements_dropped",
                topic=tp[0],
                partition=tp[1],
                offsets=_ranges_text(dropped),
                error=response.ack_error,
                detail=response.ack_error_message,
                note="these records will be delivered again",
            )

    def _publish_ack_counts(self) -> None:
        for kind, count in self._ack_counts.items():
            if count:
                self._acknowledged[kind].inc(count)
                self._ack_counts[kind] = 0

    async def _flush_all(self) -> None:
        self._publish_ack_counts()
        for tp in self._acks.partitions():
            await self._flush(tp)

    # -- handling --------------------------------------------------------------------------
    async def _worker(self, index: int) -> None:
        # The handler runs inline: a task per record would cost more than a no-op handler.
        # on_stop waits (within the drain timeout) for the handlers in progress, then mode
        # cancels this future.
        queue, queued = self._queue, self._queued
        while not self._stopping:
            if not queue:
                queued.clear()
                await queued.wait()
                continue
            record = queue.popleft()
            if record.lock_deadline <= time.monotonic():
                self._lock_expired_unhandled(record)
                continue
            self._busy += 1
            try:
                await self._handle_one(record)
            finally:
                self._busy -= 1
                if self._stopping and not self._busy:
                    self._idle.set()

    def _lock_expired_unhandled(self, record: ShareRecord) -> None:
        """The record's acquisition lock expired while it waited for a handler: the leader may
        have delivered it to another member already, so don't process it; RELEASE it (refused
        harmlessly if the leader expired the lock first)."""
        self.stats.lock_expired += 1
        self._lock_expired.inc()
        self._acks.add((record.topic, record.partition), record.offset, AcknowledgeType.RELEASE)
        self._unreserve(1)
        if record.lock_deadline != self._last_expired_deadline:
            self._last_expired_deadline = record.lock_deadline
            self._log.warning(
                "acquisition_lock_expired_before_handling",
                queued=len(self._queue),
                note="released unhandled; the handlers are slower than the lock "
                "duration allows (raise group.share.record.lock.duration.ms "
                "or lower max.poll.records)",
                **self._where(record),
            )

    async def _handle_one(self, record: ShareRecord) -> None:
        started = time.monotonic()
        outcome = await self._process(record)
        self._handler_s += 0.05 * (time.monotonic() - started - self._handler_s)
        self._ack_counts[outcome] += 1
        self._acks.add((record.topic, record.partition), record.offset, outcome)
        if outcome is AcknowledgeType.RELEASE and self.client is not None:
            self.client.remember_released(record)
        self._unreserve(1)

    @staticmethod
    def _needs_decoding(topic: Any) -> bool:
        """False for a topic name or a Faust topic whose records stay raw bytes."""
        if isinstance(topic, str):
            return False
        return not (
            topic.value_type is None
            and topic.value_serializer == "raw"
            and topic.key_type is None
            and topic.key_serializer in ("raw", None)
        )

    def _decode(self, record: ShareRecord) -> None:
        if not self._decodes:
            return
        topic = self.topic
        serializers = self.app.serializers
        record.value = serializers.loads_value(
            topic.value_type, record.raw_value, serializer=topic.value_serializer
        )
        if record.key is not None:
            with contextlib.suppress(Exception):
                record.key = serializers.loads_key(
                    topic.key_type, record.key, serializer=topic.key_serializer
                )

    def _where(self, record: ShareRecord) -> dict[str, Any]:
        return {
            "group": self.group,
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "delivery_count": record.delivery_count,
        }

    async def _process(self, record: ShareRecord) -> AcknowledgeType:
        try:
            self._decode(record)
        except Exception as exc:
            self.stats.undecodable += 1
            self.stats.rejected += 1
            metrics.HANDLER_ERRORS.labels(self.group, record.topic, "undecodable").inc()
            self._log.error("undecodable_record_rejected", error=repr(exc), **self._where(record))
            return AcknowledgeType.REJECT
        try:
            result = await self.handler(record)
        except asyncio.CancelledError:
            self.stats.released += 1
            raise
        except Exception as exc:
            self.stats.handler_errors += 1
            self.stats.released += 1
            metrics.HANDLER_ERRORS.labels(self.group, record.topic, "raised").inc()
            self._log.error(
                "handler_raised_record_released",
                error=repr(exc),
                exc_info=True,
                **self._where(record),
            )
            return AcknowledgeType.RELEASE
        outcome = outcome_of(result)
        if outcome is None:
            self.stats.handler_errors += 1
            self.stats.released += 1
            metrics.HANDLER_ERRORS.labels(self.group, record.topic, "invalid_outcome").inc()
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
