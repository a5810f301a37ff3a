"""The ``queueflow`` sink: ``df.write.format("queueflow")`` and
``df.writeStream.format("queueflow")`` enqueue DataFrame rows as records of a topic that share
groups consume.

Columns are those of Spark's own Kafka sink:

=============  ===========================================  =====================================
column         type                                         meaning
=============  ===========================================  =====================================
``value``      binary or string (required)                  the record value (strings as UTF-8)
``key``        binary or string (optional)                  the record key
``headers``    array<struct<key string, value binary>>      record headers (a string value is
               (optional)                                   encoded as UTF-8)
``topic``      string (optional)                            the topic of this row, unless the
                                                            ``topic`` option is set (the option
                                                            wins, as in Spark's Kafka sink)
``partition``  int (optional)                               the partition; null or absent: the
                                                            producer's partitioner (by key)
=============  ===========================================  =====================================

Other columns are ignored. Each executor task produces its rows with an idempotent aiokafka
producer (``acks=all``), flushes, and reports the counts in its commit message.

**Idempotency.** Spark re-runs a task after a failure and re-runs a micro-batch whose commit was
not recorded, so a row can be enqueued more than once. Every record therefore carries the header
``queueflow.idempotency.key`` (:data:`IDEMPOTENCY_HEADER`), the same on every attempt:

* streaming: ``<query id>/<batch id>/<partition id>/<row index>``: the query id is Spark's
  (kept in the checkpoint, so stable across restarts; the ``query.id`` option overrides it), the
  batch id is the micro-batch's (the same when Spark replays it);
* batch: ``<job id>/<partition id>/<row index>``: the job id is a UUID drawn once when the write
  is planned and shipped to every task, so task retries reuse it (a second ``save()`` is a new
  job and gets a new id).

The row index is the position of the row in its Spark partition, so the key is stable as long as
the partition's rows come in the same order on a retry (true for files, Kafka and sorted input;
after a shuffle without ``sortWithinPartitions`` it may not be). A row whose ``headers`` already
hold ``queueflow.idempotency.key`` keeps that value: give a natural key that way when row order
is not stable. A share-group handler drops duplicates with :func:`idempotency_key`::

    key = idempotency_key(record)
    if key is not None and await seen.contains(key):     # a store the handler owns
        consumer.acknowledge(record, ACCEPT)              # a duplicate: done already
        continue
    handle(record)
    await seen.add(key)                                  # before acknowledging
    consumer.acknowledge(record, ACCEPT)

**Connection options** (shared with ``queueflow-state``; the ``kafka.*`` names are those of the
``queueflow`` source): ``bootstrap.servers`` (or ``kafka.bootstrap.servers``) and the client
settings of :data:`~queueflow.kafka.options.KAFKA_CLIENT_OPTIONS`, e.g.
``kafka.security.protocol``,
``kafka.sasl.mechanism``, ``kafka.sasl.plain.username``, ``kafka.sasl.plain.password``,
``kafka.ssl.cafile``, ``kafka.ssl.certfile``, ``kafka.ssl.keyfile``, ``kafka.ssl.password``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import structlog
from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from queueflow.errors import ConfigurationError
from queueflow.kafka.admin import create_topic_hint, topic_partition_counts
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.options import KafkaOptions, lower_options

__all__ = [
    "IDEMPOTENCY_HEADER",
    "SinkCommitMessage",
    "idempotency_key",
    "make_stream_writer",
    "make_writer",
]

log = structlog.get_logger("queueflow.spark.sink")

#: Header carrying the stable idempotency key of every record the sink produces.
IDEMPOTENCY_HEADER: Final = "queueflow.idempotency.key"

#: Task-local property holding the micro-batch id (``MicroBatchExecution.BATCH_ID_KEY``).
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"
#: Task-local property holding the streaming query id (``StreamExecution.QUERY_ID_KEY``).
QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"

#: Sends awaited together before more are queued (bounds the futures held per task).
_SEND_WINDOW: Final = 5000
#: Seconds a topic's metadata may take to arrive before the write fails.
_METADATA_TIMEOUT_S: Final = 30.0


def idempotency_key(record: Any) -> str | None:
    """The idempotency key the sink gave ``record``, or None if it has none.

    Args:
        record: a :class:`queueflow.ShareRecord` (or anything with ``headers``, a sequence of
            ``(name, bytes)``).
    """
    for name, value in getattr(record, "headers", None) or ():
        if name == IDEMPOTENCY_HEADER:
            return bytes(value).decode() if value is not None else None
    return None


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Columns:
    """Which of the sink's columns the DataFrame has, and how to convert them."""

    value_is_string: bool
    key: bool
    key_is_string: bool
    headers: bool
    topic: bool
    partition: bool


