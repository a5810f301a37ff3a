"""``df.write.format("queueflow")`` and ``df.writeStream.format("queueflow")`` against the real
broker: every row becomes one record with its key, value and headers plus a stable idempotency
key; a replayed micro-batch produces the same keys again; bad columns and options are refused
with messages that name them."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from queueflow.errors import ConfigurationError
from queueflow.kafka.options import KafkaOptions
from queueflow.spark.sink import (
    IDEMPOTENCY_HEADER,
    idempotency_key,
    make_stream_writer,
    make_writer,
)

WAIT_S = 60.0
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture(scope="module")
def session(spark: Any) -> Any:
    """The session's SparkSession (queueflow's formats registered by the fixture)."""
    return spark


async def _read_all(bootstrap: str, topic: str, partitions: int = 1) -> list[Any]:
    """Every record of ``topic`` up to its end offsets now, partition by partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records: list[Any] = []

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in tps])

        async def drain() -> None:
            while await behind():
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)

        await asyncio.wait_for(drain(), WAIT_S)
        return records
    finally:
        await consumer.stop()


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


def _headers(record: Any) -> dict[str, bytes]:
    return dict(record.headers)


def test_batch_write_enqueues_every_row_once_with_a_unique_key(
    session: Any, kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(2)
    n = 200
    df = session.range(0, n, numPartitions=2).selectExpr(
        "CASE WHEN id = 0 THEN NULL ELSE CAST(id AS STRING) END AS key",  # null: no key
        "CAST(concat('job-', id) AS BINARY) AS value",
        "array(named_struct('key', 'source', 'value', CAST('spark' AS BINARY))) AS headers",
        "id AS ignored",
    )
    (
        df.write.format("queueflow")
        .option("bootstrap.servers", kafka_bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    records = asyncio.run(_read_all(kafka_bootstrap, topic, partitions=2))
    assert len(records) == n
    assert sorted(r.value for r in records) == sorted(f"job-{i}".encode() for i in range(n))
    assert all(r.value == b"job-" + (r.key or b"0") for r in records)
    assert [r.key for r in records].count(None) == 1
    assert all(_headers(r)["source"] == b"spark" for r in records)
    keys = [idempotency_key(r) for r in records]
    assert len(set(keys)) == n
    # <job id>/<partition id>/<row index>: one job id, 2 Spark partitions, rows 0.. in each.
    parsed = [re.fullmatch(rf"({UUID})/(\d+)/(\d+)", k or "") for k in keys]
    assert all(parsed), keys[:3]
    assert len({m.group(1) for m in parsed if m}) == 1
    per_partition = Counter(int(m.group(2)) for m in parsed if m)
    assert sorted(per_partition) == [0, 1] and sum(per_partition.values()) == n
    for pid, count in per_partition.items():
        rows = sorted(int(m.group(3)) for m in parsed if m and int(m.group(2)) == pid)
        assert rows == list(range(count))


def _stream(
    session: Any, source: Path, checkpoint: Path, bootstrap: str, topic: str | None = None
) -> Any:
    df = session.readStream.format("json").schema("k string, v string, t string").load(str(source))
    out = df.selectExpr("k AS key", "v AS value", "t AS topic")
    writer = (
        out.writeStream.format("queueflow")
        .option("bootstrap.servers", bootstrap)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if topic is not None:
        writer = writer.option("topic", topic)
    query = writer.start()
    assert query.awaitTermination(WAIT_S), "the streaming query did not finish"
    assert query.exception() is None, query.exception()
    return query


def test_stream_write_and_a_replayed_batch_carry_the_same_keys(
    session: Any, kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    n = 30
    with (source / "part-0.json").open("w") as f:
        for i in range(n):  # the topic comes from the column this time
            f.write(json.dumps({"k": f"k{i}", "v": f"value {i}", "t": topic}) + "\n")

    query = _stream(session, source, checkpoint, kafka_bootstrap)
    first = asyncio.run(_read_all(kafka_bootstrap, topic))
    assert sorted(r.value for r in first) == sorted(f"value {i}".encode() for i in range(n))
    keys = {idempotency_key(r): (r.key, r.value) for r in first}
    assert len(keys) == n
    # <query id>/<batch id>/<partition id>/<row index>, the query id Spark keeps in the
    # checkpoint.
    assert all(re.fullmatch(rf"{query.id}/0/\d+/\d+", k or "") for k in keys), list(keys)[:3]

    # A crash after the batch was written but before Spark recorded its commit: the restarted
    # query replays batch 0 with the same id, so the same rows get the same keys.
    for name in ("0", ".0.crc"):
        path = checkpoint / "commits" / name
        if path.exists():
            path.unlink()
    replay = _stream(session, source, checkpoint, kafka_bootstrap)
    assert replay.id == query.id
    both = asyncio.run(_read_all(kafka_bootstrap, topic))
    assert len(both) == 2 * n
    again = {idempotency_key(r): (r.key, r.value) for r in both[n:]}
    assert again == keys


def _schema(*fields: tuple[str, Any]) -> StructType:
    return StructType([StructField(name, t) for name, t in fields])


HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


@pytest.mark.parametrize(
    ("options", "schema", "overwrite", "message"),
    [
        ({"topic": "t"}, _schema(("value", StringType())), False, "'bootstrap.servers'"),
        ({}, _schema(("value", StringType())), False, "no topic: set the 'topic' option"),
        ({"topic": "t"}, _schema(("payload", StringType())), False, "no 'value' column"),
        ({"topic": "t"}, _schema(("value", IntegerType())), False, "column 'value' is int"),
        (
            {"topic": "t"},
            _schema(("value", StringType()), ("key", LongType())),
            False,
            "column 'key' is bigint",
        ),
        (
            {"topic": "t"},
            _schema(("value", StringType()), ("headers", ArrayType(StringType()))),
            False,
            "array<struct<key:string,value:binary>>",
        ),
        (
            {},
            _schema(("value", StringType()), ("topic", IntegerType())),
            False,
            "column 'topic' is int",
        ),
        (
            {"topic": "t"},
            _schema(("value", StringType()), ("partition", StringType())),
            False,
            "column 'partition' is string",
        ),
        ({"topic": "t"}, _schema(("value", StringType())), True, "only appends"),
        (
            {"topic": "t", "kafka.linger.ms": "5"},
            _schema(("value", StringType())),
            False,
            "'kafka.linger.ms'='5' is not a supported Kafka client setting",
        ),
        (
            {"topic": "t", "kafka.security.protocol": "tls"},
            _schema(("value", StringType())),
            False,
            "'kafka.security.protocol'='TLS' is not one of",
        ),
    ],
)
def test_bad_columns_and_options_are_named(
    options: dict[str, str], schema: StructType, overwrite: bool, message: str
) -> None:
    opts = {"bootstrap.servers": "localhost:9092", **options}
    if "'bootstrap.servers'" in message:
        opts.pop("bootstrap.servers")
    for make in (make_writer, make_stream_writer):
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            make(opts, schema, overwrite)


def test_valid_schema_and_security_options_are_accepted() -> None:
    schema = _schema(
        ("key", BinaryType()),
        ("value", BinaryType()),
        ("headers", HEADERS),
        ("topic", StringType()),
        ("partition", IntegerType()),
    )
    writer = make_writer(
        {
            "Bootstrap.Servers": "kafka://a:9092;b:9092",
            "kafka.security.protocol": "sasl_plaintext",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.plain.username": "u",
            "kafka.sasl.plain.password": "p",
            "kafka.request.timeout.ms": "5000",
        },
        schema,
        False,
    )
    assert writer.kafka == KafkaOptions(
        "a:9092,b:9092",
        {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "u",
            "sasl_plain_password": "p",
            "request_timeout_ms": 5000,
        },
    )
    kwargs = writer.kafka.client_config("c").client_kwargs()
    assert kwargs["bootstrap_servers"] == "a:9092,b:9092" and kwargs["client_id"] == "c"
    assert "ssl_context" not in kwargs


def test_errors_reach_the_user_through_spark(
    session: Any, kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    df = session.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="no 'value' column"):
        session.range(3).write.format("queueflow").option(
            "bootstrap.servers", kafka_bootstrap
        ).option("topic", "t").mode("append").save()
    missing = f"qf-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=rf"unknown topic '{missing}' \(from the option 'topic'\)"):
        df.write.format("queueflow").option("bootstrap.servers", kafka_bootstrap).option(
            "topic", missing
        ).mode("append").save()
    assert missing not in asyncio.run(_topics(kafka_bootstrap))  # not auto-created
    topic = topic_factory(1)
    bad_partition = df.selectExpr("value", "7 AS partition")
    with pytest.raises(Exception, match=r"column 'partition' is 7 .* has partitions 0\.\.0"):
        bad_partition.write.format("queueflow").option("bootstrap.servers", kafka_bootstrap).option(
            "topic", topic
        ).mode("append").save()


def test_idempotency_key_of_a_share_record() -> None:
    from queueflow import ShareRecord

    record = ShareRecord("t", 0, 5, None, b"v", [(IDEMPOTENCY_HEADER, b"q/1/0/3")], 0, 1)
    assert idempotency_key(record) == "q/1/0/3"
    assert idempotency_key(ShareRecord("t", 0, 6, None, b"v", [], 0, 1)) is None
