"""A Spark query and a Faust share agent, members of one share group at the same time.

KIP-932: any number of members, of any kind, share a group's share-partitions. Here the two
kinds queueflow has outside plain ``ShareConsumer`` scripts meet in the group ``mixed``:

* a real ``faust worker`` (role ``all``: it hosts the app's share-partition leaders and its
  share-group coordinator) running ``tests/spark/mixed_agent_app.py``, a ``@app.share_agent``
  that logs every delivery to a ledger file and ACCEPTs, about 100 records/s;
* a Spark streaming query (``format("queueflow")``, same app id, group and topic) whose
  ``foreachBatch`` collects the records on the driver.

The test pins down that both get records of the 2-partition topic, that between them they see
every record exactly once (no record is lost, none is processed twice, every delivery is the
first one: nothing failed, so nothing is released or expires), and that the coordinator gives
each of the two members one of the two partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from queueflow.testing import WorkerProcess, faust_worker_argv
from queueflow.testing import produce as produce_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 400
TIMEOUT_S = 120.0  # the whole flow, from the worker's start to the last record


class Deadline:
    """One deadline for the whole flow; ``check`` fails the test with ``what`` once it passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(self.at - time.monotonic(), 0.0)

    def check(self, what: str, worker: WorkerProcess) -> None:
        assert time.monotonic() < self.at, (
            f"timed out after {self.seconds} s waiting for {what}; worker log:\n{worker.log_tail()}"
        )


class Collected:
    """The Spark side's ``foreachBatch``: ``(i, partition, delivery_count)`` of every row (it
    runs on the driver, in this process)."""

    def __init__(self) -> None:
        self._rows: list[tuple[int, int, int]] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        i = F.get_json_object(F.col("value").cast("string"), "$.i").cast("int")
        rows = df.select(i.alias("i"), "partition", "delivery_count").collect()
        with self._lock:
            self._rows += [(r.i, r.partition, r.delivery_count) for r in rows]

    @property
    def rows(self) -> list[tuple[int, int, int]]:
        with self._lock:
            return list(self._rows)


def read_ledger(ledger: Path) -> list[tuple[int, int, int]]:
    """The agent's ``(i, partition, delivery_count)`` per delivery (complete lines only)."""
    if not ledger.exists():
        return []
    lines = ledger.read_text().split("\n")[:-1]  # the last one may be half written
    return [(e["i"], e["partition"], e["delivery_count"]) for e in map(json.loads, lines)]


def agent_partitions(worker: WorkerProcess, topic: str) -> list[int]:
    """The agent's latest assignment in the group ``mixed`` (its member's ``assignment``
    event), as partitions of ``topic``."""
    assignments = [e for e in worker.events("assignment") if e.get("group") == "mixed"]
    if not assignments:
        return []
    return sorted(p for t, p in assignments[-1]["assignment"] if t == topic)