def _type_name(t: DataType) -> str:
    return str(t.simpleString())


def _check_columns(schema: StructType, topic_option: str | None) -> _Columns:
    fields = {f.name: f.dataType for f in schema.fields}
    binary_or_string = (BinaryType(), StringType())
    if "value" not in fields:
        raise ConfigurationError(
            "the DataFrame has no 'value' column: the queueflow sink needs a binary or string "
            f"'value' column (columns: {', '.join(fields) or 'none'}); e.g. "
            "df.selectExpr('CAST(id AS STRING) AS key', 'to_json(struct(*)) AS value')"
        )
    for name in ("value", "key"):
        if name in fields and fields[name] not in binary_or_string:
            raise ConfigurationError(
                f"column {name!r} is {_type_name(fields[name])}: the queueflow sink needs binary "
                f"or string; cast it, e.g. CAST({name} AS STRING)"
            )
    if "headers" in fields:
        t = fields["headers"]
        ok = (
            isinstance(t, ArrayType)
            and isinstance(t.elementType, StructType)
            and {f.name: f.dataType for f in t.elementType.fields}.keys() == {"key", "value"}
            and t.elementType["key"].dataType == StringType()
            and t.elementType["value"].dataType in binary_or_string
        )
        if not ok:
            raise ConfigurationError(
                f"column 'headers' is {_type_name(t)}: the queueflow sink needs "
                "array<struct<key:string,value:binary>>, e.g. "
                "array(struct(lit('source') AS key, CAST('x' AS BINARY) AS value))"
            )
    if "topic" in fields and fields["topic"] != StringType():
        raise ConfigurationError(
            f"column 'topic' is {_type_name(fields['topic'])}: it must be a string"
        )
    if "partition" in fields and fields["partition"] not in (
        IntegerType(),
        LongType(),
        ShortType(),
    ):
        raise ConfigurationError(
            f"column 'partition' is {_type_name(fields['partition'])}: it must be an int"
        )
    if topic_option is None and "topic" not in fields:
        raise ConfigurationError(
            "no topic: set the 'topic' option (.option('topic', 'jobs')) or add a string "
            "'topic' column"
        )
    return _Columns(
        value_is_string=fields["value"] == StringType(),
        key="key" in fields,
        key_is_string=fields.get("key") == StringType(),
        headers="headers" in fields,
        topic="topic" in fields,
        partition="partition" in fields,
    )


