"""S8 Spark source throughput: the ``queueflow`` streaming source against Spark's
built-in Kafka source, on ONE Kafka partition, in the same run.

Workloads (one single-partition topic each, records of :data:`RECORD_BYTES` bytes):

* ``noop``: ``--s8-records`` records (default 100,000) into a ``foreachBatch`` that only
  materialises the batch (``batch.write.format("noop")``: every row read, nothing written; a
  ``foreachBatch`` that does nothing would read nothing, DataFrames being lazy);
* ``slow``: ``--s8-slow-records`` records (default 4,000) into a ``foreachBatch`` whose batch
  goes through ``mapInPandas`` sleeping :data:`SLOW_MS` ms per row, then the ``noop`` write.

Variants, each one streaming query with ``trigger(availableNow=True)`` and a fresh checkpoint
directory, 1, 2 and 4 Spark tasks (``--s8-tasks``):

* ``queueflow``: ``format("queueflow")``, ``minPartitions`` = tasks, ``maxRecordsPerTrigger``
  :data:`MAX_PER_TRIGGER`, a group of its own served by a ``queueflow leader`` (started here,
  ``share.auto.offset.reset=earliest``, ``group.share.partition.max.record.locks=10000``, the
  KIP-932 maximum: a share-partition never has more offsets in flight, so a batch from one
  partition holds at most 10,000 records);
* ``kafka``: ``format("kafka")``, ``startingOffsets=earliest``, ``maxOffsetsPerTrigger``
  :data:`MAX_PER_TRIGGER`; 1 task is the default (one task per Kafka partition), 2 and 4 use
  ``minPartitions`` = tasks. Offsets only: nothing is acknowledged or committed to Kafka.

Measurement: inside ``foreachBatch`` the batch's rows are counted by an ``Observation`` (a
JVM-side aggregate computed during the same pass) and the wall-clock time of the call's start
and end is kept. A variant's rate is its rows / (end of its last non-empty batch - start of its
first one): query start-up, the source's initialisation (for queueflow: joining the group) and
the discovery of the first batch's offsets are excluded; every later batch's offset discovery
(queueflow: acquisition and the acknowledgement of the previous batch), planning and commit
are included. Each Spark process first runs an unmeasured warm-up query (JIT, Python workers).

Spark runs in subprocesses (one SparkSession per process): one for the queueflow variants, then
(leader stopped) one for the built-in source, whose SparkSession is created with
``spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:<pyspark version>`` (Ivy, from
Maven Central; ``--s8-kafka-package`` names another coordinate, and the results then say the
versions differ). If that package can't be resolved, the built-in baseline is reported
unavailable (with Ivy's reason) and only the comparison is skipped. Both use ``local[4]``: 4
task slots, so 4 tasks run at once even on a 2-core machine (the slow work sleeps).

Targets, printed with the ratios and never asserted: queueflow >= 0.5x the built-in source at
equal parallelism (same task count; built-in 1 task = its default), and > 1.5x the built-in
source's default one task per partition when queueflow spreads the one partition over 2 or 4
tasks with the slow per-record work.

Run alone: ``python -m bench --scenarios S8 --out /tmp/s8.json``. The Spark side is
``python -m bench.scenario_s8 CONFIG.json OUT.json`` (run by :func:`scenario_s8`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.context import Context
from bench.harness import PYTHON, ROOT

__all__ = [
    "KAFKA_PACKAGE",
    "MAX_PER_TRIGGER",
    "RECORD_BYTES",
    "SLOW_MS",
    "TARGET_EQUAL",
    "TARGET_SPREAD",
    "kafka_package",
    "ratios",
    "scenario_s8",
    "spark_main",
]

#: Bytes per record ("small records").
RECORD_BYTES = 100
#: ``maxRecordsPerTrigger`` (queueflow) and ``maxOffsetsPerTrigger`` (built-in).
MAX_PER_TRIGGER = 20_000
#: Per-record work of the ``slow`` workload (ms).
SLOW_MS = 5.0
#: Records of the warm-up topic (one unmeasured query per Spark process).
WARMUP_RECORDS = 400
#: Spark task slots (``local[N]``).
SLOTS = 4
#: queueflow / built-in at equal parallelism, at least.
TARGET_EQUAL = 0.5
#: queueflow with N > 1 tasks / built-in with its one task per partition, slow work: more than.
TARGET_SPREAD = 1.5
#: Spark's Kafka connector, ``{version}`` = the installed pyspark's.
KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
#: Leader settings of the queueflow variants.
LEADER_SETTINGS: dict[str, int | str] = {
    "share.auto.offset.reset": "earliest",
    "group.share.partition.max.record.locks": 10_000,
}


def kafka_package(override: str | None = None) -> str:
    """The built-in source's Maven coordinate: ``override``, or the connector of the installed
    pyspark version."""
    if override:
        return override
    import pyspark

    return KAFKA_PACKAGE.format(version=pyspark.__version__)


# --------------------------------------------------------------------------------------------
# driver side (the bench process)
# --------------------------------------------------------------------------------------------


def scenario_s8(ctx: Context) -> dict[str, Any]:
    """Produce the topics, run the queueflow variants then the built-in ones (each set in its
    own Spark subprocess), and compute the ratios."""
    from queueflow.devtools.broker import create_topic
    from queueflow.testing import LeaderWorker

    args = ctx.args
    records = int(getattr(args, "s8_records", 100_000))
    slow_records = int(getattr(args, "s8_slow_records", 4_000))
    tasks = [int(n) for n in getattr(args, "s8_tasks", [1, 2, 4])]
    package = kafka_package(getattr(args, "s8_kafka_package", None))
    import pyspark

    out: dict[str, Any] = {
        "partitions": 1,
        "record_bytes": RECORD_BYTES,
        "records": {"noop": records, "slow": slow_records},
        "slow_ms_per_record": SLOW_MS,
        "max_per_trigger": MAX_PER_TRIGGER,
        "tasks": tasks,
        "spark_master": f"local[{SLOTS}]",
        "pyspark": pyspark.__version__,
        "kafka_package": package,
        "leader_settings": LEADER_SETTINGS,
        "measure": "rows / (end of the last non-empty foreachBatch - start of the first); "
        "query start-up and the first batch's offset discovery excluded",
    }
    topics = {w: ctx.uid(f"s8-{w}") for w in ("warmup", "noop", "slow")}
    sizes = {"warmup": WARMUP_RECORDS, "noop": records, "slow": slow_records}
    ctx.say(f"S8: producing {records:,} + {slow_records:,} records of {RECORD_BYTES} B ...")
    for work, topic in topics.items():
        create_topic(ctx.bootstrap, topic, 1)
        harness.produce(ctx.bootstrap, topic, sizes[work], RECORD_BYTES, 1)
    out["topics"] = topics
    s8_dir = ctx.run_dir / "s8"
    s8_dir.mkdir(parents=True, exist_ok=True)
    variants = [
        {"name": f"{source}-{work}-{n}", "source": source, "work": work, "tasks": n}
        for source in ("queueflow", "kafka")
        for work in ("noop", "slow")
        for n in tasks
    ]
    base = {"bootstrap": ctx.bootstrap, "topics": topics, "sizes": sizes, "dir": str(s8_dir)}

    app_id = ctx.uid("s8")
    leader = LeaderWorker(
        app_id,
        list(topics.values()),
        ctx.bootstrap,
        ctx.run_dir / "s8-leader-data",
        LEADER_SETTINGS,
        log_path=ctx.run_dir / "s8-leader.log",
    )
    ctx.say("S8: starting the queueflow leader ...")
    try:
        leader.start(timeout_s=90)
        ctx.say("S8: queueflow source, 1 Spark process (local[4]) ...")
        out["queueflow"] = run_spark(
            ctx,
            "queueflow",
            base
            | {"app_id": app_id, "variants": [v for v in variants if v["source"] == "queueflow"]},
            timeout_s=ctx.timeout(240.0, floor=120.0),
        )
    except Exception as exc:
        out["queueflow"] = {"error": repr(exc)[:600]}
    finally:
        leader.stop(timeout_s=10)
    ctx.say(f"S8: Spark's built-in Kafka source ({package}), 1 Spark process (local[4]) ...")
    out["kafka"] = run_spark(
        ctx,
        "kafka",
        base | {"package": package, "variants": [v for v in variants if v["source"] == "kafka"]},
        timeout_s=ctx.timeout(240.0, floor=120.0),
    )
    if out["kafka"].get("session_error"):
        out["baseline_unavailable"] = (
            f"Spark's built-in Kafka source could not be started with {package}: "
            + (out["kafka"].get("ivy") or out["kafka"]["session_error"])[:400]
        )
        ctx.say(f"S8: baseline unavailable, comparison skipped: {out['baseline_unavailable']}")
    elif package != kafka_package():
        out["baseline_note"] = (
            f"{package} is not the installed pyspark's version ({pyspark.__version__})"
        )
    out["ratios"] = [] if out.get("baseline_unavailable") else ratios(out, tasks)
    for side in ("queueflow", "kafka"):
        for name, r in out.get(side, {}).get("variants", {}).items():
            ctx.say(f"S8 {name}: {_rate_text(r)}")
    for r in out["ratios"]:
        ctx.say(f"S8 {r['label']}: {r['value']} (target {r['target']})")
    return out


def _rate_text(r: dict[str, Any]) -> str:
    if r.get("rate"):
        return (
            f"{r['rate']:,.0f} records/s ({r['records']} in {r['seconds']} s, "
            f"{r['batches']} batches, tasks/batch {r.get('tasks_per_batch')})"
            + (f" [{r['error']}]" if r.get("error") else "")
        )
    return f"n/a [{r.get('error', 'no result')}]"


def ratios(out: dict[str, Any], tasks: list[int]) -> list[dict[str, Any]]:
    """queueflow / built-in ratios: at equal parallelism (both works), and queueflow's N tasks
    vs the built-in source's one task per partition (slow work, N > 1: the spread target)."""
    qf = out.get("queueflow", {}).get("variants", {})
    kafka = out.get("kafka", {}).get("variants", {})

    def rate(side: dict[str, Any], name: str) -> float | None:
        value = side.get(name, {}).get("rate")
        return float(value) if value else None

    rows: list[dict[str, Any]] = []

    def add(label: str, num: float | None, den: float | None, target: str, kind: str) -> None:
        value = round(num / den, 3) if num and den else None
        rows.append({"label": label, "value": value, "target": target, "kind": kind})

    for work in ("noop", "slow"):
        for n in tasks:
            kafka_what = "1 task (default)" if n == 1 else f"minPartitions={n}"
            add(
                f"{work}: queueflow {n} task(s) / built-in {kafka_what}",
                rate(qf, f"queueflow-{work}-{n}"),
                rate(kafka, f"kafka-{work}-{n}"),
                f">= {TARGET_EQUAL}",
                "equal",
            )
    for work in ("slow", "noop"):
        for n in tasks:
            if n > 1:
                add(
                    f"{work}: queueflow {n} tasks / built-in 1 task per partition",
                    rate(qf, f"queueflow-{work}-{n}"),
                    rate(kafka, f"kafka-{work}-1"),
                    f"> {TARGET_SPREAD}" if work == "slow" else "(no target)",
                    "spread",
                )
    return rows


