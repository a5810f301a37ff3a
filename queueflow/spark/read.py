"""Executor side of the ``queueflow`` source: which offsets each Spark task reads, and reading
them from Kafka into Arrow batches.

Only coordinates travel through Spark's plan: the driver acquires offset ranges, the batch's
offset (in the checkpoint) lists them, :func:`plan_partitions` splits them into tasks
deterministically, and :func:`read_partition` reads the payloads by offset from the source
partition (:class:`~queueflow.member.reader.PartitionReader`, a group-less consumer). Offsets
without a record (transaction markers, compacted away) produce no row.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from pyspark.sql.datasource import InputPartition

from queueflow.member.reader import PartitionReader
from queueflow.spark.options import SourceOptions
from queueflow.structs import ShareRecord

__all__ = [
    "ARROW_BATCH_ROWS",
    "SCHEMA_DDL",
    "QueueflowInputPartition",
    "arrow_schema",
    "plan_partitions",
    "read_partition",
    "records_to_batch",
    "spark_schema",
]

log = structlog.get_logger("queueflow.spark.read")

#: The source's schema: that of Spark's Kafka source plus ``delivery_count``.
SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>, delivery_count int"
)

#: Rows per Arrow batch yielded by a task.
ARROW_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class QueueflowInputPartition(InputPartition):
    """One Spark task: offset ranges of one source partition.

    Attributes:
        topic / partition: the source partition.
        ranges: ``(first, last, delivery_count)``, inclusive, in offset order.
    """

    topic: str
    partition: int
    ranges: tuple[tuple[int, int, int], ...]

    @property
    def count(self) -> int:
        """How many offsets the task covers."""
        return sum(last - first + 1 for first, last, _ in self.ranges)


def plan_partitions(
    acquired: Sequence[Sequence[Any]], min_partitions: int | None = None
) -> list[QueueflowInputPartition]:
    """Split a batch's acquired ranges into Spark tasks; deterministic in its arguments.

    By default one task per source partition (as Spark's Kafka source). With
    ``min_partitions`` above that, a partition gets about its share of ``min_partitions``
    tasks (``ceil(min_partitions * its offsets / all offsets)``, at most one per offset), each
    a contiguous run of its offsets of near-equal size.

    Args:
        acquired: ``[topic, partition, first, last, delivery_count]`` entries (an offset's
            ``"acq"`` list).
        min_partitions: the desired minimum number of tasks, or None.
    """
    by_tp: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for topic, partition, first, last, count in acquired:
        by_tp.setdefault((str(topic), int(partition)), []).append(
            (int(first), int(last), int(count))
        )
    total = sum(last - first + 1 for ranges in by_tp.values() for first, last, _ in ranges)
    out: list[QueueflowInputPartition] = []
    for (topic, partition), ranges in sorted(by_tp.items()):
        ranges.sort()
        size = sum(last - first + 1 for first, last, _ in ranges)
        parts = 1
        if min_partitions and min_partitions > len(by_tp) and total:
            parts = min(max(math.ceil(min_partitions * size / total), 1), size)
        for chunk in _chunks(ranges, parts):
            out.append(QueueflowInputPartition(topic, partition, tuple(chunk)))
    return out


def _chunks(ranges: list[tuple[int, int, int]], parts: int) -> Iterator[list[tuple[int, int, int]]]:
    """The offsets of ``ranges`` in ``parts`` contiguous pieces of near-equal size."""
    size = sum(last - first + 1 for first, last, _ in ranges)
    base, extra = divmod(size, parts)
    wanted = [base + (1 if i < extra else 0) for i in range(parts)]
    queue = list(ranges)
    for want in wanted:
        chunk: list[tuple[int, int, int]] = []
        while want > 0:
            first, last, count = queue.pop(0)
            n = last - first + 1
            if n > want:
                chunk.append((first, first + want - 1, count))
                queue.insert(0, (first + want, last, count))
                want = 0
            else:
                chunk.append((first, last, count))
                want -= n
        yield chunk


def spark_schema() -> Any:
    """The source's schema (:data:`SCHEMA_DDL`) as a :class:`pyspark.sql.types.StructType`
    (built here: parsing DDL needs a running SparkContext)."""
    from pyspark.sql import types as T

    header = T.StructType(
        [T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]
    )
    return T.StructType(
        [
            T.StructField("key", T.BinaryType()),
            T.StructField("value", T.BinaryType()),
            T.StructField("topic", T.StringType()),
            T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
            T.StructField("timestamp", T.TimestampType()),
            T.StructField("timestampType", T.IntegerType()),
            T.StructField("headers", T.ArrayType(header)),
            T.StructField("delivery_count", T.IntegerType()),
        ]
    )


_ARROW_SCHEMA: Any = None


def arrow_schema() -> Any:
    """The Arrow schema Spark expects for :data:`SCHEMA_DDL` (``int`` as int32, timestamps
    in µs UTC): built by pyspark's own conversion, so it matches exactly."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMA = to_arrow_schema(spark_schema(), timezone="UTC")
    return _ARROW_SCHEMA


def records_to_batch(records: Sequence[ShareRecord]) -> Any:
    """A :class:`pyarrow.RecordBatch` of ``records`` in the source's schema."""
    import pyarrow as pa

    schema = arrow_schema()
    columns = [
        pa.array([r.raw_key for r in records], pa.binary()),
        pa.array([r.raw_value for r in records], pa.binary()),
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp * 1000 for r in records], pa.int64()).cast(
            schema.field("timestamp").type
        ),
        pa.array([r.timestamp_type for r in records], pa.int32()),
        pa.array(
            [[{"key": k, "value": v} for k, v in (r.headers or ())] for r in records],
            schema.field("headers").type,
        ),
        pa.array([r.delivery_count for r in records], pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_partition(
    options: SourceOptions, partition: QueueflowInputPartition, timeout_ms: int
) -> Iterator[Any]:
    """Read one task's offsets from Kafka; yields Arrow batches of up to
    :data:`ARROW_BATCH_ROWS` rows (none for offsets without records).

    Raises:
        ShareGroupError: ``REQUEST_TIMED_OUT`` when the offsets can't be read within
            ``timeout_ms`` (the task fails and Spark retries it).
    """
    kafka = options.kafka_config("queueflow-spark-reader")

    async def read() -> list[ShareRecord]:
        reader = PartitionReader(kafka, partition.topic, partition.partition)
        try:
            records, _gaps, undecodable = await reader.read(list(partition.ranges), timeout_ms)
        finally:
            await reader.close()
        if undecodable:  # rows all the same: the job chooses their outcome (docs/spark.md)
            log.warning(
                "undecodable_records_read",
                topic=partition.topic,
                partition=partition.partition,
                offsets=[record.offset for record, _ in undecodable][:20],
                error=undecodable[0][1],
                note="their header names are given with U+FFFD replacement characters",
            )
            records = sorted([*records, *(r for r, _ in undecodable)], key=lambda r: r.offset)
        return records

    records = asyncio.run(read()) if partition.ranges else []
    for i in range(0, len(records), ARROW_BATCH_ROWS):
        yield records_to_batch(records[i : i + ARROW_BATCH_ROWS])