def _encode(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


# --------------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------------


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task enqueued.

    Attributes:
        partition_id: the Spark partition the task wrote.
        records: records produced and acknowledged by the brokers.
        by_topic: records per topic.
    """

    partition_id: int
    records: int
    by_topic: dict[str, int]


def _counts(messages: Sequence[Any]) -> tuple[int, dict[str, int]]:
    total = 0
    by_topic: Counter[str] = Counter()
    for m in messages:
        if isinstance(m, SinkCommitMessage):
            total += m.records
            by_topic.update(m.by_topic)
    return total, dict(by_topic)


class _Sink:
    """What the batch and stream writers share: options, columns and the producing task."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigurationError(
                "the queueflow sink only appends (a queue cannot be overwritten): use "
                ".mode('append') for a batch write and outputMode 'append' or 'update' for a "
                "stream"
            )
        opts = lower_options(options)
        self.kafka = KafkaOptions.parse(opts)
        self.topic: str | None = opts.get("topic") or None
        self.columns = _check_columns(schema, self.topic)
        self.query_id: str | None = opts.get("query.id") or None
        self.checkpoint: str | None = opts.get("checkpointlocation") or None

    def _produce(self, rows: Iterator[Any], prefix: str, partition_id: int) -> SinkCommitMessage:
        return asyncio.run(self._produce_async(rows, prefix, partition_id))

    async def _produce_async(
        self, rows: Iterator[Any], prefix: str, partition_id: int
    ) -> SinkCommitMessage:
        from aiokafka import AIOKafkaProducer

        config = self.kafka.client_config("queueflow-spark-sink")
        counts: dict[str, int] = {}
        by_topic: Counter[str] = Counter()
        producer = AIOKafkaProducer(**config.client_kwargs(), enable_idempotence=True, acks="all")
        await producer.start()
        try:
            if self.topic is not None:
                counts.update(await self._partition_counts(config, self.topic))
            pending: list[asyncio.Future[Any]] = []
            for index, row in enumerate(rows):
                topic, partition, key, value, headers = self._record(row)
                if topic not in counts:
                    counts.update(await self._partition_counts(config, topic))
                if partition is not None and not 0 <= partition < counts[topic]:
                    raise ConfigurationError(
                        f"column 'partition' is {partition} in row {index} of Spark partition "
                        f"{partition_id}, but topic {topic!r} has partitions "
                        f"0..{counts[topic] - 1}"
                    )
                if not any(name == IDEMPOTENCY_HEADER for name, _ in headers):
                    headers.append((IDEMPOTENCY_HEADER, f"{prefix}/{index}".encode()))
                pending.append(
                    await producer.send(topic, value, key=key, partition=partition, headers=headers)
                )
                by_topic[topic] += 1
                if len(pending) >= _SEND_WINDOW:
                    await asyncio.gather(*pending)
                    pending.clear()
            await producer.flush()
            await asyncio.gather(*pending)
        finally:
            await producer.stop()
        return SinkCommitMessage(partition_id, sum(by_topic.values()), dict(by_topic))

    async def _partition_counts(self, config: KafkaClientConfig, topic: str) -> dict[str, int]:
        counts = await asyncio.wait_for(
            topic_partition_counts(config, [topic]), _METADATA_TIMEOUT_S
        )
        if topic not in counts:
            source = "option 'topic'" if self.topic is not None else "column 'topic'"
            raise ConfigurationError(
                f"unknown topic {topic!r} (from the {source}) on {self.kafka.bootstrap}: create "
                f"it first with {create_topic_hint(topic, self.kafka.bootstrap)}, or fix the "
                "name; the queueflow sink never creates topics"
            )
        return counts

    def _record(
        self, row: Any
    ) -> tuple[str, int | None, bytes | None, bytes | None, list[tuple[str, bytes]]]:
        """``(topic, partition, key, value, headers)`` of one row."""
        cols = self.columns
        topic = self.topic
        if topic is None:
            topic = row["topic"]
            if not topic:
                raise ConfigurationError(
                    "a row has a null or empty 'topic' column: fill it, or set the 'topic' option"
                )
        partition = row["partition"] if cols.partition else None
        key = _encode(row["key"]) if cols.key else None
        value = _encode(row["value"])
        headers: list[tuple[str, bytes]] = []
        if cols.headers and row["headers"] is not None:
            for h in row["headers"]:
                if h is None or h["key"] is None:
                    raise ConfigurationError(
                        "column 'headers' has an element with a null key: every header needs a "
                        "string key"
                    )
                headers.append((h["key"], _encode(h["value"]) or b""))
        return topic, partition, key, value, headers


