"""The consumers S1..S4 compare: queueflow share agents, plain Faust, raw aiokafka, native
share groups (confluent-kafka's ShareConsumer and Kafka's Java ShareConsumerPerformance)."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping
from typing import Any

from bench import harness
from bench.context import S1_PROCESSES, Context
from bench.harness import PYTHON, Fleet, rss_bytes
from bench.measure import balanced, faust_argv, measure_fleet, qf_env, stable, start_leader
from bench.profiling import finish_profilers, start_profilers
from queueflow.devtools.broker import run_kafka_tool

__all__ = [
    "confluent_share_support",
    "parse_java_perf",
    "run_faust",
    "run_java_perf",
    "run_native",
    "run_queueflow",
    "run_raw",
    "set_share_earliest",
]


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
    settings_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """queueflow share agents in Faust worker processes (``bench.qf_app``).

    ``layout``: ``leader`` = a leader-only worker plus ``processes`` member workers (the
    default); ``all`` = the first of ``processes`` workers has role ``all`` (coordinator,
    leaders and a share agent), the others role ``member``. ``leader_app``: use the running
    leader of that app id instead of starting one. ``window_s``: stop after that many seconds
    and report the rate so far (for slow configurations). ``settings_env``: extra environment
    of every worker started here (settings as ``QUEUEFLOW_...`` variables).
    """
    app_id, group = leader_app or ctx.uid(name), f"g-{name}"
    run_dir = ctx.run_dir / name
    with Fleet(run_dir) as fleet:
        leader = None
        roles = ["member"] * processes
        if layout == "leader" and leader_app is None:
            leader = leader_worker = start_leader(
                ctx, fleet, app_id, [topic], partitions, run_dir, **(settings_env or {})
            )
        elif layout == "all":
            roles[0] = "all"
        members = []
        for i, role in enumerate(roles):
            env = qf_env(ctx, app_id, topic, group, role, concurrency, mode, **(settings_env or {}))
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
