"""``spark.readStream.format("queueflow")`` end to end: local[2] Spark, the real local broker, and
one ``queueflow leader`` worker for the module (it leads every topic the module uses).

The batches are collected with ``foreachBatch``, which runs in this process (the driver), so the
tests see exactly which rows each micro-batch held. Waits are on conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from queueflow import ACCEPT, ShareConsumer, ShareRecord
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

LOCK_MS = 3000
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": LOCK_MS,
    "group.share.delivery.count.limit": 5,
    "group.share.session.timeout.ms": 15000,
    "queueflow.lock.check.interval.ms": 100,
}
TOPICS = {"batches": 1, "outcomes": 1, "split": 1, "mixed": 2, "crash": 1, "long": 1}
WAIT_S = 60.0


@pytest.fixture(scope="module")
def topics(kafka_bootstrap: str) -> dict[str, str]:
    """The module's source topics, created before the leader starts (it leads them all)."""
    from queueflow.devtools.broker import create_topic

    names = {key: f"qf-spark-{key}-{uuid.uuid4().hex[:8]}" for key in TOPICS}
    for key, name in names.items():
        create_topic(kafka_bootstrap, name, TOPICS[key])
    return names


@pytest.fixture(scope="module")
def leader(
    kafka_bootstrap: str, topics: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LeaderWorker]:
    worker = LeaderWorker(
        f"qf-spark-{uuid.uuid4().hex[:8]}",
        list(topics.values()),
        kafka_bootstrap,
        tmp_path_factory.mktemp("leader") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield worker


def produce(bootstrap: str, topic: str, values: list[str], partitions: int = 1) -> None:
    asyncio.run(produce_records(bootstrap, topic, values, partitions=partitions))


def options(bootstrap: str, leader: LeaderWorker, topic: str, group: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "app.id": leader.app_id,
        "group": group,
        "topic": topic,
        "lockDurationMs": str(LOCK_MS),
        "pollTimeoutMs": "1500",
    }


def stream(spark: Any, opts: dict[str, str]) -> Any:
    return spark.readStream.format("queueflow").options(**opts).load()


class Collector:
    """A ``foreachBatch`` function that keeps each batch's rows (it runs on the driver, here)."""

    def __init__(self, on_batch: Callable[[Any, int], None] | None = None) -> None:
        self.batches: list[tuple[int, list[Any]]] = []
        self.partitions: dict[int, int] = {}
        self.on_batch = on_batch
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        rows = (
            df.select(
                "topic",
                "partition",
                "offset",
                F.col("value").cast("string").alias("value"),
                "delivery_count",
                F.spark_partition_id().alias("task"),
            )
            .orderBy("topic", "partition", "offset")
            .collect()
        )
        if self.on_batch is not None:
            self.on_batch(df, batch_id)
        with self._lock:
            self.batches.append((batch_id, rows))
            self.partitions[batch_id] = df.rdd.getNumPartitions()

    @property
    def rows(self) -> list[Any]:
        with self._lock:
            return [row for _, rows in self.batches for row in rows]

    def values(self, delivery_count: int | None = None) -> list[str]:
        return [
            r.value
            for r in self.rows
            if delivery_count is None or r.delivery_count == delivery_count
        ]


def start(df: Any, collector: Collector, checkpoint: Path, available_now: bool) -> Any:
    writer = df.writeStream.foreachBatch(collector).option("checkpointLocation", str(checkpoint))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="200 milliseconds")
    return writer.start()


def run_available_now(df: Any, collector: Collector, checkpoint: Path) -> None:
    query = start(df, collector, checkpoint, available_now=True)
    try:
        assert query.awaitTermination(WAIT_S), "the availableNow query did not finish in time"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()