class QueueflowWriter(_Sink, DataSourceWriter):
    """Batch writer (``df.write.format("queueflow")``); build with :func:`make_writer`.

    ``job_id`` (a UUID drawn at planning) prefixes every idempotency key of this write.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.job_id = str(uuid.uuid4())

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        """Produce this task's rows (executor side); returns the counts.

        Raises:
            ConfigurationError: a row names an unknown topic or partition, or has a null topic
                or header key.
            aiokafka.errors.KafkaError: the cluster refused or could not take a record.
        """
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition_id = ctx.partitionId() if ctx is not None else 0
        return self._produce(iterator, f"{self.job_id}/{partition_id}", partition_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log what the write enqueued (driver side); the records are already in Kafka."""
        total, by_topic = _counts(messages)
        log.info("spark_sink_committed", job_id=self.job_id, records=total, by_topic=by_topic)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log the failure: records of finished tasks stay enqueued (they can't be withdrawn);
        a rerun of the same job id is dropped by handlers that check the idempotency key."""
        total, by_topic = _counts(messages)
        log.warning("spark_sink_aborted", job_id=self.job_id, records=total, by_topic=by_topic)


class QueueflowStreamWriter(_Sink, DataSourceStreamWriter):
    """Streaming writer (``df.writeStream.format("queueflow")``); build with
    :func:`make_stream_writer`."""

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        """Produce this task's rows of the current micro-batch (executor side).

        Raises:
            ConfigurationError: as for :meth:`QueueflowWriter.write`; also when no stable
                query id is known (no ``query.id`` option, Spark query id or checkpoint).
        """
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise ConfigurationError(
                "QueueflowStreamWriter.write runs in a Spark task; call it through "
                "df.writeStream.format('queueflow')"
            )
        batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        query_id = self.query_id or ctx.getLocalProperty(QUERY_ID_PROPERTY) or self.checkpoint
        if batch_id is None or query_id is None:
            raise ConfigurationError(
                "cannot derive a stable idempotency key: Spark set no micro-batch id or query "
                "id on this task; set the 'query.id' option to a name unique to this query"
            )
        partition_id = ctx.partitionId()
        return self._produce(iterator, f"{query_id}/{batch_id}/{partition_id}", partition_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what micro-batch ``batchId`` enqueued (driver side)."""
        total, by_topic = _counts(messages)
        log.info("spark_sink_committed", batch_id=batchId, records=total, by_topic=by_topic)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log the failure; Spark replays the batch with the same id, hence the same keys."""
        total, by_topic = _counts(messages)
        log.warning("spark_sink_aborted", batch_id=batchId, records=total, by_topic=by_topic)


def make_writer(options: Mapping[str, str], schema: StructType, overwrite: bool) -> QueueflowWriter:
    """The batch writer of ``df.write.format("queueflow")`` (``DataSource.writer``).

    Args:
        options: the data source's options: ``bootstrap.servers`` (required), ``topic``,
            ``kafka.*`` security options (see the module docstring).
        schema: the DataFrame's schema (columns ``value``, ``key``, ``headers``, ``topic``,
            ``partition``).
        overwrite: True for ``mode("overwrite")``, which a queue does not support.

    Raises:
        ConfigurationError: ``overwrite``; a missing ``bootstrap.servers``; no ``value``
            column or a column of the wrong type; neither a ``topic`` option nor column; an
            unsupported ``kafka.*`` option. The message names the option or column and the fix.
    """
    return QueueflowWriter(options, schema, overwrite)


def make_stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> QueueflowStreamWriter:
    """The streaming writer of ``df.writeStream.format("queueflow")``
    (``DataSource.streamWriter``); options as for :func:`make_writer`, plus ``query.id`` (the
    prefix of idempotency keys; default: Spark's query id from the checkpoint).

    Raises:
        ConfigurationError: as for :func:`make_writer` (``overwrite`` is complete output mode,
            which would enqueue every row again on each micro-batch).
    """
    return QueueflowStreamWriter(options, schema, overwrite)
