"""Reading a range of a partition's records by offset, outside any consumer group.

A new share-partition leader uses it to read the requests its predecessor never handled (see
:meth:`queueflow.server.leader.ShareLeader.handle`): Faust resumes a request partition from
its committed offset, which a rebalance can leave past requests nobody applied.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly

__all__ = ["LogRangeReader", "read_latest"]


class LogRangeReader:
    """Reads ``[start, end)`` of one partition with a group-less consumer made for the read.

    Args:
        kafka: the cluster.
        timeout_s: how long one read may take in all (s); what was read by then is returned.
    """

    def __init__(self, kafka: KafkaClientConfig, timeout_s: float = 10.0) -> None:
        self.kafka = kafka
        self.timeout_s = timeout_s

    async def read(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, bytes]]:
        """The records of ``topic[partition]`` with ``start <= offset < end``, in order, as
        ``(offset, value)``; records without a value are left out, and so are offsets already
        deleted by retention.

        Raises:
            aiokafka.errors.KafkaError: the consumer could not start (the broker is down).
        """
        if end <= start:
            return []
        tp = KafkaTopicPartition(topic, partition)
        consumer = AIOKafkaConsumer(
            **self.kafka.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest"
        )
        try:
            await consumer.start()
        except BaseException:
            await stop_quietly("request log reader", consumer.stop)
            raise
        out: list[tuple[int, bytes]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            consumer.assign([tp])
            consumer.seek(tp, start)
            position = start
            while position < end and loop.time() < deadline:
                wait_ms = max(int(min(0.5, deadline - loop.time()) * 1000), 1)
                batch = await consumer.getmany(tp, timeout_ms=wait_ms)
                for record in batch.get(tp, []):
                    position = record.offset + 1
                    if record.offset >= end:
                        break
                    if record.value is not None:
                        out.append((record.offset, record.value))
                if not batch:  # offsets without records (retention, markers) are skipped
                    position = max(position, await consumer.position(tp))
        finally:
            await stop_quietly("request log reader", consumer.stop)
        return out


async def read_latest(
    consumer: AIOKafkaConsumer,
    topic: str,
    partitions: int,
    timeout_ms: int,
    keep: Callable[[bytes, int], bool] | None = None,
) -> dict[bytes, bytes]:
    """The latest value of every key of the compacted ``topic`` (``partitions`` partitions),
    read from the start up to its end offsets as of now with ``consumer`` (group-less; it is
    assigned here); tombstones delete, records without a key are skipped.

    Args:
        keep: ``keep(key, partition)``: whether a record of ``key`` in ``partition`` counts
            (default: every record). Without it, a key written to two partitions gets the
            value of whichever partition was read last.

    Raises:
        TimeoutError: not read to its end within ``timeout_ms`` (ms).
    """
    tps = [KafkaTopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    ends = await consumer.end_offsets(tps)
    latest: dict[bytes, bytes] = {}
    deadline = time.monotonic() + timeout_ms / 1000
    pending = {tp for tp in tps if ends[tp] > 0}
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"could not read {topic} to its end within {timeout_ms} ms; check the cluster, "
                "or raise the timeout"
            )
        batch = await consumer.getmany(*pending, timeout_ms=500, max_records=10_000)
        for tp, records in batch.items():
            for r in records:
                if r.offset >= ends[tp] or r.key is None:
                    continue
                if keep is not None and not keep(r.key, tp.partition):
                    continue
                if r.value is None:
                    latest.pop(r.key, None)
                else:
                    latest[r.key] = r.value
        for tp in list(pending):
            if await consumer.position(tp) >= ends[tp]:
                pending.discard(tp)
    return latest