def wait_until(query: Any, done: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Wait (ticking on the query's own termination) until ``done()``; fail on the query's
    error or the deadline."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if query.awaitTermination(0.2):
            raise AssertionError(f"the query ended while waiting for {what}: {query.exception()}")
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"


def test_batches_hold_exactly_the_acquired_rows_and_availablenow_acknowledges_its_last(
    spark: Any, kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker, tmp_path: Path
) -> None:
    """maxRecordsPerTrigger caps each batch; every record arrives once. availableNow ends with
    one more latestOffset after its last batch is committed, which ACCEPTs that batch: the
    next run gets only new records, none delivered a second time."""
    topic, total, cap = topics["batches"], 30, 7
    values = [f"b-{i}" for i in range(total)]
    produce(kafka_bootstrap, topic, values)
    opts = {**options(kafka_bootstrap, leader, topic, "batches"), "maxRecordsPerTrigger": str(cap)}
    first = Collector()
    started = time.monotonic()
    run_available_now(stream(spark, opts), first, tmp_path / "ckpt")
    elapsed = time.monotonic() - started

    sizes = [len(rows) for _, rows in first.batches]
    assert sizes == [7, 7, 7, 7, 2], sizes
    assert sorted(first.values()) == sorted(values), "missing or duplicated records"
    assert set(first.values(1)) == set(values)
    assert [b for b, _ in first.batches] == list(range(len(first.batches)))

    # The next run (same checkpoint, a new member): only the new records.
    more = [f"b-more-{i}" for i in range(5)]
    produce(kafka_bootstrap, topic, more)
    second = Collector()
    query = start(stream(spark, opts), second, tmp_path / "ckpt", available_now=False)
    try:
        wait_until(query, lambda: set(second.values()) >= set(more), "the new records")
    finally:
        query.stop()
    assert sorted(second.values()) == sorted(more)
    assert second.values(1) == second.values()
    assert second.batches[0][0] == len(first.batches)  # batch ids go on from the checkpoint
    print(f"\n{total} records in {len(sizes)} batches {sizes} in {elapsed:.1f} s")


def test_release_and_reject_chosen_rows(
    spark: Any, kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker, tmp_path: Path
) -> None:
    """Outcomes recorded in foreachBatch: RELEASEd rows come back with delivery_count 2,
    REJECTed ones never, the rest are ACCEPTed."""
    from pyspark.sql import functions as F

    import queueflow.spark

    topic = topics["outcomes"]
    values = [f"o-{i}" for i in range(20)]
    released, rejected = {"o-3", "o-4", "o-11"}, {"o-5", "o-17"}
    produce(kafka_bootstrap, topic, values)
    opts = options(kafka_bootstrap, leader, topic, "outcomes")

    def decide(df: Any, batch_id: int) -> None:
        value = F.col("value").cast("string")
        outcome = (
            F.when(value.isin(*rejected), "REJECT")
            .when(value.isin(*released) & (F.col("delivery_count") == 1), "RELEASE")
            .otherwise(F.lit(None))
        )
        queueflow.spark.acknowledge(df.withColumn("outcome", outcome), "outcome", options=opts)

    collector = Collector(on_batch=decide)
    query = start(stream(spark, opts), collector, tmp_path / "ckpt", available_now=False)
    try:
        wait_until(
            query,
            lambda: (
                set(collector.values(2)) >= released and set(collector.values(1)) >= set(values)
            ),
            "the released rows to come back",
        )
        # One more batch boundary: a sentinel acquired after the redeliveries were ACCEPTed.
        produce(kafka_bootstrap, topic, ["o-sentinel"])
        wait_until(query, lambda: "o-sentinel" in collector.values(), "the sentinel")
    finally:
        query.stop()
    counts = Counter((r.value, r.delivery_count) for r in collector.rows)
    assert {v for v, c in counts if c == 1} == set(values) | {"o-sentinel"}
    assert {v for v, c in counts if c == 2} == released
    assert all(n == 1 for n in counts.values()), counts
    assert not any(c > 1 for v, c in counts if v in rejected)


def test_min_partitions_splits_one_kafka_partition_into_disjoint_tasks(
    spark: Any, kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker, tmp_path: Path
) -> None:
    topic = topics["split"]
    values = [f"s-{i}" for i in range(40)]
    produce(kafka_bootstrap, topic, values)
    opts = {
        **options(kafka_bootstrap, leader, topic, "split"),
        "minPartitions": "4",
        "maxRecordsPerTrigger": "40",
    }
    collector = Collector()
    run_available_now(stream(spark, opts), collector, tmp_path / "ckpt")
    assert sorted(collector.values()) == sorted(values)
    for batch_id, rows in collector.batches:
        if len(rows) >= 4:
            assert collector.partitions[batch_id] == 4
            spans = sorted(
                (
                    min(r.offset for r in rows if r.task == t),
                    max(r.offset for r in rows if r.task == t),
                )
                for t in {r.task for r in rows}
            )
            assert len(spans) == 4
            assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), spans
    assert max(len(rows) for _, rows in collector.batches) >= 4


def test_spark_and_a_share_consumer_share_one_group(
    spark: Any, kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker, tmp_path: Path
) -> None:
    """A Spark query and a plain ShareConsumer in one group: every record processed once."""
    topic, total = topics["mixed"], 200
    values = [f"m-{i}" for i in range(total)]
    produce(kafka_bootstrap, topic, values, partitions=2)
    opts = {**options(kafka_bootstrap, leader, topic, "mixed"), "maxRecordsPerTrigger": "10"}
    consumed: list[ShareRecord] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        async def main() -> None:
            member = ShareConsumer(
                "mixed",
                app_id=leader.app_id,
                bootstrap_servers=kafka_bootstrap,
                acknowledgement_mode="explicit",
                max_poll_records=10,
            )
            await member.subscribe([topic])
            while not stop.is_set():
                for record in await member.poll(timeout_ms=200):
                    consumed.append(record)
                    member.acknowledge(record, ACCEPT)
                    await asyncio.sleep(0.01)  # some work per record, so Spark gets a share
            await member.commit_sync()
            await member.close()

        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    collector = Collector()
    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    query = start(stream(spark, opts), collector, tmp_path / "ckpt", available_now=False)
    try:

        def all_seen() -> bool:
            assert not errors, errors
            seen = collector.values() + [r.value.decode() for r in consumed]
            return set(values) <= set(seen)

        wait_until(query, all_seen, "every record")
        stop.set()
        thread.join(30)
        # A sentinel starts one more Spark batch, whose latestOffset ACCEPTs the earlier ones.
        produce(kafka_bootstrap, topic, ["m-sentinel"], partitions=1)
        wait_until(query, lambda: "m-sentinel" in collector.values(), "the sentinel")
    finally:
        stop.set()
        query.stop()
    assert not errors, errors
    spark_values = collector.values()
    consumer_values = [r.value.decode() for r in consumed]
    seen = Counter(spark_values + consumer_values)
    assert set(values) <= set(seen)
    assert [v for v, n in seen.items() if n > 1] == []
    assert spark_values and consumer_values, (len(spark_values), len(consumer_values))

    # Whether the sentinel's own batch was ACCEPTed depends on whether Spark's next trigger
    # (its latestOffset) ran before query.stop(): if not, the sentinel comes back once its lock
    # expires, at delivery count 2. Nothing else may come back: every other record was
    # acknowledged earlier. A second sentinel, produced after the stop, marks the end.
    produce(kafka_bootstrap, topic, ["m-sentinel-2"], partitions=1)

    async def after() -> list[ShareRecord]:
        member = ShareConsumer("mixed", app_id=leader.app_id, bootstrap_servers=kafka_bootstrap)
        await member.subscribe([topic])
        got: list[ShareRecord] = []
        deadline = time.monotonic() + WAIT_S
        while not any(r.value == b"m-sentinel-2" for r in got):
            assert time.monotonic() < deadline, "the second sentinel did not arrive"
            got += await member.poll(timeout_ms=500)
        await member.close()
        return got

    # Both sentinels are on partition 0, the first one's lock (3 s) expires long before the
    # Spark member's session (15 s): if it is still unacknowledged, it precedes the second.
    returned = {r.value: r.delivery_count for r in asyncio.run(after())}
    assert returned in ({b"m-sentinel-2": 1}, {b"m-sentinel": 2, b"m-sentinel-2": 1}), returned


def test_a_batch_that_outlives_its_lock_keeps_its_records(
    spark: Any, kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker, tmp_path: Path
) -> None:
    """Batch 0 takes 2.5 lock durations (a ShareConsumer of the same group polls all that
    time, inside the batch): the runner RENEWs the batch's locks (KIP-1222, every
    ``renewIntervalMs``, a third of the lock by default), so the consumer gets none of its
    records, and every record is handled once, at delivery count 1."""
    topic, total, cap = topics["long"], 10, 5
    values = [f"l-{i}" for i in range(total)]
    produce(kafka_bootstrap, topic, values)
    opts = {**options(kafka_bootstrap, leader, topic, "long"), "maxRecordsPerTrigger": str(cap)}
    competitor: list[ShareRecord] = []

    def compete(df: Any, batch_id: int) -> None:
        if batch_id != 0:
            return

        async def main() -> None:
            member = ShareConsumer(
                "long",
                app_id=leader.app_id,
                bootstrap_servers=kafka_bootstrap,
                acknowledgement_mode="explicit",
            )
            await member.subscribe([topic])
            until = time.monotonic() + 2.5 * LOCK_MS / 1000
            while time.monotonic() < until:
                for record in await member.poll(timeout_ms=500):
                    competitor.append(record)
                    member.acknowledge(record, ACCEPT)
            await member.commit_sync()
            await member.close()

        asyncio.run(main())

    collector = Collector(on_batch=compete)
    query = start(stream(spark, opts), collector, tmp_path / "ckpt", available_now=False)
    try:

        def all_seen() -> bool:
            seen = collector.values() + [r.value.decode() for r in competitor]
            return set(values) <= set(seen)

        wait_until(query, all_seen, "every record")
    finally:
        query.stop()
    first = {r.value for r in collector.batches[0][1]}
    taken = [(r.value.decode(), r.delivery_count) for r in competitor]
    assert first and not first & {v for v, _ in taken}, (first, taken)
    seen = Counter(collector.values() + [v for v, _ in taken])
    assert [v for v, n in seen.items() if n > 1] == []
    assert {r.delivery_count for r in collector.rows} | {c for _, c in taken} == {1}


def test_restart_after_a_driver_crash_loses_nothing(
    spark: Any, kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker, tmp_path: Path
) -> None:
    """The driver dies while batch 2 runs (foreachBatch raises: the batch is in offsets/ but
    not in commits/, and the runner process is killed). The restart replays batch 2 from the
    coordinates in its offset, and the records come back once the dead runner's locks expire
    (delivery_count 2). Nothing is lost; the only duplicates are batch 2's."""
    topic, cap = topics["crash"], 10
    values = [f"c-{i}" for i in range(30)]
    produce(kafka_bootstrap, topic, values)
    opts = {**options(kafka_bootstrap, leader, topic, "crash"), "maxRecordsPerTrigger": str(cap)}
    checkpoint = tmp_path / "ckpt"

    def crash(df: Any, batch_id: int) -> None:
        if batch_id == 2:
            raise RuntimeError("simulated driver crash in batch 2")

    first = Collector(on_batch=crash)
    query = start(stream(spark, opts), first, checkpoint, available_now=False)
    try:
        with pytest.raises(Exception, match="simulated driver crash in batch 2"):
            query.awaitTermination(WAIT_S)
    finally:
        query.stop()
    assert [b for b, _ in first.batches] == [0, 1]  # batch 2 failed before it was collected
    assert (checkpoint / "offsets" / "2").exists() and not (checkpoint / "commits" / "2").exists()

    second = Collector()
    query = start(stream(spark, opts), second, checkpoint, available_now=False)
    try:
        wait_until(query, lambda: len(second.values(2)) >= cap, "batch 2's records to come back")
        wait_until(query, lambda: set(first.values()) | set(second.values()) >= set(values), "all")
    finally:
        query.stop()
    replay_id, replay = second.batches[0]
    assert replay_id == 2  # the same batch again, from the offset's coordinates
    uncommitted = {r.value for r in replay}
    assert len(uncommitted) == cap and {r.delivery_count for r in replay} == {1}
    assert set(first.values()) | set(second.values()) == set(values)  # nothing lost
    seen = Counter(first.values() + second.values())
    assert {v for v, n in seen.items() if n > 1} == uncommitted
    assert set(second.values(2)) == uncommitted


def test_bad_options_name_the_option(spark: Any, kafka_bootstrap: str, tmp_path: Path) -> None:
    """A wrong option fails the query with the ConfigurationError naming it (every option's
    checks: tests/spark/test_spark_source_units.py)."""
    bad = {
        "bootstrap.servers": kafka_bootstrap,
        "app.id": "x",
        "group": "g",
        "topic": "t",
        "maxRecordsPerTrigger": "lots",
    }
    with pytest.raises(Exception, match="maxRecordsPerTrigger") as info:
        query = start(stream(spark, bad), Collector(), tmp_path / "ckpt", available_now=True)
        try:
            query.awaitTermination(WAIT_S)
        finally:
            query.stop()
    assert "ConfigurationError" in str(info.value)
    assert "'lots' is not allowed; use an integer from 1" in str(info.value)


def test_unknown_topic_is_a_clear_error(
    spark: Any, kafka_bootstrap: str, leader: LeaderWorker, tmp_path: Path
) -> None:
    missing = f"qf-spark-missing-{uuid.uuid4().hex[:8]}"
    opts = options(kafka_bootstrap, leader, missing, "missing")
    query = start(stream(spark, opts), Collector(), tmp_path / "ckpt", available_now=True)
    try:
        query.awaitTermination(WAIT_S)
    except Exception as exc:
        message = str(exc)
    else:
        message = str(query.exception())
    finally:
        query.stop()
    assert f"unknown topic {missing!r}" in message, message
    assert "ConfigurationError" in message
