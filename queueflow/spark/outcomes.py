"""Per-row outcomes (ACCEPT / RELEASE / REJECT) chosen in ``foreachBatch``.

The ``queueflow`` source ACCEPTs every record of a micro-batch once Spark committed it. To
RELEASE (deliver again) or REJECT (archive, never deliver again) chosen rows instead, call
:func:`acknowledge` on them inside ``foreachBatch``::

    def handle(batch, batch_id):
        results = batch.withColumn("outcome", when(col("value").isNull(), "REJECT"))
        results.write...                                   # the batch's real work
        queueflow.spark.acknowledge(results, "outcome", options=SOURCE_OPTIONS)

The outcomes (coordinates only: topic, partition, offset, delivery count) are collected on the
driver and produced to the internal topic :func:`outcomes_topic` (one partition, keyed by the
group) with ``acks=all``, and the call returns once they are written. The source's runner
reads that topic up to its end before it acknowledges a batch: ``foreachBatch`` of batch N
returns before Spark commits N, which is before ``latestOffset(start=end of N)`` acknowledges
N, so the runner always sees them (read-your-writes; ``acks=all`` makes them visible below the
high watermark the runner reads up to).

An outcome names the delivery (``delivery_count``) it is about, so an outcome written for an
earlier delivery of a record never applies to a later one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, TypeVar

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow.errors import ConfigurationError
from queueflow.kafka.admin import ensure_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.protocol.topics import CONTROL_TOPIC_CONFIG
from queueflow.spark.options import ConnectionOptions, parse_connection_options
from queueflow.structs import AcknowledgeType

__all__ = [
    "OUTCOMES_VERSION",
    "OutcomeRange",
    "OutcomeReader",
    "Outcomes",
    "OutcomesMessage",
    "acknowledge",
    "decode_outcomes",
    "encode_outcomes",
    "outcomes_topic",
]

log = structlog.get_logger("queueflow.spark.outcomes")

#: The schema version of :class:`OutcomesMessage`.
OUTCOMES_VERSION = 1
#: Outcome names accepted in the outcome column (case-insensitive).
OUTCOME_NAMES = {
    "ACCEPT": AcknowledgeType.ACCEPT,
    "RELEASE": AcknowledgeType.RELEASE,
    "REJECT": AcknowledgeType.REJECT,
}
#: Ranges per message: keeps a message far below the producer's 1 MiB request limit.
_RANGES_PER_MESSAGE = 5000

T = TypeVar("T")


def outcomes_topic(app_id: str) -> str:
    """The internal topic of per-row outcomes of the app ``app_id`` (one partition)."""
    return f"{app_id}-share-spark-outcomes"


class OutcomeRange(msgspec.Struct, array_like=True, frozen=True):
    """Offsets ``first..last`` (inclusive) of ``topic[partition]`` with one outcome.

    Attributes:
        delivery_count: the delivery the outcome is about; 0 for whichever delivery the runner
            holds (the DataFrame had no ``delivery_count`` column).
        outcome: an :class:`~queueflow.structs.AcknowledgeType` value (1, 2 or 3).
    """

    topic: str
    partition: int
    first: int
    last: int
    delivery_count: int
    outcome: int


class OutcomesMessage(msgspec.Struct, kw_only=True):
    """One message of the outcomes topic (JSON; unknown fields ignored, so a later version may
    add fields with defaults).

    Attributes:
        v: schema version (:data:`OUTCOMES_VERSION`).
        group: the share group the outcomes are for.
        ranges: the outcomes.
    """

    group: str
    ranges: list[OutcomeRange]
    v: int = OUTCOMES_VERSION


_DECODER = msgspec.json.Decoder(OutcomesMessage)


def encode_outcomes(
    group: str, rows: Iterable[tuple[str, int, int, int | None, str | AcknowledgeType]]
) -> list[bytes]:
    """Encode outcome rows as messages of ranges of equal outcome.

    Args:
        group: the share group.
        rows: ``(topic, partition, offset, delivery_count or None, outcome)``; the outcome is a
            name (``"ACCEPT"``, ``"RELEASE"``, ``"REJECT"``, any case) or an AcknowledgeType.

    Returns:
        The encoded messages (empty when there are no rows).

    Raises:
        ConfigurationError: an outcome is not ACCEPT, RELEASE or REJECT (nothing is encoded).
    """
    parsed: list[tuple[str, int, int, int, int]] = []
    for topic, partition, offset, count, outcome in rows:
        parsed.append(
            (str(topic), int(partition), int(offset), int(count or 0), int(_kind(outcome)))
        )
    parsed.sort()
    ranges: list[OutcomeRange] = []
    for topic, partition, offset, count, kind in parsed:
        prev = ranges[-1] if ranges else None
        if (
            prev is not None
            and (prev.topic, prev.partition, prev.delivery_count, prev.outcome)
            == (topic, partition, count, kind)
            and prev.last + 1 == offset
        ):
            ranges[-1] = OutcomeRange(topic, partition, prev.first, offset, count, kind)
        elif prev is None or (prev.topic, prev.partition, prev.last) != (topic, partition, offset):
            ranges.append(OutcomeRange(topic, partition, offset, offset, count, kind))
        # else: the same offset twice in a row; the first one wins
    return [
        msgspec.json.encode(
            OutcomesMessage(group=group, ranges=ranges[i : i + _RANGES_PER_MESSAGE])
        )
        for i in range(0, len(ranges), _RANGES_PER_MESSAGE)
    ]


def decode_outcomes(data: bytes) -> OutcomesMessage | None:
    """Decode a message of the outcomes topic; None (logged) if it is not one."""
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("spark_outcomes_undecodable", error=str(exc), size=len(data))
        return None


def _kind(outcome: str | AcknowledgeType) -> AcknowledgeType:
    if isinstance(outcome, AcknowledgeType) and outcome in OUTCOME_NAMES.values():
        return outcome
    kind = OUTCOME_NAMES.get(str(outcome).strip().upper())
    if kind is None:
        raise ConfigurationError(
            f"outcome {outcome!r} is not allowed; use 'ACCEPT', 'RELEASE', 'REJECT' or null "
            "(null: the default, ACCEPT)"
        )
    return kind


def _run(coro: Awaitable[T]) -> T:
    """Run ``coro`` to completion from synchronous code, also when a loop is running here."""

    async def main() -> T:
        return await coro

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = asyncio.run(main())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="queueflow-spark-outcomes")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    result: T = box["result"]
    return result


async def _publish(conn: ConnectionOptions, messages: list[bytes]) -> None:
    kafka = conn.kafka_config("queueflow-spark-outcomes")
    topic = outcomes_topic(conn.app_id)
    await ensure_topic(kafka, topic, 1, CONTROL_TOPIC_CONFIG)
    producer = AIOKafkaProducer(**kafka.client_kwargs(), acks="all")
    await producer.start()
    try:
        key = conn.group.encode()
        for message in messages:
            await producer.send_and_wait(topic, message, key=key, partition=0)
    finally:
        await producer.stop()


class Outcomes:
    """Records per-row outcomes for the group of a ``queueflow`` source.

    Args:
        options: the source's options (only ``bootstrap.servers``, ``app.id``, ``group`` and
            ``kafka.*`` are used).

    Raises:
        ConfigurationError: an option is missing or invalid.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = parse_connection_options(options)

    def acknowledge(self, df: Any, outcome_col: str = "outcome") -> int:
        """Record the outcomes of the rows of ``df`` (see :func:`acknowledge`)."""
        from pyspark.sql import functions as F

        columns = set(df.columns)
        missing = [c for c in ("topic", "partition", "offset", outcome_col) if c not in columns]
        if missing:
            raise ConfigurationError(
                f"acknowledge(): the DataFrame has no column(s) {missing}; it needs topic, "
                f"partition, offset and the outcome column {outcome_col!r} (columns: "
                f"{sorted(columns)})"
            )
        count = F.col("delivery_count") if "delivery_count" in columns else F.lit(None).cast("int")
        rows = (
            df.where(F.col(outcome_col).isNotNull())
            .select("topic", "partition", "offset", count.alias("dc"), outcome_col)
            .collect()
        )
        return self.record([(r[0], r[1], r[2], r[3], r[4]) for r in rows])

    def record(
        self, rows: Iterable[tuple[str, int, int, int | None, str | AcknowledgeType]]
    ) -> int:
        """Record outcomes given as ``(topic, partition, offset, delivery_count, outcome)``
        rows (``delivery_count`` None for any delivery); returns how many rows there were.

        Raises:
            ConfigurationError: an outcome is not ACCEPT, RELEASE or REJECT.
            aiokafka.errors.KafkaError: the outcomes could not be written.
        """
        rows = list(rows)
        messages = encode_outcomes(self.options.group, rows)
        if messages:
            _run(_publish(self.options, messages))
        return len(rows)


