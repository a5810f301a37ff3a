"""Log start and end offsets of source partitions, for share-partition leaders.

A leader needs the log end (the high watermark) on every ShareFetch that acquires, to know how
far the SPEO may move (KIP-932 "Managing the SPSO and SPEO"), and the log start or end when it
initialises a new share-partition (``share.auto.offset.reset``). For a group with
``share.isolation.level=read_committed`` the SPEO moves only up to the last stable offset (LSO:
the first offset of the oldest open transaction, or the high watermark when none is open),
which a ``read_committed`` ListOffsets returns (docs/concepts.md "read_committed").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import KafkaConnectionError

from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.structs import TopicPartition

__all__ = ["ARRIVAL_FETCH_WAIT_MS", "LogOffsets"]

log = structlog.get_logger("queueflow.server.log_offsets")
_T = TypeVar("_T")

#: The long-poll fetch of :meth:`LogOffsets.wait_end_beyond`: how long the broker holds it (ms)
#: when no record comes (a record ends it at once; a long wait keeps an idle leader quiet).
ARRIVAL_FETCH_WAIT_MS = 5000


class LogOffsets:
    """Log start and end offsets of source partitions, from a group-less consumer.

    Nothing is refreshed in the background: a leader asks the broker when the end it knows
    would leave a ShareFetch short (``ShareFetcher.acquire_from`` in
    :mod:`queueflow.server.leader.fetching`), and long polls learn it as records arrive
    (:meth:`wait_end_beyond`).

    Args:
        kafka: the cluster.
    """

    def __init__(self, kafka: KafkaClientConfig) -> None:
        self.kafka = kafka
        self._consumer: AIOKafkaConsumer | None = None
        self._stable_consumer: AIOKafkaConsumer | None = None  # read_committed ListOffsets
        self.end: dict[TopicPartition, int] = {}
        #: The last stable offset of partitions read_committed groups acquire from.
        self.stable: dict[TopicPartition, int] = {}
        self._client_lock = asyncio.Lock()
        # wait_end_beyond: per partition, a consumer long-polling where records are awaited.
        self._arrivals: dict[TopicPartition, _Arrivals] = {}
        #: ListOffsets calls under way, and those close() cancelled (see _ask).
        self._asking: set[asyncio.Future[Any]] = set()
        self._cancelled_by_close: set[asyncio.Future[Any]] = set()

    def known_end(self, tp: TopicPartition) -> int | None:
        """The last known high watermark of ``tp`` (``None`` if unknown), without watching it."""
        return self.end.get(tp)

    def known_stable_end(self, tp: TopicPartition) -> int | None:
        """The last known last stable offset of ``tp`` (``None`` if unknown), without watching
        it."""
        return self.stable.get(tp)

    async def stable_end(self, tp: TopicPartition) -> int:
        """Refresh and return the last stable offset of ``tp`` (a ``read_committed``
        ListOffsets)."""
        consumer = await self._client(stable=True)
        return self._raise_stable(tp, (await self._ask(consumer.end_offsets([tp])))[tp])

    def _raise_stable(self, tp: TopicPartition, end: int) -> int:
        """Record a last stable offset seen for ``tp``; never lowers it (as :meth:`_raise_end`:
        an older answer may arrive after a newer one)."""
        highest = max(self.stable.get(tp, -1), end)
        self.stable[tp] = highest
        return highest

    async def log_end(self, tp: TopicPartition) -> int:
        """Refresh and return the high watermark of ``tp``."""
        consumer = await self._client()
        return self._raise_end(tp, (await self._ask(consumer.end_offsets([tp])))[tp])

    async def log_ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Refresh and return the high watermarks of ``tps`` (read_uncommitted ListOffsets,
        one round trip per broker)."""
        consumer = await self._client()
        ends = await self._ask(consumer.end_offsets(list(tps)))
        return {tp: self._raise_end(tp, ends[tp]) for tp in tps}

    def _raise_end(self, tp: TopicPartition, end: int) -> int:
        """Record a high watermark seen for ``tp``; returns the highest seen. Never lowers it:
        a ListOffsets answer can be older than what an arrivals consumer read meanwhile, and
        a lowered end would hide records that exist, with no arrival left to wake a long poll
        for them."""
        highest = max(self.end.get(tp, -1), end)
        self.end[tp] = highest
        return highest

    async def log_start(self, tp: TopicPartition) -> int:
        """The log start offset of ``tp``."""
        consumer = await self._client()
        return int((await self._ask(consumer.beginning_offsets([tp])))[tp])

    async def offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> int | None:
        """The first offset of ``tp`` with a timestamp at or after ``timestamp_ms``, or
        ``None`` when there is none (ListOffsets by timestamp)."""
        consumer = await self._client()
        found = (await self._ask(consumer.offsets_for_times({tp: max(timestamp_ms, 0)}))).get(tp)
        return None if found is None else int(found.offset)

    async def wait_end_beyond(self, tp: TopicPartition, offset: int, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` seconds for a record at ``offset`` or later in ``tp``.

        Used by long-poll ShareFetches (KIP-932 ``MaxWaitMs``). Each awaited partition has a
        consumer of its own that long-polls it from the awaited offset: the broker holds the
        fetch until a record arrives (up to :data:`ARRIVAL_FETCH_WAIT_MS`), so an idle leader
        sends about two fetches a second per partition instead of polling the end offsets, and
        a partition's wait never queues behind another partition's fetch (a broker answers the
        requests of one connection in order).

        Returns:
            The high watermark as last known: above ``offset`` if a record arrived in time.
        """
        known = self.end.get(tp, -1)
        if known > offset:
            return known
        arrivals = self._arrivals.get(tp)
        if arrivals is None:
            arrivals = self._arrivals[tp] = _Arrivals(self, tp)
        await arrivals.wait(offset, timeout_s)
        return self.end.get(tp, known)

    async def _client(self, *, stable: bool = False) -> AIOKafkaConsumer:
        """The ListOffsets consumer: ``read_uncommitted`` (high watermarks) or, with
        ``stable``, ``read_committed`` (last stable offsets)."""
        async with self._client_lock:  # concurrent callers must not use it before it started
            consumer = self._stable_consumer if stable else self._consumer
            if consumer is None:
                consumer = AIOKafkaConsumer(
                    **self.kafka.client_kwargs(),
                    enable_auto_commit=False,
                    isolation_level="read_committed" if stable else "read_uncommitted",
                )
                await consumer.start()
                if stable:
                    self._stable_consumer = consumer
                else:
                    self._consumer = consumer
            return consumer

    async def _ask(self, call: Coroutine[Any, Any, _T]) -> _T:
        """Await one ListOffsets ``call`` of a consumer. If :meth:`close` stops the consumers
        meanwhile, fail at once: the call would otherwise wait out its request timeout (40 s)
        for metadata that no stopped client fetches, and a stopping worker's last stream event
        (Faust waits for it) with it.

        Raises:
            KafkaConnectionError: :meth:`close` stopped the consumer during the call.
        """
        ask = asyncio.ensure_future(call)
        self._asking.add(ask)
        try:
            return await ask
        except asyncio.CancelledError:
            if ask not in self._cancelled_by_close:
                raise
            raise KafkaConnectionError(
                "the log offsets consumer was closed during the call: the worker is stopping"
            ) from None
        finally:
            self._asking.discard(ask)
            self._cancelled_by_close.discard(ask)

    async def close(self) -> None:
        """Stop the background work and close the consumers; calls under way fail at once
        (:meth:`_ask`)."""
        for ask in list(self._asking):
            self._cancelled_by_close.add(ask)
            ask.cancel()
        for arrivals in self._arrivals.values():
            await arrivals.close()
        self._arrivals.clear()
        if self._consumer is not None:
            await stop_quietly("log offsets consumer", self._consumer.stop)
        if self._stable_consumer is not None:
            await stop_quietly("log offsets consumer", self._stable_consumer.stop)
        self._consumer = self._stable_consumer = None


class _Arrivals:
    """Waits for records at or after given offsets of one partition (see
    :meth:`LogOffsets.wait_end_beyond`)."""

    def __init__(self, offsets: LogOffsets, tp: TopicPartition) -> None:
        self.offsets = offsets
        self.tp = tp
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.position = -1  # where the consumer reads next, as set or seen here
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def wait(self, offset: int, timeout_s: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (offset, future)
        self.waiters.append(entry)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), timeout_s)
        finally:
            if entry in self.waiters:
                self.waiters.remove(entry)

    async def _run(self) -> None:
        tp = self.tp
        ktp = KafkaTopicPartition(tp.topic, tp.partition)
        while True:
            try:
                if self._consumer is None:
                    consumer = AIOKafkaConsumer(
                        **self.offsets.kafka.client_kwargs(),
                        enable_auto_commit=False,
                        fetch_max_wait_ms=ARRIVAL_FETCH_WAIT_MS,
                        max_partition_fetch_bytes=1,  # the broker still returns one batch
                    )
                    await consumer.start()
                    consumer.assign([ktp])
                    self._consumer, self.position = consumer, -1
                consumer = self._consumer
                if not self.waiters:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                lowest = min(offset for offset, _ in self.waiters)
                if self.position < lowest:
                    consumer.seek(ktp, lowest)
                    self.position = lowest
                # Only a new waiter below the position could need a seek; the others are
                # served by the fetch under way, which is not interrupted.
                batch = await consumer.getmany(ktp, timeout_ms=ARRIVAL_FETCH_WAIT_MS, max_records=1)
                records = batch.get(ktp, [])
                if not records:
                    continue
                last = records[-1].offset
                end = max(last + 1, consumer.highwater(ktp) or 0)
                self.offsets._raise_end(tp, end)
                self.position = last + 1
                if end > self.position:  # skip what arrived meanwhile: only the end matters
                    consumer.seek(ktp, end)
                    self.position = end
                for offset, future in self.waiters:
                    if offset <= last and not future.done():
                        future.set_result(None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker may be restarting: waits end on their own
                log.warning(
                    "log_end_wait_failed", topic=tp.topic, partition=tp.partition, error=repr(exc)
                )
                await self._drop_consumer()
                await asyncio.sleep(1.0)

    async def _drop_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stop_quietly("log end watch consumer", consumer.stop)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._drop_consumer()
