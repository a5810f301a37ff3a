"""The S1 variants measured over steady-state windows (:func:`bench.steady.measure_window`),
each reading the same pre-produced topic from its start in a group of its own.

==================  ===========================================================================
``qf_batch``        queueflow share agent, ``batch=True``, a no-op batch handler (asyncio loop)
``qf_batch_uvloop`` the same with every worker on uvloop (Faust's ``-L uvloop``)
``qf_record``       queueflow share agent, a per-record no-op handler (asyncio loop)
``qf_release10``    ``qf_record`` RELEASEing offsets ``% 10 == 0`` on their first delivery (S4)
``native_batch``    confluent-kafka ``ShareConsumer``, iterating the list ``poll`` returns
``native_record``   the same, calling a Python function per record
``raw``             raw aiokafka consumer group, no processing (the ceiling)
==================  ===========================================================================

Counted: queueflow and native, records whose acknowledgement the leader/broker answered
(ACCEPT; implicit acknowledgement for native); raw, records consumed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench.context import S1_PARTITIONS, S1_PROCESSES, Context
from bench.harness import PYTHON, Fleet
from bench.measure import balanced, faust_argv, qf_env, stable, start_leader
from bench.steady import measure_window
from bench.variants import confluent_share_support, set_share_earliest

__all__ = ["LABELS", "VARIANTS", "Steady", "run_variant"]

#: ``share.member.max.acquisition.rate`` (records/s per member per share-partition) is lifted
#: for S1 (0 = unlimited): its default (20,000) would cap 4 partitions at 80,000 records/s, and
#: the cap, not queueflow, would be what S1 measures.
S1_SETTINGS = {"QUEUEFLOW_SHARE_MEMBER_MAX_ACQUISITION_RATE": "0"}

VARIANTS: dict[str, dict[str, Any]] = {
    "qf_batch": {"kind": "qf", "batch": True, "loop": "aio", "mode": "noop"},
    "qf_batch_uvloop": {"kind": "qf", "batch": True, "loop": "uvloop", "mode": "noop"},
    "qf_record": {"kind": "qf", "batch": False, "loop": "aio", "mode": "noop"},
    "qf_release10": {"kind": "qf", "batch": False, "loop": "aio", "mode": "release10"},
    "native_batch": {"kind": "native", "mode": "batch"},
    "native_record": {"kind": "native", "mode": "record"},
    "raw": {"kind": "raw"},
}
LABELS = {
    "qf_batch": "queueflow share agent, batch handler (asyncio)",
    "qf_batch_uvloop": "queueflow share agent, batch handler (uvloop)",
    "qf_record": "queueflow share agent, per-record handler",
    "qf_release10": "queueflow per-record handler, RELEASE 10 % once",
    "native_batch": "native ShareConsumer (confluent-kafka), iterating the batch",
    "native_record": "native ShareConsumer, a Python call per record",
    "raw": "raw aiokafka consumer group",
}


@dataclass(frozen=True)
class Steady:
    """One window's timing: seconds of warm-up after every consumer is flowing, seconds
    counted, and the records on the topic (to detect a drained topic)."""

    warmup_s: float
    window_s: float
    available: int


def run_variant(ctx: Context, key: str, topic: str, steady: Steady) -> dict[str, Any]:
    """One run of variant ``key`` (:data:`VARIANTS`) over ``topic`` (S1_PARTITIONS partitions,
    S1_PROCESSES consumer processes): its window's figures (see ``measure_window``)."""
    spec = VARIANTS[key]
    name = ctx.uid(f"s1-{key}")
    run_dir = ctx.run_dir / name
    window = {
        "warmup_s": steady.warmup_s,
        "window_s": steady.window_s,
        "available": steady.available,
    }
    if spec["kind"] == "native":
        support = confluent_share_support()
        if not support["available"]:
            return {"error": support["why"]}
        error = set_share_earliest(ctx, name)
        if error:
            return {"error": error}
    with Fleet(run_dir) as fleet:
        if spec["kind"] == "qf":
            members = _queueflow(ctx, fleet, name, topic, spec, S1_SETTINGS)
            ready = stable(balanced(S1_PARTITIONS, S1_PROCESSES), 1.5)
            key_counted = "done"
        elif spec["kind"] == "native":
            env = dict(
                os.environ,
                BENCH_BROKER=ctx.bootstrap,
                BENCH_TOPIC=topic,
                BENCH_GROUP=name,
                BENCH_NATIVE_MODE=spec["mode"],
            )
            members = [
                fleet.add(f"native-{i}", [PYTHON, "-m", "bench.native_consumer"], env)
                for i in range(S1_PROCESSES)
            ]
            # subscribed; the assignment is observed as "flowing" (measure_window, step 3)
            ready = stable(lambda s: all(x.get("ready") for x in s), 0.5)
            key_counted = "done"
        else:
            env = dict(os.environ, BENCH_BROKER=ctx.bootstrap, BENCH_TOPIC=topic, BENCH_GROUP=name)
            members = [
                fleet.add(f"raw-{i}", [PYTHON, "-m", "bench.raw_consumer"], env)
                for i in range(S1_PROCESSES)
            ]
            ready = stable(balanced(S1_PARTITIONS, S1_PROCESSES), 1.0)
            key_counted = "done"
        result = measure_window(
            ctx, fleet, members, ready, start_timeout_s=90, key=key_counted, **window
        )
        if spec["kind"] == "qf":
            result["loops"] = sorted({str(w.stats().get("loop")) for w in members})
    if spec["kind"] == "qf":
        # CPU per handler call of the whole queueflow side (members + leader): S4's figure
        cpu = result.get("cpu_s") or {}
        delivered = result.get("delivered") or 0
        if delivered:
            own = sum(v for k, v in cpu.items() if k != "broker")
            result["qf_cpu_us_per_delivery"] = round(1e6 * own / delivered, 2)
    return result


def _queueflow(
    ctx: Context,
    fleet: Fleet,
    name: str,
    topic: str,
    spec: Mapping[str, Any],
    settings_env: Mapping[str, str],
) -> list[Any]:
    """A leader worker and S1_PROCESSES member workers of a fresh app (its own share group)."""
    run_dir = fleet.run_dir
    loop = spec["loop"]
    start_leader(ctx, fleet, name, [topic], S1_PARTITIONS, run_dir, loop, **settings_env)
    members = []
    for i in range(S1_PROCESSES):
        env = qf_env(ctx, name, topic, f"g-{name}", "member", 1, spec["mode"], **settings_env)
        env["BENCH_BATCH"] = "1" if spec["batch"] else "0"
        argv = faust_argv("bench.qf_app", run_dir / f"data-{i}", loop)
        members.append(fleet.add(f"member-{i}", argv, env))
    return members