def acknowledge(df: Any, outcome_col: str = "outcome", *, options: Mapping[str, Any]) -> int:
    """Record per-row outcomes of a ``queueflow`` micro-batch, from ``foreachBatch``.

    Rows whose outcome is null keep the default (ACCEPT once Spark commits the batch). Call it
    before ``foreachBatch`` returns: the source acknowledges the batch after Spark commits it,
    and only outcomes written by then count. Outcomes for records the source no longer holds
    (another run's, or whose lock expired) are ignored.

    Args:
        df: a DataFrame with columns ``topic`` (string), ``partition`` (int), ``offset``
            (long), the outcome column, and ideally ``delivery_count`` (int, as the source
            gives it; without it an outcome applies to whichever delivery is held).
        outcome_col: the column holding ``"ACCEPT"``, ``"RELEASE"``, ``"REJECT"`` (any case) or
            null.
        options: the source's options (``bootstrap.servers``, ``app.id``, ``group``,
            ``kafka.*``).

    Returns:
        The number of rows with an outcome.

    Raises:
        ConfigurationError: an option is missing or invalid, a column is missing, or an
            outcome is not one of the three.
        aiokafka.errors.KafkaError: the outcomes could not be written (the batch's records
            are then ACCEPTed by default; fail the batch to have them delivered again).
    """
    return Outcomes(options).acknowledge(df, outcome_col)


