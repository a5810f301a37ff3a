"""queueflow benchmark suite (issue #4): ``make bench`` / ``python -m bench``.

Runs, against one Kafka broker (a LocalBroker on free ports started for the run, or
``$QUEUEFLOW_BROKER``):

S1  throughput: N records of 1 KiB on a 4-partition topic, no-op handler, 4 consumer processes:
    (a) queueflow share agent, (b) raw aiokafka consumer group (the ceiling), (c) plain Faust
    agent, (d) native share groups via confluent-kafka's ShareConsumer, (e) Kafka's Java
    ShareConsumerPerformance;
S2  scaling past partitions: 1 partition, a handler that awaits 10 ms, 1..32 consumers;
S3  latency at 50 % of S1's queueflow throughput;
S4  redelivery: RELEASE 10 % of records once;
S5  memory: leader RSS with 2,000 and 10,000 in-flight records per partition, and the engine's
    bytes per in-flight record.

Every figure comes from counters the consumer processes report (``bench.harness.Stats``), from
the first record delivered to the last acknowledgement answered (or record consumed). Prints a
table and writes ``bench/results/latest.json``. Benchmarks never assert: failures are recorded
in the results and the suite goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import PYTHON, ROOT, Fleet, percentiles, read_json, rss_bytes, span, total
from queueflow.devtools.broker import (
    LocalBroker,
    bootstrap_from_env,
    create_topic,
    find_free_ports,
    run_kafka_tool,
)

RESULTS = ROOT / "bench" / "results"
RECORD_SIZE = 1024
S1_PARTITIONS = 4
S1_PROCESSES = 4
#: S2 layouts: consumers -> (processes, handler concurrency per process).
S2_LAYOUTS = {1: (1, 1), 2: (2, 1), 4: (4, 1), 8: (4, 2), 16: (4, 4), 32: (4, 8)}
#: S2 plain Faust comparison: consumers -> (worker processes, agent concurrency per worker).
S2_FAUST_LAYOUTS = {1: (1, 1), 4: (4, 1), 32: (4, 8)}
#: S1(w): handler concurrencies measured over a window (a share agent prefetches 2 x concurrency).
S1_SWEEP = (16, 64)
S1_SWEEP_WINDOW_S = 10.0
S2_SECONDS = 6.0  # records per S2 run = what n ideal consumers finish in this many seconds
S3_SECONDS = 10.0
#: A run in which nothing finishes for this many seconds is given up (and reported).
STALL_S = 25.0
MEMBER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.heartbeat.interval.ms": 1000,
    "group.share.session.timeout.ms": 15000,
}


@dataclass
class Context:
    bootstrap: str
    run_dir: Path
    args: argparse.Namespace
    started: float = field(default_factory=time.monotonic)
    results: dict[str, Any] = field(default_factory=dict)
    #: seconds kept for the scenarios still to run (set by main before each scenario).
    reserve: float = 0.0
    #: pid of the broker JVM when this run started it (its CPU is reported per variant).
    broker_pid: int | None = None

    def remaining(self) -> float:
        """Seconds this scenario may still use: the budget left minus what later scenarios need."""
        return self.args.budget - (time.monotonic() - self.started) - self.reserve

    def timeout(self, wanted: float, floor: float = 20.0) -> float:
        """``wanted``, cut down to what the budget leaves (never below ``floor``)."""
        return max(min(wanted, self.remaining()), floor)

    def affordable(self, seconds: float, what: str, out: dict[str, Any]) -> bool:
        """True if ``seconds`` fit in the budget; otherwise record ``what`` as skipped."""
        if self.remaining() >= seconds:
            return True
        out.setdefault("skipped", []).append(f"{what} (budget: {self.remaining():.0f} s left)")
        self.say(f"skipping {what}: {self.remaining():.0f} s of budget left")
        return False

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:6.1f}s] {text}", flush=True)

    def uid(self, prefix: str) -> str:
        return f"bench-{prefix}-{uuid.uuid4().hex[:6]}"


# --------------------------------------------------------------------------------------------
# worker launchers
# --------------------------------------------------------------------------------------------


#: Log level of every Faust worker; set from --faust-loglevel. At ``warn`` (faust's default) the
#: worker's startup spinner sets the root logger to DEBUG for the life of the process, so every
#: aiokafka/Faust debug call builds a LogRecord; ``info`` (what README.md and ``queueflow
#: leader`` use) avoids that.
FAUST_LOGLEVEL = "info"


def faust_argv(module: str, datadir: Path) -> list[str]:
    (web_port,) = find_free_ports(1)
    return [
        PYTHON,
        "-m",
        "faust",
        "-A",
        module,
        "--datadir",
        str(datadir),
        "worker",
        "-l",
        FAUST_LOGLEVEL,
        "--web-port",
        str(web_port),
    ]


def qf_env(
    ctx: Context,
    app_id: str,
    topic: str,
    group: str,
    role: str,
    concurrency: int,
    mode: str,
    **extra: str,
) -> dict[str, str]:
    return dict(
        os.environ,
        BENCH_APP_ID=app_id,
        BENCH_BROKER=f"kafka://{ctx.bootstrap}",
        BENCH_TOPIC=topic,
        BENCH_GROUP=group,
        BENCH_CONCURRENCY=str(concurrency),
        BENCH_MODE=mode,
        QUEUEFLOW_ROLE=role,
        **extra,
    )


def balanced(partitions: int, members: int) -> Callable[[list[dict[str, Any]]], bool]:
    """All members report an assignment, together covering every partition, balanced as the
    share-group assignor (and Kafka's) balance them."""

    def check(stats: list[dict[str, Any]]) -> bool:
        if len(stats) < members or not all(s.get("ready") for s in stats):
            return False
        sizes = [len(s.get("assigned") or []) for s in stats]
        union = set().union(*(set(s.get("assigned") or []) for s in stats))
        if union != set(range(partitions)) or max(sizes) - min(sizes) > 1:
            return False
        return members > partitions or sum(sizes) == partitions

    return check


def stable(
    check: Callable[[list[dict[str, Any]]], bool], hold_s: float
) -> Callable[[list[dict[str, Any]]], bool]:
    """``check`` has held, with the same assignments, for ``hold_s`` seconds."""
    since: list[Any] = [None, None]

    def wrapped(stats: list[dict[str, Any]]) -> bool:
        if not check(stats):
            since[0] = None
            return False
        key = [tuple(s.get("assigned") or []) for s in stats]
        if since[0] is None or since[1] != key:
            since[0], since[1] = time.monotonic(), key
        return time.monotonic() - since[0] >= hold_s

    return wrapped


def measure_fleet(
    ctx: Context,
    fleet: Fleet,
    expected: int,
    ready: Callable[..., bool],
    start_timeout_s: float,
    run_timeout_s: float,
    during: Callable[[Fleet], Any] | None = None,
    members: list[harness.Worker] | None = None,
    window_s: float | None = None,
    also_cpu: list[harness.Worker] | None = None,
) -> dict[str, Any]:
    """Wait until ready, create the go-file, wait for ``expected`` finished records.

    Returns:
        ``records``, ``seconds`` (first delivery → last finished), ``rate`` (records/s),
        ``complete``; on trouble ``error`` and the logs' tails.
    """
    started = time.monotonic()
    members = members or fleet.workers
    if not fleet.wait(ready, start_timeout_s, members=members):
        return {
            "error": f"consumers not ready within {start_timeout_s:.0f} s",
            "stats": fleet.stats(),
            "logs": {w.name: w.log_tail(12) for w in fleet.workers},
        }
    startup = time.monotonic() - started
    go_at = fleet.go()
    for w in also_cpu or []:
        w.cpu_at_go = harness.cpu_seconds(w.pid)
    broker_cpu_at_go = harness.cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None
    extra = during(fleet) if during is not None else None
    progress = {"done": -1, "at": time.monotonic()}

    def finished_or_stalled(stats: list[dict[str, Any]]) -> bool:
        # Give up early when nothing finishes for STALL_S seconds (a broken run).
        done_now = total(stats)
        if done_now != progress["done"]:
            progress.update(done=done_now, at=time.monotonic())
        return done_now >= expected or time.monotonic() - progress["at"] > STALL_S

    fleet.wait(finished_or_stalled, window_s or run_timeout_s, interval_s=0.05, members=members)
    complete = total([w.stats() for w in members]) >= expected
    stats = [w.stats() for w in members]
    first, last = span(stats)
    done = total(stats)
    out: dict[str, Any] = {
        "records": done,
        "expected": expected,
        "complete": complete,
        "startup_s": round(startup, 1),
    }
    if first and last and last > first:
        out["seconds"] = round(last - first, 3)
        out["rate"] = round(done / (last - first), 1)
        out["go_to_first_ms"] = round((first - go_at) * 1000)
    else:
        out["error"] = "no records finished"
    out["delivered"] = total(stats, "delivered")
    out["released"] = total(stats, "released")
    out["per_process"] = [int(s.get("done") or 0) for s in stats]
    out["cpu_s"] = fleet.cpu_since_go()
    for w in also_cpu or []:
        now = harness.cpu_seconds(w.pid)
        if now is not None and w.cpu_at_go is not None:
            out["cpu_s"][w.name] = round(now - w.cpu_at_go, 2)
    seconds = out.get("seconds")
    if seconds:
        # CPU of each process divided by all records finished, and their sum: the CPU one
        # record costs the whole consumer side (the broker not included).
        out["cpu_us_per_record"] = {
            name: round(1e6 * cpu / max(done, 1), 1) for name, cpu in out["cpu_s"].items()
        }
        out["cpu_us_per_record_total"] = round(sum(out["cpu_us_per_record"].values()), 1)
        broker_now = harness.cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None
        if broker_now is not None and broker_cpu_at_go is not None:
            # from go to the end of the wait (a little more than first -> last record)
            out["broker_cpu_s"] = round(broker_now - broker_cpu_at_go, 2)
            out["broker_cpu_us_per_record"] = round(1e6 * out["broker_cpu_s"] / max(done, 1), 1)
    timings = {
        w.name: s["timings"]
        for w, s in zip(fleet.workers, fleet.stats(), strict=True)
        if s.get("timings")
    }
    if timings:
        out["timings"] = timings
    hook_errors = {
        w.name: s["hook_errors"]
        for w, s in zip(fleet.workers, fleet.stats(), strict=True)
        if s.get("hook_errors")
    }
    if hook_errors:  # the bench's counting hooks no longer fit queueflow's internals
        out["hook_errors"] = hook_errors
        out["error"] = out.get("error") or f"bench hooks failed: {hook_errors}"[:300]
    if window_s and not complete:
        out["window_s"] = window_s  # a rate over a fixed window, not a full drain
    elif not complete:
        stalled = time.monotonic() - progress["at"] > STALL_S
        out["error"] = out.get("error") or (
            f"stalled: nothing finished for {STALL_S:.0f} s"
            if stalled
            else f"timed out after {run_timeout_s:.0f} s"
        )
        out["logs"] = {w.name: w.log_tail(12) for w in fleet.workers if not w.alive()}
    if extra is not None:
        out["during"] = extra
    return out


def start_leader(
    ctx: Context, fleet: Fleet, app_id: str, topics: list[str], partitions: int, run_dir: Path
) -> Any:
    """A leader-only worker (role ``leader`` of :mod:`bench.qf_app`, i.e. what ``queueflow
    leader`` runs, plus the bench's timing hooks); waits until it owns every request partition
    and has recovered its tables.

    Raises:
        RuntimeError: not ready within 90 s.
    """
    env = qf_env(
        ctx, app_id, topics[0], "bench", "leader", 1, "noop", BENCH_LEAD_TOPICS=",".join(topics[1:])
    )
    worker = fleet.add("leader", faust_argv("bench.qf_app", run_dir / "leader-data"), env)
    ok = fleet.wait(
        lambda s: bool(s[0].get("recovered")) and s[0].get("owned") == partitions,
        90,
        members=[worker],
    )
    if not ok:
        raise RuntimeError(f"leader worker not ready within 90 s:\n{worker.log_tail(20)}")
    return worker


def run_queueflow(
    ctx: Context,
    name: str,
    topic: str,
    partitions: int,
    records: int,
    *,
    processes: int,
    concurrency: int,
    mode: str,
    layout: str,
    run_timeout_s: float,
    profile: bool = False,
    leader_app: str | None = None,
    window_s: float | None = None,
    during: Callable[[Fleet], Any] | None = None,
    leader_worker: harness.Worker | None = None,
) -> dict[str, Any]:
    """queueflow share agents in Faust worker processes (``bench.qf_app``).

    ``layout``: ``leader`` = a leader-only worker plus ``processes`` member workers (the
    default); ``all`` = the first of ``processes`` workers has role ``all`` (coordinator,
    leaders and a share agent), the others role ``member``. ``leader_app``: use the running
    leader of that app id instead of starting one. ``window_s``: stop after that many seconds
    and report the rate so far (for slow configurations).
    """
    app_id, group = leader_app or ctx.uid(name), f"g-{name}"
    run_dir = ctx.run_dir / name
    with Fleet(run_dir) as fleet:
        leader = None
        roles = ["member"] * processes
        if layout == "leader" and leader_app is None:
            leader = leader_worker = start_leader(ctx, fleet, app_id, [topic], partitions, run_dir)
        elif layout == "all":
            roles[0] = "all"
        members = []
        for i, role in enumerate(roles):
            env = qf_env(ctx, app_id, topic, group, role, concurrency, mode)
            if mode == "latency":
                env["BENCH_SAMPLES"] = str(run_dir / f"{role}-{i}.samples.json")
            argv = faust_argv("bench.qf_app", run_dir / f"data-{i}")
            members.append(fleet.add(f"{role}-{i}", argv, env))
        if profile:
            during = lambda f: start_profilers(ctx, f, name, leader_worker)  # noqa: E731
        result = measure_fleet(
            ctx,
            fleet,
            records,
            stable(balanced(partitions, processes), 1.5),
            90,
            run_timeout_s,
            during,
            members=members,
            window_s=window_s,
            also_cpu=[leader_worker] if leader_app and leader_worker else None,
        )
        if profile and isinstance(result.get("during"), list):
            result["profiles"] = finish_profilers(result.pop("during"))
        if mode == "latency":
            fleet.request_stop()
            fleet.wait(lambda s: all(x.get("stopped") for x in s), 10, members=members)
            result["samples"] = [str(run_dir / f"{w.name}.samples.json") for w in members]
        if leader is not None:
            result["leader_rss_mb"] = round((rss_bytes(leader.pid) or 0) / 2**20, 1)
    result.update(layout=layout, processes=processes, concurrency=concurrency, mode=mode)
    return result


def run_faust(
    ctx: Context,
    name: str,
    topic: str,
    partitions: int,
    records: int,
    *,
    processes: int,
    concurrency: int,
    mode: str,
    run_timeout_s: float,
) -> dict[str, Any]:
    run_dir = ctx.run_dir / name
    app_id = ctx.uid(name)
    with Fleet(run_dir) as fleet:
        for i in range(processes):
            env = dict(
                os.environ,
                BENCH_APP_ID=app_id,
                BENCH_BROKER=f"kafka://{ctx.bootstrap}",
                BENCH_TOPIC=topic,
                BENCH_CONCURRENCY=str(concurrency),
                BENCH_MODE=mode,
            )
            fleet.add(f"faust-{i}", faust_argv("bench.faust_app", run_dir / f"data-{i}"), env)

        def ready(stats: list[dict[str, Any]]) -> bool:
            # Every worker has joined the same generation of the group, which assigned every
            # partition once (and each worker one, when there are enough partitions).
            generations = {s.get("generation") for s in stats}
            if len(generations) != 1 or None in generations:
                return False
            sizes = [len(s.get("assigned") or []) for s in stats]
            union = set().union(*(set(s.get("assigned") or []) for s in stats))
            if processes <= partitions and min(sizes) == 0:
                return False
            return union == set(range(partitions)) and sum(sizes) == partitions

        result = measure_fleet(ctx, fleet, records, stable(ready, 2.0), 120, run_timeout_s)
    result.update(processes=processes, concurrency=concurrency, mode=mode)
    return result


def run_raw(
    ctx: Context,
    name: str,
    topic: str,
    partitions: int,
    records: int,
    processes: int,
    run_timeout_s: float,
) -> dict[str, Any]:
    run_dir = ctx.run_dir / name
    group = ctx.uid(name)
    with Fleet(run_dir) as fleet:
        for i in range(processes):
            env = dict(os.environ, BENCH_BROKER=ctx.bootstrap, BENCH_TOPIC=topic, BENCH_GROUP=group)
            fleet.add(f"raw-{i}", [PYTHON, "-m", "bench.raw_consumer"], env)
        result = measure_fleet(
            ctx, fleet, records, stable(balanced(partitions, processes), 1.0), 60, run_timeout_s
        )
    result.update(processes=processes)
    return result


def set_share_earliest(ctx: Context, group: str) -> str | None:
    """Set the native share group's ``share.auto.offset.reset=earliest`` (before consuming)."""
    proc = run_kafka_tool(
        "kafka.admin.ConfigCommand",
        [
            "--bootstrap-server",
            ctx.bootstrap,
            "--entity-type",
            "groups",
            "--entity-name",
            group,
            "--alter",
            "--add-config",
            "share.auto.offset.reset=earliest",
        ],
        timeout_s=90,
    )
    if proc.returncode != 0:
        return f"ConfigCommand exited {proc.returncode}: {(proc.stdout + proc.stderr)[-400:]}"
    return None


def confluent_share_support() -> dict[str, Any]:
    try:
        import confluent_kafka
    except ImportError as exc:
        return {"available": False, "why": f"confluent-kafka not installed: {exc}"}
    has = hasattr(confluent_kafka, "ShareConsumer")
    info = {
        "available": has,
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
    }
    if not has:
        info["why"] = (
            f"confluent_kafka {confluent_kafka.version()[0]} has no ShareConsumer "
            "(KIP-932 preview needs confluent-kafka >= 2.15.0)"
        )
    return info


def run_native(
    ctx: Context, name: str, topic: str, records: int, processes: int, run_timeout_s: float
) -> dict[str, Any]:
    support = confluent_share_support()
    if not support["available"]:
        return {"error": support["why"], "client": support}
    group = ctx.uid(name)
    error = set_share_earliest(ctx, group)
    if error:
        return {"error": error, "client": support}
    run_dir = ctx.run_dir / name
    with Fleet(run_dir) as fleet:
        for i in range(processes):
            env = dict(os.environ, BENCH_BROKER=ctx.bootstrap, BENCH_TOPIC=topic, BENCH_GROUP=group)
            fleet.add(f"native-{i}", [PYTHON, "-m", "bench.native_consumer"], env)
        result = measure_fleet(
            ctx,
            fleet,
            records,
            stable(lambda s: len(s) == processes and all(x.get("ready") for x in s), 1.0),
            60,
            run_timeout_s,
        )
    result.update(processes=processes, client=support, acknowledgement="implicit")
    return result


def run_java_perf(ctx: Context, topic: str, records: int, timeout_s: float) -> dict[str, Any]:
    """Kafka's ShareConsumerPerformance: 4 share consumers (threads) in one JVM."""
    group = ctx.uid("s1e")
    error = set_share_earliest(ctx, group)
    if error:
        return {"error": error}
    args = [
        "--bootstrap-server",
        ctx.bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        "--num-records",
        str(records),
        "--threads",
        str(S1_PROCESSES),
        "--timeout",
        "15000",
        "--show-detailed-stats",
        "--reporting-interval",
        "250",
    ]
    broker_before = harness.cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None
    try:
        proc = run_kafka_tool("share-consumer-perf", args, timeout_s=timeout_s)
    except Exception as exc:  # BrokerError on timeout
        return {"error": f"ShareConsumerPerformance: {exc}"[:600]}
    (ctx.run_dir / "s1e-java.log").write_text(proc.stdout + "\n" + proc.stderr)
    out = parse_java_perf(proc.stdout, records) | {
        "returncode": proc.returncode,
        "threads": S1_PROCESSES,
    }
    broker_after = harness.cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None
    if broker_before is not None and broker_after is not None:
        # the whole tool run: JVM start and group join included
        out["broker_cpu_s"] = round(broker_after - broker_before, 2)
        out["broker_cpu_us_per_record"] = round(1e6 * out["broker_cpu_s"] / max(records, 1), 1)
    return out


def _java_time(text: str) -> float:
    return datetime.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S:%f").timestamp()


def parse_java_perf(stdout: str, expected: int) -> dict[str, Any]:
    """Parse ShareConsumerPerformance output (detailed stats every 250 ms, then the summary).

    ``tool_rate`` is the tool's own nMsg.sec, which includes joining the group; ``rate`` is
    measured like the Python variants: from the first interval with records to the end.
    """
    rows, summary = [], None
    for line in stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 7 or not parts[0][:4].isdigit():
            continue
        try:
            start, end = _java_time(parts[0]), _java_time(parts[1])
            count = int(parts[5])
            rate = float(parts[4])
        except ValueError:
            continue
        if "for share consumer" in line:
            rows.append((start, end, count))
        else:
            summary = (start, end, count, rate)
    if summary is None:
        return {
            "error": "no summary line in ShareConsumerPerformance output",
            "stdout_tail": stdout[-800:],
        }
    start, end, count, tool_rate = summary
    out: dict[str, Any] = {
        "records": count,
        "expected": expected,
        "complete": count >= expected,
        "tool_rate": round(tool_rate, 1),
        "tool_seconds": round(end - start, 3),
    }
    with_records = [r for r in rows if r[2] > 0]
    if with_records:
        # The first row with records ends at the first report after the first record.
        first = min(r[1] for r in with_records)
        before = sum(r[2] for r in with_records if r[1] <= first)
        if end > first:
            out["seconds"] = round(end - first, 3)
            out["rate"] = round((count - before) / (end - first), 1)
    if "rate" not in out:
        out["rate"] = out["tool_rate"]
    return out


# --------------------------------------------------------------------------------------------
# profiling (py-spy) during S1(a)
# --------------------------------------------------------------------------------------------


def start_profilers(
    ctx: Context, fleet: Fleet, name: str, leader: harness.Worker | None
) -> list[Any]:
    """py-spy on the leader (or the ``all`` worker) and one member, ``--gil``: only samples of
    threads holding the GIL, so time spent runnable but waiting for a CPU (2 cores, shared with
    the broker) or for I/O is not counted as work."""
    pyspy = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
    if not Path(pyspy).exists():
        return []
    workers = ([leader] if leader is not None else []) + fleet.workers
    targets = [(w.name, w.pid) for w in workers[:2]]
    procs = []
    for label, pid in targets:
        # raw (collapsed stacks, flamegraph.pl input) for the tables, and an SVG flame graph
        for fmt, suffix in (("raw", "pyspy.txt"), ("flamegraph", "pyspy.svg")):
            out = ctx.run_dir / f"{name}-{label}.{suffix}"
            argv = [
                pyspy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                "100",
                "--nonblocking",
                "--gil",
                "--full-filenames",
                "--format",
                fmt,
                "--output",
                str(out),
                "--duration",
                str(int(ctx.args.profile_seconds)),
            ]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append((label if fmt == "raw" else None, out, proc))
    return procs


def finish_profilers(procs: list[Any]) -> dict[str, Any]:
    out = {}
    for _label, _path, proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
    for label, path, proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if label is not None:
            out[label] = summarize_profile(path) if path.exists() else {"error": "no profile"}
    return out


#: Where time goes, by the file of a frame: (component, path fragment). The first match wins for
#: self time (leaf frame); inclusive time counts a sample once per component on its stack.
COMPONENTS = (
    ("JSON encode/decode", "/json/"),
    ("structlog", "/structlog/"),
    ("logging (stdlib)", "/logging/"),
    ("prometheus_client", "/prometheus_client/"),
    ("RocksDB store (faust/stores, rocksdict)", "/faust/stores/"),
    ("RocksDB store (faust/stores, rocksdict)", "/rocksdict/"),
    ("Faust streams/conductor/consumer", "/faust/"),
    ("mode (Faust's service lib)", "/mode/"),
    ("aiokafka consumer (fetch, parse)", "/aiokafka/consumer/"),
    ("aiokafka producer", "/aiokafka/producer/"),
    ("aiokafka client/conn/protocol", "/aiokafka/"),
    ("queueflow engine (share/)", "/queueflow/share/"),
    ("queueflow", "/queueflow/"),
    ("asyncio event loop, tasks, selectors", "/asyncio/"),
    ("asyncio event loop, tasks, selectors", "/selectors.py"),
    ("threading (stats thread wakeups)", "/threading.py"),
    ("bench harness (stats thread)", "/bench/"),  # self time only: its wrappers time queueflow
)


_DISPATCH = ("Handle._run ", "BaseEventLoop._run_once ", "Thread.run ")


def _component(frame: str) -> str:
    for name, fragment in COMPONENTS:
        if fragment in frame:
            return name
    return "other"


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and total sample counts per function and per component from py-spy's raw
    (collapsed, flamegraph.pl-compatible) output."""
    self_counts: dict[str, int] = {}
    total_counts: dict[str, int] = {}
    comp_self: dict[str, int] = {}
    comp_total: dict[str, int] = {}
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ")]
        if frames and frames[0].startswith("thread "):
            frames = frames[1:]
        samples += count
        if not frames:
            continue
        leaf = _frame_name(frames[-1])
        self_counts[leaf] = self_counts.get(leaf, 0) + count
        for name in {_frame_name(f) for f in frames}:
            total_counts[name] = total_counts.get(name, 0) + count
        leaf_component = _component(frames[-1])
        comp_self[leaf_component] = comp_self.get(leaf_component, 0) + count
        # Inclusive: only frames below the event loop's dispatch of a callback, so the process's
        # bootstrap (runpy, click, faust.cli, mode.worker, run_forever) counts for nothing.
        dispatch = [i for i, f in enumerate(frames) if f.startswith(_DISPATCH)]
        below = frames[dispatch[-1] + 1 :] if dispatch else frames
        for name in {_component(f) for f in below} - {"bench harness (stats thread)"}:
            comp_total[name] = comp_total.get(name, 0) + count

    def table(counts: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(100 * c / max(samples, 1), 1)) for name, c in ranked]

    return {
        "samples": samples,
        "file": str(path),
        "self_pct": table(self_counts),
        "total_pct": table(total_counts),
        "component_self_pct": table(comp_self),
        "component_inclusive_pct": table(comp_total),
    }


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``; py-spy's own idle marker kept."""
    func, _, where = frame.partition(" (")
    where = where.rstrip(")")
    file = where.rsplit(":", 1)[0]
    match = re.search(r"(?:site-packages|lib/python\d+\.\d+)/(.*)$", file)
    short = match.group(1) if match else "/".join(Path(file).parts[-2:])
    return f"{func} ({short})"


# --------------------------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------------------------


def scenario_s1(ctx: Context) -> dict[str, Any]:
    n = ctx.args.records
    topic = ctx.uid("s1")
    create_topic(ctx.bootstrap, topic, S1_PARTITIONS)
    ctx.say(
        f"S1: producing {n:,} records of {RECORD_SIZE} B to {topic} ({S1_PARTITIONS} partitions)"
    )
    produce_s = harness.produce(ctx.bootstrap, topic, n, RECORD_SIZE, S1_PARTITIONS)
    out: dict[str, Any] = {
        "topic": topic,
        "records": n,
        "record_bytes": RECORD_SIZE,
        "partitions": S1_PARTITIONS,
        "produce_s": round(produce_s, 1),
    }
    only = set(ctx.args.s1_variants)
    conc = ctx.args.qf_concurrency
    # Seconds each variant needs at least; optional ones are skipped when the budget is short.
    need = {"b": 15, "a": 40, "w": 75, "l": 40, "c": 40, "d": 20, "e": 25}

    def timeout(key: str) -> float:
        # what this variant may take, leaving the minimum of the variants run after it
        order = "bawlcde"
        later = sum(need[k] for k in order[order.index(key) + 1 :] if k in only)
        return max(ctx.timeout(ctx.args.s1_timeout + later) - later, 20.0)

    def run(key: str, label: str, fn: Callable[[], dict[str, Any]]) -> None:
        if key not in only:
            return
        if key in "wl" and not ctx.affordable(
            need[key] + need.get("c", 0) + need["d"] + need["e"], f"S1({key})", out
        ):
            return
        ctx.say(f"S1({key}) {label} ...")
        result = guarded(fn)
        result["label"] = label
        out[key] = result
        ctx.say(f"S1({key}) {fmt_rate(result)}")

    run(
        "b",
        "raw aiokafka consumer group",
        lambda: run_raw(ctx, "s1b-raw", topic, S1_PARTITIONS, n, S1_PROCESSES, timeout("b")),
    )
    if only & {"a", "w"} and ctx.args.qf_layout == "leader":
        # One leader worker serves (a) and then the concurrency sweep (w), each in its own group.
        app_id = ctx.uid("s1a")
        with Fleet(ctx.run_dir / "s1a-leader") as leaders:
            try:
                leader = start_leader(
                    ctx, leaders, app_id, [topic], S1_PARTITIONS, ctx.run_dir / "s1a-leader"
                )
            except Exception as exc:
                out["a"] = {"error": repr(exc)[:600], "label": "queueflow share agent"}
            else:
                run(
                    "a",
                    "queueflow share agent",
                    lambda: run_queueflow(
                        ctx,
                        "s1a-queueflow",
                        topic,
                        S1_PARTITIONS,
                        n,
                        processes=S1_PROCESSES,
                        concurrency=conc,
                        mode="noop",
                        layout="leader",
                        run_timeout_s=timeout("a"),
                        leader_app=app_id,
                        profile=ctx.args.profile,
                        leader_worker=leader,
                    ),
                )
                sweep: dict[str, Any] = {}
                for c in S1_SWEEP:
                    if "w" not in only or not ctx.affordable(
                        25 + sum(need[k] for k in "lcde" if k in only), "S1(w)", out
                    ):
                        break
                    ctx.say(f"S1(w) queueflow, concurrency {c}, {S1_SWEEP_WINDOW_S:.0f} s window")
                    sweep[str(c)] = guarded(
                        lambda c=c: run_queueflow(
                            ctx,
                            f"s1w-c{c}",
                            topic,
                            S1_PARTITIONS,
                            n,
                            processes=S1_PROCESSES,
                            concurrency=c,
                            mode="noop",
                            layout="leader",
                            run_timeout_s=timeout("w"),
                            leader_app=app_id,
                            window_s=S1_SWEEP_WINDOW_S,
                        )
                    )
                    ctx.say(f"S1(w) concurrency {c}: {fmt_rate(sweep[str(c)])}")
                if sweep:
                    out["w"] = {
                        "label": "queueflow share agent by handler concurrency "
                        "(prefetch adapts to handler time x ShareFetch RTT)",
                        "by_concurrency": sweep,
                    }
    elif "a" in only:
        run(
            "a",
            "queueflow share agent",
            lambda: run_queueflow(
                ctx,
                "s1a-queueflow",
                topic,
                S1_PARTITIONS,
                n,
                processes=S1_PROCESSES,
                concurrency=conc,
                mode="noop",
                layout="all",
                run_timeout_s=timeout("a"),
                profile=ctx.args.profile,
            ),
        )
    run(
        "l",
        "queueflow share agent, 1 'all' + 3 'member' workers",
        lambda: run_queueflow(
            ctx,
            "s1l-queueflow-all",
            topic,
            S1_PARTITIONS,
            n,
            processes=S1_PROCESSES,
            concurrency=conc,
            mode="noop",
            layout="all",
            run_timeout_s=timeout("l"),
        ),
    )
    run(
        "c",
        "plain Faust agent",
        lambda: run_faust(
            ctx,
            "s1c-faust",
            topic,
            S1_PARTITIONS,
            n,
            processes=S1_PROCESSES,
            concurrency=1,
            mode="noop",
            run_timeout_s=timeout("c"),
        ),
    )
    run(
        "d",
        "native share group, confluent-kafka ShareConsumer (Python)",
        lambda: run_native(ctx, "s1d-native", topic, n, S1_PROCESSES, timeout("d")),
    )
    run(
        "e",
        "native share group, Kafka ShareConsumerPerformance (Java)",
        lambda: run_java_perf(ctx, topic, n, timeout("e") + 20),
    )
    a, b, d = (out.get(k, {}).get("rate") for k in ("a", "b", "d"))
    out["ratio_queueflow_raw"] = round(a / b, 3) if a and b else None
    out["ratio_queueflow_native"] = round(a / d, 3) if a and d else None
    if out.get("e", {}).get("rate") and a:
        out["ratio_queueflow_native_java"] = round(a / out["e"]["rate"], 3)
    if out.get("c", {}).get("rate") and a:
        out["ratio_queueflow_faust"] = round(a / out["c"]["rate"], 3)
    return out


def scenario_s2(ctx: Context) -> dict[str, Any]:
    ns = [n for n in ctx.args.s2_consumers if n in S2_LAYOUTS]
    topics = {n: ctx.uid(f"s2-{n}") for n in ns}
    faust_ns = [n for n in S2_FAUST_LAYOUTS if n in ns] if ctx.args.s2_faust else []
    faust_topics = {n: ctx.uid(f"s2f-{n}") for n in faust_ns}
    sizes = {n: max(300, int(n * 100 * S2_SECONDS)) for n in ns}
    # A plain Faust agent can't have more consumers than partitions: past 1 process, only the
    # agent concurrency of the process that owns the partition counts.
    faust_sizes = {n: max(300, int(S2_FAUST_LAYOUTS[n][1] * 100 * S2_SECONDS)) for n in faust_ns}
    for n in ns:
        create_topic(ctx.bootstrap, topics[n], 1)
        harness.produce(ctx.bootstrap, topics[n], sizes[n], RECORD_SIZE, 1)
    for n in faust_ns:
        create_topic(ctx.bootstrap, faust_topics[n], 1)
        harness.produce(ctx.bootstrap, faust_topics[n], faust_sizes[n], RECORD_SIZE, 1)
    out: dict[str, Any] = {
        "partitions": 1,
        "handler": "await asyncio.sleep(0.01)",
        "layout": "1 leader worker + member workers",
        "queueflow": {},
        "faust": {},
    }
    app_id = ctx.uid("s2")
    with Fleet(ctx.run_dir / "s2-leader") as leaders:
        ctx.say("S2: starting the leader worker (one for every S2 run; one topic per n) ...")
        try:
            leader = start_leader(
                ctx, leaders, app_id, [topics[n] for n in ns], len(ns), ctx.run_dir / "s2-leader"
            )
        except Exception as exc:
            return out | {"error": repr(exc)[:600]}
        for n in ns:
            procs, conc = S2_LAYOUTS[n]
            if not ctx.affordable(25 + S2_SECONDS, f"S2 queueflow n={n}", out):
                continue
            ctx.say(
                f"S2 queueflow n={n} ({procs} processes x concurrency {conc}), "
                f"{sizes[n]} records ..."
            )
            timeout = ctx.timeout(max(30.0, 4 * sizes[n] / (n * 100)))
            result = guarded(
                lambda n=n, procs=procs, conc=conc, timeout=timeout: run_queueflow(
                    ctx,
                    f"s2-n{n}",
                    topics[n],
                    1,
                    sizes[n],
                    processes=procs,
                    concurrency=conc,
                    mode="sleep10",
                    layout="leader",
                    run_timeout_s=timeout,
                    leader_app=app_id,
                )
            )
            out["queueflow"][str(n)] = result
            ctx.say(f"S2 queueflow n={n}: {fmt_rate(result)}")
        out["leader_timings"] = leader.stats().get("timings")
    for n in faust_ns:
        procs, conc = S2_FAUST_LAYOUTS[n]
        if not ctx.affordable(30 + S2_SECONDS, f"S2 plain Faust n={n}", out):
            continue
        ctx.say(f"S2 plain Faust n={n} ({procs} workers x concurrency {conc}) ...")
        timeout = ctx.timeout(max(30.0, 4 * faust_sizes[n] / (conc * 100)))
        result = guarded(
            lambda n=n, procs=procs, conc=conc, timeout=timeout: run_faust(
                ctx,
                f"s2f-n{n}",
                faust_topics[n],
                1,
                faust_sizes[n],
                processes=procs,
                concurrency=conc,
                mode="sleep10",
                run_timeout_s=timeout,
            )
        )
        out["faust"][str(n)] = result
        ctx.say(f"S2 plain Faust n={n}: {fmt_rate(result)}")
    for kind in ("queueflow", "faust"):
        single = out[kind].get("1", {}).get("rate")
        for n, result in out[kind].items():
            if single and result.get("rate"):
                result["efficiency"] = round(result["rate"] / (int(n) * single), 3)
            if result.get("rate"):  # a 10 ms handler: 100 records/s per consumer at most
                result["efficiency_vs_ideal"] = round(result["rate"] / (int(n) * 100), 3)
    return out


def scenario_s3(ctx: Context) -> dict[str, Any]:
    s1_rate = ctx.results.get("S1", {}).get("a", {}).get("rate") or ctx.args.s3_fallback_rate
    out: dict[str, Any] = {
        "s1_queueflow_rate": s1_rate,
        "layout": ctx.args.qf_layout,
        "concurrency": ctx.args.qf_concurrency,
        "runs": {},
    }
    for label, share in (("50%", 0.5), ("10%", 0.1)):
        if label != "50%" and not ctx.affordable(35, f"S3 at {label}", out):
            continue
        rate = max(10.0, share * s1_rate)
        ctx.say(
            f"S3 at {label} of S1 queueflow ({s1_rate:.0f}/s): {rate:.0f} records/s for "
            f"{S3_SECONDS:.0f} s ..."
        )
        run = guarded(lambda rate=rate, label=label: latency_run(ctx, label, rate))
        out["runs"][label] = run
        ctx.say(
            f"S3 {label}: handler start p50/p99 {run.get('to_handler_ms', {}).get('p50')}/"
            f"{run.get('to_handler_ms', {}).get('p99')} ms"
        )
    # The figure is the 50 % run; the 10 % run shows the floor without a backlog.
    out.update({k: v for k, v in out["runs"]["50%"].items() if k.endswith("_ms")})
    return out


def latency_run(ctx: Context, label: str, rate: float) -> dict[str, Any]:
    count = int(rate * S3_SECONDS)
    topic = ctx.uid("s3")
    create_topic(ctx.bootstrap, topic, S1_PARTITIONS)
    produced: dict[str, Any] = {}

    def produce_during(_fleet: Fleet) -> None:
        produced.update(paced_produce(ctx.bootstrap, topic, count, rate, S1_PARTITIONS))

    name = "s3-latency-" + label.rstrip("%")
    result = run_queueflow(
        ctx,
        name,
        topic,
        S1_PARTITIONS,
        count,
        processes=S1_PROCESSES,
        concurrency=ctx.args.qf_concurrency,
        mode="latency",
        layout=ctx.args.qf_layout,
        run_timeout_s=ctx.timeout(30),
        during=produce_during,
    )
    out: dict[str, Any] = {
        "rate_target": round(rate, 1),
        "records": count,
        "produce_rate": produced.get("rate"),
        "finished": result.get("records"),
        "error": result.get("error"),
        "timings": result.get("timings"),
    }
    samples: dict[str, list[float]] = {"to_handler": [], "to_ack": [], "to_handler_record_ts": []}
    for path in result.get("samples", []):
        data = read_json(Path(path)) or {}
        for key in samples:
            samples[key].extend(data.get(key, []))
    for key, values in samples.items():
        out[key + "_ms"] = {
            k: (round(v * 1000, 2) if isinstance(v, float) else v)
            for k, v in percentiles(values).items()
        }
    return {k: v for k, v in out.items() if v is not None}


def paced_produce(
    bootstrap: str, topic: str, count: int, rate: float, partitions: int
) -> dict[str, Any]:
    """Produce ``count`` records at ``rate``/s (1 ms pacing, librdkafka, linger 0)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    started = time.monotonic()
    sent = 0
    while sent < count:
        due = min(count, int((time.monotonic() - started) * rate) + 1)
        while sent < due:
            producer.produce(topic, harness.payload(RECORD_SIZE), partition=sent % partitions)
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    producer.flush(30)
    elapsed = time.monotonic() - started
    return {"rate": round(count / elapsed, 1), "seconds": round(elapsed, 2)}


def scenario_s4(ctx: Context) -> dict[str, Any]:
    n = ctx.args.s4_records or ctx.args.records
    topic = ctx.uid("s4")
    create_topic(ctx.bootstrap, topic, S1_PARTITIONS)
    ctx.say(f"S4: producing {n:,} records; RELEASE offsets % 10 == 0 once ...")
    s1_rate = ctx.results.get("S1", {}).get("a", {}).get("rate")
    # 5 x the S1(a) drain time of this many records, at least 60 s
    s4_timeout = min(ctx.args.s1_timeout, max(60.0, 5 * n / s1_rate)) if s1_rate else 120.0
    harness.produce(ctx.bootstrap, topic, n, RECORD_SIZE, S1_PARTITIONS)
    result = guarded(
        lambda: run_queueflow(
            ctx,
            "s4-redelivery",
            topic,
            S1_PARTITIONS,
            n,
            processes=S1_PROCESSES,
            concurrency=ctx.args.qf_concurrency,
            mode="release10",
            layout=ctx.args.qf_layout,
            run_timeout_s=ctx.timeout(s4_timeout),
        )
    )
    s1 = ctx.results.get("S1", {}).get("a", {}).get("rate")
    if s1 and result.get("rate"):
        result["s1_rate"] = s1
        result["overhead"] = round(s1 / result["rate"] - 1, 3)
        result["ideal_overhead"] = 0.1  # 10 % more deliveries
    return result


def scenario_s5(ctx: Context) -> dict[str, Any]:
    from queueflow.testing import LeaderWorker

    partitions, per_partition = S1_PARTITIONS, 10_000
    topic = ctx.uid("s5")
    create_topic(ctx.bootstrap, topic, partitions)
    harness.produce(ctx.bootstrap, topic, partitions * per_partition, 100, partitions)
    app_id = ctx.uid("s5")
    settings = {
        "share.auto.offset.reset": "earliest",
        "group.share.partition.max.record.locks": 10_000,
        "group.share.record.lock.duration.ms": 600_000,
        "group.share.max.record.lock.duration.ms": 600_000,
    }
    out: dict[str, Any] = {"partitions": partitions, "leader_settings": settings}
    leader = LeaderWorker(
        app_id,
        [topic],
        ctx.bootstrap,
        ctx.run_dir / "s5-leader-data",
        settings,
        log_path=ctx.run_dir / "s5-leader.log",
    )
    ctx.say("S5: leader RSS with 2,000 and 10,000 in-flight records per partition ...")
    try:
        leader.start(timeout_s=90)
        assert leader.process is not None
        out["leader"] = asyncio.run(
            asyncio.wait_for(s5_acquire(ctx, app_id, topic, partitions, leader.process.pid), 120)
        )
    except Exception as exc:
        out["error"] = repr(exc)[:500]
    finally:
        leader.stop(timeout_s=10)
    out["engine"] = engine_memory()
    return out


async def s5_acquire(
    ctx: Context, app_id: str, topic: str, partitions: int, pid: int
) -> dict[str, Any]:
    from queueflow.member.client import MemberClient
    from queueflow.settings import ShareGroupSettings

    settings = ShareGroupSettings.load(
        {"max.poll.records": 10_000, "queueflow.request.timeout.ms": 30_000}
    )
    client = MemberClient(ctx.bootstrap, app_id, "memory", [topic], settings, "bench-s5")
    await client.start()
    steps: dict[str, Any] = {}
    try:

        async def fetch_all(n: int) -> int:
            got = 0
            for p in range(partitions):
                response = await client.share_fetch(topic, p, n, [], 600_000)
                got += sum(last - first + 1 for first, last, _ in response.acquired)
            return got

        async def rss() -> float:
            values = []
            for _ in range(6):
                await asyncio.sleep(0.5)
                values.append(rss_bytes(pid) or 0)
            return max(values)

        await fetch_all(0)  # initialise the share-partitions, acquire nothing
        steps["baseline"] = {"in_flight_per_partition": 0, "rss": await rss()}
        got = await fetch_all(2_000)
        steps["2000"] = {"in_flight_per_partition": got // partitions, "rss": await rss()}
        got += await fetch_all(8_000)
        steps["10000"] = {"in_flight_per_partition": got // partitions, "rss": await rss()}
        # Worst case for the engine: ACCEPT every other record, so each in-flight record is a
        # run of its own (5,000 Acquired + 5,000 Acknowledged interleaved per partition).
        for p in range(partitions):
            start = await client_start_offset(client, topic, p)
            acks = [(o, o, (1,)) for o in range(start + 1, start + 10_000, 2)]
            await client.share_fetch(topic, p, 0, acks)
        steps["10000_fragmented"] = {
            "in_flight_per_partition": 10_000,
            "runs_per_partition": 10_000,
            "rss": await rss(),
        }
    finally:
        await client.close(leave=False)
    base = steps["baseline"]["rss"]
    for key in ("2000", "10000", "10000_fragmented"):
        step = steps[key]
        step["rss_mb"] = round(step["rss"] / 2**20, 1)
        records = step["in_flight_per_partition"] * partitions
        step["delta_bytes_per_record"] = (
            round((step["rss"] - base) / records, 1) if records else None
        )
    steps["baseline"]["rss_mb"] = round(base / 2**20, 1)
    return steps


async def client_start_offset(client: Any, topic: str, partition: int) -> int:
    """The log start offset of ``topic[partition]`` (where the share-partition began)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=client.bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        return int((await consumer.beginning_offsets([tp]))[tp])
    finally:
        await consumer.stop()


def engine_memory() -> dict[str, Any]:
    """bench/bench_engine_memory.py's scenarios, in a subprocess (tracemalloc is slow)."""
    code = (
        "import json, bench.bench_engine_memory as m\n"
        "out = {}\n"
        "for key, eng, base in (('own_runs', m.engine_own_runs, m.baseline_own_runs),"
        " ('batches', m.engine_batches, m.baseline_batches)):\n"
        "    used, sp = m.measure(eng)\n"
        "    b, _ = m.measure(base)\n"
        "    out[key] = {'runs': sp.run_count, 'bytes_per_record': round(used / m.N, 1),"
        " 'baseline_bytes_per_record': round(b / m.N, 1)}\n"
        "print(json.dumps(out))\n"
    )
    try:
        proc = subprocess.run(
            [PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return {"error": repr(exc)[:300]}


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def guarded(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return run()
    except Exception as exc:
        return {"error": repr(exc)[:500], "traceback": traceback.format_exc()[-2000:]}


def fmt_rate(result: dict[str, Any]) -> str:
    if result.get("rate"):
        text = f"{result['rate']:,.0f} records/s ({result.get('records')} in "
        text += f"{result.get('seconds')} s)"
        if result.get("error"):
            text += f" [{result['error']}]"
        return text
    return f"n/a [{result.get('error', 'no result')}]"


def num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def table(results: dict[str, Any]) -> str:
    rows: list[tuple[str, str, str]] = []

    def err(r: dict[str, Any]) -> str:
        return f" [{r['error']}]" if r.get("error") else ""

    s1 = results.get("S1")
    if s1:
        for key in "abcdel":
            r = s1.get(key)
            if r is None:
                continue
            note = ""
            if r.get("cpu_us_per_record_total") is not None:
                note = f"CPU/record: {num(r['cpu_us_per_record_total'], 1)} us consumers"
            if r.get("broker_cpu_us_per_record") is not None:
                note += ", " if note else "CPU/record: "
                note += f"{num(r['broker_cpu_us_per_record'], 1)} us broker"
            if key == "e" and r.get("tool_rate"):
                note += f"; tool's own figure, group join included: {num(r['tool_rate'])}/s"
            if key in "al":
                note += f"; {r.get('layout')} layout, concurrency {r.get('concurrency')}"
            rows.append(
                (f"S1({key}) {r.get('label', '')}", f"{num(r.get('rate'))} rec/s", note + err(r))
            )
        for c, r in s1.get("w", {}).get("by_concurrency", {}).items():
            rows.append(
                (
                    f"S1(w) queueflow, handler concurrency {c}",
                    f"{num(r.get('rate'))} rec/s",
                    err(r).strip(),
                )
            )
        ratios = (
            ("ratio_queueflow_raw", "raw aiokafka", ">= 0.5"),
            ("ratio_queueflow_native", "native ShareConsumer (Python)", ">= 1.0"),
            ("ratio_queueflow_native_java", "ShareConsumerPerformance (Java)", ""),
            ("ratio_queueflow_faust", "plain Faust agent", ""),
        )
        for key, label, target in ratios:
            if s1.get(key) is not None:
                rows.append(
                    (
                        f"S1 queueflow / {label}",
                        num(s1[key], 3),
                        f"target {target}" if target else "",
                    )
                )
        for item in s1.get("skipped", []):
            rows.append(("S1 skipped", item, ""))
    s2 = results.get("S2")
    if s2:
        for kind in ("queueflow", "faust"):
            for n, r in s2.get(kind, {}).items():
                layout = f"{r.get('processes')} proc x {r.get('concurrency')}"
                rows.append(
                    (
                        f"S2 {kind} n={n} ({layout})",
                        f"{num(r.get('rate'))} rec/s",
                        f"efficiency {num(r.get('efficiency'), 2)}, vs 100/s per consumer "
                        f"{num(r.get('efficiency_vs_ideal'), 2)}" + err(r),
                    )
                )
        for item in s2.get("skipped", []):
            rows.append(("S2 skipped", item, ""))
        if s2.get("error"):
            rows.append(("S2", "n/a", s2["error"][:100]))
    s3 = results.get("S3")
    if s3:
        for label, run in s3.get("runs", {}).items():
            for key, what in (
                ("to_handler_ms", "produce -> handler start"),
                ("to_ack_ms", "produce -> ack answered"),
            ):
                p = run.get(key, {})
                rows.append(
                    (
                        f"S3 at {label} of S1(a): {what}",
                        f"p50 {num(p.get('p50'), 1)} / p99 {num(p.get('p99'), 1)} / "
                        f"p999 {num(p.get('p999'), 1)} ms",
                        f"{num(run.get('produce_rate'))} rec/s" + err(run),
                    )
                )
    s4 = results.get("S4")
    if s4:
        note = s4.get("error", "")
        if s4.get("overhead") is not None:
            note = (
                f"overhead vs S1(a): {num(100 * s4['overhead'], 1)}% "
                f"(10% more deliveries; {s4.get('records')} records)"
            )
        rows.append(("S4 redelivery (10% RELEASEd once)", f"{num(s4.get('rate'))} rec/s", note))
    s5 = results.get("S5")
    if s5:
        leader = s5.get("leader", {})
        for key in ("2000", "10000", "10000_fragmented"):
            step = leader.get(key)
            if step:
                what = f"{step['in_flight_per_partition']:,} in flight/partition"
                if key.endswith("fragmented"):
                    what += ", 1 run each"
                rows.append(
                    (
                        f"S5 leader RSS, {what}",
                        f"{num(step.get('rss_mb'), 1)} MB",
                        f"+{num(step.get('delta_bytes_per_record'))} B/record over idle "
                        f"({num(leader['baseline'].get('rss_mb'), 1)} MB)",
                    )
                )
        if s5.get("error"):
            rows.append(("S5 leader", "n/a", s5["error"][:100]))
        engine = s5.get("engine", {})
        for key, label in (
            ("own_runs", "worst case, every record its own run"),
            ("batches", "fetched in batches of 500"),
        ):
            e = engine.get(key)
            if e:
                rows.append(
                    (
                        f"S5 engine B/record ({label})",
                        num(e["bytes_per_record"], 1),
                        "target <= 200",
                    )
                )
    width = max((len(r[0]) for r in rows), default=10)
    width2 = max((len(r[1]) for r in rows), default=10)
    lines = [f"{'scenario':<{width}}  {'figure':<{width2}}  note", "-" * (width + width2 + 40)]
    lines += [f"{a:<{width}}  {b:<{width2}}  {c}" for a, b, c in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


#: Seconds each scenario needs at least (its reserve while earlier scenarios run).
MIN_SECONDS = {"S1": 120.0, "S2": 150.0, "S3": 45.0, "S4": 35.0, "S5": 40.0}
SCENARIOS = {
    "S1": scenario_s1,
    "S2": scenario_s2,
    "S3": scenario_s3,
    "S4": scenario_s4,
    "S5": scenario_s5,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="S1 records (default 200000)")
    p.add_argument("--scenarios", default="S1,S2,S3,S4,S5", help="comma-separated subset")
    p.add_argument(
        "--s1-variants",
        default="abcdewl",
        help="S1 variants: a-e as in the issue, w = queueflow concurrency sweep, "
        "l = queueflow with 1 'all' + 3 'member' workers (default abcdewl)",
    )
    p.add_argument(
        "--s1-timeout",
        type=float,
        default=200.0,
        help="seconds each S1/S4 variant may take once started",
    )
    p.add_argument(
        "--s4-records", type=int, default=None, help="S4 records (default: --records / 2)"
    )
    p.add_argument("--s2-consumers", default="1,2,4,8,16,32")
    p.add_argument("--no-s2-faust", dest="s2_faust", action="store_false")
    p.add_argument(
        "--qf-layout",
        choices=("leader", "all"),
        default="leader",
        help="S1/S3/S4 queueflow processes: a leader worker + 4 'member' workers "
        "(leader), or 1 'all' + 3 'member' workers (all)",
    )
    p.add_argument(
        "--qf-concurrency",
        type=int,
        default=1,
        help="share agent handler concurrency per process in S1(a)/S3/S4 (default 1, the "
        "share_agent default; S1(w) measures others)",
    )
    p.add_argument(
        "--s3-fallback-rate",
        type=float,
        default=1000.0,
        help="S1 queueflow rate to assume when S1 did not run",
    )
    p.add_argument(
        "--profile", action="store_true", help="py-spy the leader/member processes during S1(a)"
    )
    p.add_argument(
        "--profile-seconds",
        type=float,
        default=120.0,
        help="upper bound; py-spy stops when S1(a) finishes",
    )
    p.add_argument(
        "--faust-loglevel",
        choices=("info", "warn"),
        default="info",
        help="-l of every Faust worker (warn turns on Faust's spinner, which sets the "
        "root logger to DEBUG)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=780.0,
        help="overall seconds: timeouts shrink and optional runs (S1 w/l, S2 Faust, "
        "S3 10%%) are skipped to stay within it (default 780)",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the broker's and workers' data directories too",
    )
    args = p.parse_args(argv)
    args.scenarios = [s.strip().upper() for s in args.scenarios.split(",") if s.strip()]
    args.s1_variants = list(args.s1_variants)
    args.s2_consumers = [int(x) for x in args.s2_consumers.split(",") if x.strip()]
    if args.s4_records is None:
        args.s4_records = max(args.records // 2, 1000)
    return args


def machine() -> dict[str, Any]:
    from queueflow.devtools.broker import KAFKA_VERSION

    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kafka": KAFKA_VERSION,
    }
    with contextlib.suppress(OSError):
        info["loadavg_before"] = os.getloadavg()
    with contextlib.suppress(ImportError):
        import aiokafka
        import faust

        info["faust"] = faust.__version__
        info["aiokafka"] = aiokafka.__version__
    with contextlib.suppress(Exception):  # read-only git queries: which code was measured

        def git(*argv: str) -> str:
            return subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()

        info["git_commit"] = git("rev-parse", "--short", "HEAD")
        info["queueflow_uncommitted_changes"] = bool(git("status", "--porcelain", "queueflow"))
    with_model = (
        [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
        if Path("/proc/cpuinfo").exists()
        else []
    )
    if with_model:
        info["cpu"] = with_model[0].split(":", 1)[1].strip()
    return info


def main(argv: list[str] | None = None) -> int:
    global FAUST_LOGLEVEL
    args = parse_args(argv)
    FAUST_LOGLEVEL = args.faust_loglevel
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    run_dir = ROOT / ".queueflow" / "bench" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    broker: LocalBroker | None = None
    bootstrap = bootstrap_from_env()
    results: dict[str, Any] = {
        "run_id": run_id,
        "machine": machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    started = time.monotonic()
    try:
        if bootstrap is None:
            port, cport = find_free_ports(2)
            broker = LocalBroker(run_dir / "broker", port=port, controller_port=cport)
            print(
                f"starting a local Kafka broker on 127.0.0.1:{port} ({run_dir / 'broker'})",
                flush=True,
            )
            broker.start(timeout_s=120)
            bootstrap = broker.bootstrap
        results["broker"] = {"bootstrap": bootstrap, "local": broker is not None}
        ctx = Context(bootstrap, run_dir, args)
        ctx.broker_pid = broker.pid() if broker is not None else None
        ctx.results = results
        for index, name in enumerate(args.scenarios):
            if name not in SCENARIOS:
                print(f"unknown scenario {name}; known: {', '.join(SCENARIOS)}")
                continue
            ctx.reserve = sum(MIN_SECONDS.get(later, 0) for later in args.scenarios[index + 1 :])
            t0 = time.monotonic()
            load = os.getloadavg()[0]  # other work on the machine skews every figure
            results[name] = guarded(lambda name=name: SCENARIOS[name](ctx))
            results[name]["scenario_s"] = round(time.monotonic() - t0, 1)
            results[name]["loadavg_1min"] = [round(load, 2), round(os.getloadavg()[0], 2)]
            ctx.say(f"{name} done in {results[name]['scenario_s']} s")
            write(args.out, results)
    finally:
        results["total_s"] = round(time.monotonic() - started, 1)
        with contextlib.suppress(OSError):
            results["machine"]["loadavg_after"] = os.getloadavg()
        if broker is not None:
            broker.stop(timeout_s=30)
            if not args.keep_logs:
                broker.wipe()
        if not args.keep_logs:  # Faust/RocksDB data dirs; logs, stats and profiles stay
            for data in [
                *run_dir.glob("*/data-*"),
                *run_dir.glob("*/leader-data"),
                *run_dir.glob("*-leader-data"),
            ]:
                shutil.rmtree(data, ignore_errors=True)
        write(args.out, results)
    print()
    print(table(results))
    print(f"\nresults: {args.out} (logs: {run_dir}); total {results['total_s']} s")
    return 0


def write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
