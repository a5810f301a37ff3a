"""The consumers S1..S4 compare: queueflow share agents, plain Faust, raw aiokafka, native
share groups (confluent-kafka's ShareConsumer). Kafka's Java perf tool is S11's
(bench.scenario_s11)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from bench import harness
from bench.context import Context
from bench.harness import PYTHON, Fleet, rss_bytes
from bench.measure import balanced, faust_argv, measure_fleet, qf_env, stable, start_leader
from bench.profiling import finish_profilers, start_profilers
from queueflow.devtools.broker import run_kafka_tool

__all__ = [
    "confluent_share_support",
    "run_faust",
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