class OutcomeReader:
    """Reads the outcomes topic for one group, from its end at :meth:`start` on (runner side).

    Args:
        kafka: the cluster.
        app_id: the queueflow app id.
        group: the share group.
    """

    def __init__(self, kafka: KafkaClientConfig, app_id: str, group: str) -> None:
        self.kafka = kafka
        self.topic = outcomes_topic(app_id)
        self.group = group
        self._tp = KafkaTopicPartition(self.topic, 0)
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Create the topic if needed and start reading at its current end."""
        await ensure_topic(self.kafka, self.topic, 1, CONTROL_TOPIC_CONFIG)
        consumer = AIOKafkaConsumer(
            **self.kafka.client_kwargs("queueflow-spark-outcomes"),
            enable_auto_commit=False,
            fetch_max_wait_ms=50,
        )
        await consumer.start()
        consumer.assign([self._tp])
        await consumer.seek_to_end(self._tp)
        await consumer.position(self._tp)  # resolve the end now: later writes are read
        self._consumer = consumer

    async def read_to_end(self, timeout_ms: int) -> list[OutcomeRange]:
        """Every outcome range of this group written since the last call, up to the topic's
        current end.

        Raises:
            TimeoutError: the end was not reached within ``timeout_ms``.
        """
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("OutcomeReader.start() was not called")
        end = (await consumer.end_offsets([self._tp]))[self._tp]
        out: list[OutcomeRange] = []
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        while await consumer.position(self._tp) < end:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(
                    f"could not read {self.topic} up to offset {end} within {timeout_ms} ms"
                )
            batch = await consumer.getmany(self._tp, timeout_ms=200)
            for message in batch.get(self._tp, []):
                if message.key != self.group.encode() or message.value is None:
                    continue
                decoded = decode_outcomes(message.value)
                if decoded is not None and decoded.group == self.group:
                    out.extend(decoded.ranges)
        return out

    async def close(self) -> None:
        """Stop reading."""
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