def run_spark(ctx: Context, side: str, config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run :func:`spark_main` in a subprocess; its results (partial ones too, on a timeout)."""
    s8_dir = Path(config["dir"])
    config_path, out_path = s8_dir / f"{side}-config.json", s8_dir / f"{side}-out.json"
    log_path = s8_dir / f"{side}.log"
    config_path.write_text(json.dumps(config | {"side": side, "timeout_s": timeout_s}))
    out_path.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=PYTHON,
        PYSPARK_DRIVER_PYTHON=PYTHON,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    argv = [PYTHON, "-m", "bench.scenario_s8", str(config_path), str(out_path)]
    t0 = time.monotonic()
    error = None
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=timeout_s + 30)
            if code:
                error = f"Spark process exited with {code}"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            error = f"Spark process killed after {timeout_s + 30:.0f} s"
    result = harness.read_json(out_path) or {}
    result["process_s"] = round(time.monotonic() - t0, 1)
    result["log"] = str(log_path)
    if error:
        result.setdefault("error", error)
    if result.get("session_error") or not result.get("spark"):
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        lines = [ln.strip() for ln in text.splitlines()]
        missing = [ln for ln in lines if ln.startswith(("module not found", "unresolved dep"))]
        tried = [ln.strip("= ").removesuffix(": tried") for ln in lines if ln.endswith(": tried")]
        if missing:
            result["ivy"] = "; ".join(dict.fromkeys(missing))[:400]
            if tried:
                result["ivy"] += f" (Ivy tried: {', '.join(dict.fromkeys(tried))})"
        result.setdefault("session_error", result.get("error") or "no SparkSession")
        result.setdefault("log_tail", "\n".join(text.splitlines()[-15:])[-1500:])
    return result


# --------------------------------------------------------------------------------------------
# Spark side (python -m bench.scenario_s8 CONFIG OUT)
# --------------------------------------------------------------------------------------------


def spark_main(argv: list[str]) -> int:
    """One SparkSession: a warm-up query, then every variant of the config, in order; writes
    the results to ``argv[1]`` after each step."""
    config = json.loads(Path(argv[0]).read_text())
    out_path = Path(argv[1])
    side = config["side"]
    deadline = time.monotonic() + float(config["timeout_s"])
    results: dict[str, Any] = {"side": side, "variants": {}}

    def save() -> None:
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=2, default=str))
        tmp.replace(out_path)

    t0 = time.monotonic()
    try:
        spark = _session(config.get("package"))
    except Exception as exc:
        results["session_error"] = repr(exc)[:600]
        save()
        return 2
    results["spark"] = spark.version
    results["session_s"] = round(time.monotonic() - t0, 1)
    save()
    try:
        warmup = {"name": f"{side}-warmup", "source": side, "work": "slow", "tasks": SLOTS}
        results["warmup"] = _guarded(lambda: run_query(spark, config, warmup, "warmup", 60))
        save()
        for variant in config["variants"]:
            left = deadline - time.monotonic()
            which = {k: variant[k] for k in ("source", "work", "tasks")}
            if left < 10:
                results["variants"][variant["name"]] = which | {"error": "skipped: S8 budget"}
                continue
            results["variants"][variant["name"]] = which | _guarded(
                lambda v=variant, left=left: run_query(spark, config, v, v["work"], left)
            )
            save()
    finally:
        save()
        spark.stop()
    return 0


def _guarded(run: Any) -> dict[str, Any]:
    try:
        return dict(run())
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:600]}


def _session(package: str | None) -> Any:
    """A ``local[4]`` SparkSession (the tests' settings, without their JIT limit: this is a
    throughput measurement), with ``spark.jars.packages`` = ``package`` if given."""
    from queueflow.spark.session import local_session

    conf = {"spark.sql.streaming.numRecentProgressUpdates": "1000"}
    if package:
        conf["spark.jars.packages"] = package
    return local_session("queueflow-bench-s8", cores=SLOTS, conf=conf)


def _slow_rows(batches: Any) -> Any:
    """``mapInPandas`` function of the ``slow`` workload: :data:`SLOW_MS` ms per row."""
    for pdf in batches:
        for _ in range(len(pdf)):
            time.sleep(SLOW_MS / 1000)
        yield pdf


def run_query(
    spark: Any, config: dict[str, Any], variant: dict[str, Any], topic_key: str, timeout_s: float
) -> dict[str, Any]:
    """One availableNow query over ``config["topics"][topic_key]``; its figures."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    name, source, work, tasks = (variant[k] for k in ("name", "source", "work", "tasks"))
    topic = config["topics"][topic_key]
    checkpoint = Path(config["dir"]) / "checkpoints" / name
    shutil.rmtree(checkpoint, ignore_errors=True)
    reader = spark.readStream
    if source == "queueflow":
        reader = (
            reader.format("queueflow")
            .option("bootstrap.servers", config["bootstrap"])
            .option("app.id", config["app_id"])
            .option("group", f"s8-{name}")
            .option("topic", topic)
            .option("maxRecordsPerTrigger", str(MAX_PER_TRIGGER))
            .option("minPartitions", str(tasks))
        )
    else:
        reader = (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", config["bootstrap"])
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(MAX_PER_TRIGGER))
        )
        if tasks > 1:
            reader = reader.option("minPartitions", str(tasks))
    stream = reader.load()
    batches: list[dict[str, Any]] = []
    # Python workers pickle _slow_rows by value when it isn't importable there.
    slow = _slow_rows

    def handle(batch: Any, batch_id: int) -> None:
        started = time.time()
        if work == "slow":
            batch = batch.select("value").mapInPandas(slow, "value binary")
        observation = Observation()
        # The task count: the highest partition id + 1 (observed metrics take no
        # non-deterministic expression, hence the column).
        observed = batch.withColumn("_task", F.spark_partition_id()).observe(
            observation,
            F.count(F.lit(1)).alias("rows"),
            (F.max("_task") + 1).alias("tasks"),
        )
        observed.write.format("noop").mode("overwrite").save()
        metrics = observation.get
        batches.append(
            {
                "id": batch_id,
                "start": started,
                "end": time.time(),
                "rows": int(metrics.get("rows") or 0),
                "tasks": metrics.get("tasks"),
            }
        )

    t0 = time.time()
    query = (
        stream.writeStream.foreachBatch(handle)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    error = None
    if not query.awaitTermination(timeout_s):
        error = f"not finished within {timeout_s:.0f} s"
        query.stop()
    elif query.exception() is not None:
        error = f"query failed: {query.exception()}"[:600]
    finished = time.time()
    progress = [
        {
            "batch": p.batchId,
            "numInputRows": p.numInputRows,
            "durationMs": dict(p.durationMs or {}),
        }
        for p in query.recentProgress
    ]
    full = [b for b in batches if b["rows"]]
    rows = sum(b["rows"] for b in full)
    out: dict[str, Any] = {
        "source": source,
        "work": work,
        "tasks": tasks,
        "records": rows,
        "expected": config["sizes"][topic_key],
        "batches": len(full),
        "tasks_per_batch": sorted({b["tasks"] for b in full}),
        "query_s": round(finished - t0, 2),
        "progress": progress,
        "batch_times": [
            {
                "id": b["id"],
                "rows": b["rows"],
                "tasks": b["tasks"],
                "s": round(b["end"] - b["start"], 3),
            }
            for b in full
        ],
    }
    if full:
        seconds = full[-1]["end"] - full[0]["start"]
        out["seconds"] = round(seconds, 3)
        out["startup_s"] = round(full[0]["start"] - t0, 2)
        out["rate"] = round(rows / seconds, 1) if seconds > 0 else None
    if rows != out["expected"]:
        error = (error + "; " if error else "") + f"{rows} rows, expected {out['expected']}"
    if error:
        out["error"] = error
    return out


if __name__ == "__main__":
    sys.exit(spark_main(sys.argv[1:]))
