"""Log start and end offsets of source partitions, for share-partition leaders.

A leader needs the log end (the high watermark) on every ShareFetch that acquires, to know how
far the SPEO may move (KIP-932 "Managing the SPSO and SPEO"), and the log start or end when it
initialises a new share-partition (``share.auto.offset.reset``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from aiokafka import AIOKafkaConsumer

from queueflow.kafka.config import KafkaClientConfig
from queueflow.structs import TopicPartition

__all__ = ["LOG_END_REFRESH_S", "LOG_END_WATCH_S", "LogOffsets"]

log = structlog.get_logger("queueflow.server.log_offsets")

#: How often the end offsets of source partitions being fetched are refreshed (s), and how long
#: after the last ShareFetch they stay watched (s).
LOG_END_REFRESH_S = 0.005
LOG_END_WATCH_S = 2.0


class LogOffsets:
    """Log start and end offsets of source partitions, from a group-less consumer.

    The end offsets of partitions fetched from recently are refreshed in the background every
    :data:`LOG_END_REFRESH_S`, so a ShareFetch that finds nothing to acquire need not wait for a
    ListOffsets round trip (which would hold up every request behind it in the leader agent).

    Args:
        kafka: the cluster.
    """

    def __init__(self, kafka: KafkaClientConfig) -> None:
        self.kafka = kafka
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
                **self.kafka.client_kwargs(), enable_auto_commit=False
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
        return int((await consumer.beginning_offsets([tp]))[tp])

    async def close(self) -> None:
        """Stop the background refresh and close the consumer."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refresher
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