def test_a_spark_query_and_a_faust_share_agent_share_one_group(
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """KIP-932: any number of members, of any kind, share a group's share-partitions. A Spark
    query and a Faust share agent in the group ``mixed`` get one partition each and process
    every record exactly once between them (delivery_count 1 everywhere)."""
    started = time.monotonic()
    phases: dict[str, float] = {}  # seconds since the start, printed for the record

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - started, 1)

    deadline = Deadline(TIMEOUT_S)
    topic = topic_factory(2, prefix="mixed")
    app_id = f"qf-mixed-{topic.rsplit('-', 1)[-1]}"
    ledger = tmp_path / "ledger.jsonl"
    env = {
        "AGENT_APP_ID": app_id,
        "AGENT_TOPIC": topic,
        "AGENT_BROKER": f"kafka://{kafka_bootstrap}",
        "AGENT_LEDGER": str(ledger),
    }
    argv = faust_worker_argv("tests.spark.mixed_agent_app", tmp_path / "data")
    worker = WorkerProcess(argv, tmp_path / "worker.log", env, cwd=ROOT)
    collected = Collected()
    query: Any = None
    worker.start()
    assert worker.process is not None
    try:
        # The SparkSession (session-scoped) is built while the worker starts, not before.
        spark = request.getfixturevalue("spark")
        phase("spark")
        worker.wait_ready(deadline.remaining(), what="the share-agent worker")
        phase("worker ready")

        def wait(done: Callable[[], bool], what: str) -> None:
            """Poll ``done()`` every 0.2 s (ticking on the query's termination, or the worker's
            exit before the query runs) until it holds; fail fast if either of them ends."""
            while not done():
                if query is not None:
                    if query.awaitTermination(0.2):
                        raise AssertionError(f"the query ended: {what}: {query.exception()}")
                else:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        worker.process.wait(timeout=0.2)
                assert worker.alive(), f"the worker exited: {what}:\n{worker.log_tail()}"
                deadline.check(what, worker)

        # The agent joins first and, alone in the group, gets both partitions.
        wait(lambda: len(agent_partitions(worker, topic)) == 2, "the agent to join the group")
        phase("agent joined")
        options = {
            "bootstrap.servers": kafka_bootstrap,
            "app.id": app_id,
            "group": "mixed",
            "topic": topic,
            "maxRecordsPerTrigger": "50",
            "pollTimeoutMs": "500",
        }
        query = (
            spark.readStream.format("queueflow")
            .options(**options)
            .load()
            .writeStream.foreachBatch(collected)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

        # The query joins the group on its first trigger and gets one of the agent's two
        # partitions in its join response; the agent hears so on its next heartbeat (0.5 s).
        # Only then are the records produced: produced earlier, the agent, alone in the group
        # until the query joins, would take records of both partitions, and which member got
        # which partition would depend on timing. (Hence also the agent first: a query that
        # joined first would keep fetching from both partitions until its own next heartbeat,
        # 5 s by default.) From then on the assignment is fixed (2 members, 2 partitions: one
        # each, sticky), so the exact partition split asserted below is not a race.
        wait(lambda: len(agent_partitions(worker, topic)) == 1, "the query to join the group")
        phase("query joined")
        (agent_partition,) = agent_partitions(worker, topic)
        values = [json.dumps({"i": i}) for i in range(RECORDS)]
        produce_timeout = max(deadline.remaining(), 1.0)
        asyncio.run(
            produce_records(kafka_bootstrap, topic, values, partitions=2, timeout_s=produce_timeout)
        )  # record i goes to partition i % 2

        def everything_seen() -> bool:
            seen = {i for i, _, _ in collected.rows} | {i for i, _, _ in read_ledger(ledger)}
            return len(seen) >= RECORDS

        wait(everything_seen, f"all {RECORDS} records")
        phase("all seen")
    finally:
        if query is not None:
            query.stop()
        worker.stop(timeout_s=60)  # SIGTERM: the agent drains and leaves the group
    phase("stopped")

    spark_rows, agent_rows = collected.rows, read_ledger(ledger)  # final: nothing runs any more
    spark_ids, agent_ids = [i for i, _, _ in spark_rows], [i for i, _, _ in agent_rows]
    print(
        f"\n{RECORDS} records: Spark {len(spark_ids)}, agent {len(agent_ids)} "
        f"(agent partition {agent_partition}); at seconds {phases}"
    )
    assert spark_ids and agent_ids, (len(spark_ids), len(agent_ids))
    counts = Counter(spark_ids + agent_ids)
    assert set(counts) == set(range(RECORDS)), "records lost (or unknown ones seen)"
    assert [i for i, n in counts.items() if n > 1] == [], "records processed twice"
    assert {d for _, _, d in spark_rows + agent_rows} == {1}, "a record was delivered again"
    # One partition each: the agent kept the partition it was left with, the query the other.
    assert {p for _, p, _ in agent_rows} == {agent_partition}
    assert {p for _, p, _ in spark_rows} == {1 - agent_partition}
    assert sorted(agent_ids) == list(range(agent_partition, RECORDS, 2))
    assert worker.events("share_agent_drained"), worker.log_tail()
