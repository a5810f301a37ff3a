"""S9 exactly-once: the throughput cost of ``processing_guarantee="exactly_once"`` against
``"at_least_once"``, like for like.

Both variants run the same share agent (``bench.qf_app`` mode ``results``): a no-op handler that
publishes one 64-byte result per record to a sink topic, with a leader-only worker and
``S1_PROCESSES`` member workers on a 4-partition topic. Both are measured the same way, where
the guarantee matters: downstream, by a ``read_committed`` consumer of the sink topic, from the
first result visible to the last. Runs alternate as interleaved pairs (``--s9-pairs``; the
first variant of each pair alternates), each on its own topic and app id; the report gives each
variant's median rate with its spread and the median of the per-pair ratios.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench import harness
from bench.context import RECORD_SIZE, S1_PARTITIONS, S1_PROCESSES, Context, guarded
from bench.harness import Fleet
from bench.measure import balanced, faust_argv, qf_env, stable, start_leader
from queueflow.devtools.broker import create_topic

__all__ = ["scenario_s9"]

VARIANTS = ("at_least_once", "exactly_once")


async def _watch_results(
    bootstrap: str, topic: str, expected: int, timeout_s: float
) -> tuple[int, float | None, float | None]:
    """Read ``topic`` read_committed until ``expected`` results or ``timeout_s``; returns
    (results seen, monotonic time of the first, of the last)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    seen, first, last = 0, None, None
    try:
        tps = [TopicPartition(topic, p) for p in range(S1_PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while seen < expected and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            n = sum(len(records) for records in batches.values())
            if n:
                now = time.monotonic()
                first = first or now
                last = now
                seen += n
    finally:
        await consumer.stop()
    return seen, first, last


def _one_run(ctx: Context, variant: str, n: int, pair: int) -> dict[str, Any]:
    name = f"s9-{pair}-{variant.replace('_', '-')}"
    topic, results = ctx.uid(name), ctx.uid(f"{name}-results")
    create_topic(ctx.bootstrap, topic, S1_PARTITIONS)
    create_topic(ctx.bootstrap, results, S1_PARTITIONS)
    harness.produce(ctx.bootstrap, topic, n, RECORD_SIZE, S1_PARTITIONS)
    app_id = ctx.uid(name)
    settings = {"QUEUEFLOW_PROCESSING_GUARANTEE": variant}
    run_dir = ctx.run_dir / name
    with Fleet(run_dir) as fleet:
        start_leader(ctx, fleet, app_id, [topic], S1_PARTITIONS, run_dir, **settings)
        members = []
        for i in range(S1_PROCESSES):
            env = qf_env(
                ctx,
                app_id,
                topic,
                f"g-{name}",
                "member",
                ctx.args.qf_concurrency,
                "results",
                BENCH_RESULTS_TOPIC=results,
                **settings,
            )
            members.append(
                fleet.add(f"member-{i}", faust_argv("bench.qf_app", run_dir / f"m{i}"), env)
            )
        ready = stable(balanced(S1_PARTITIONS, S1_PROCESSES), 1.5)
        if not fleet.wait(ready, 90, members=members):
            return {"error": "members not ready within 90 s"}
        fleet.go()
        seen, first, last = asyncio.run(
            _watch_results(ctx.bootstrap, results, n, ctx.timeout(ctx.args.s1_timeout))
        )
        cpu = fleet.cpu_since_go()
    out: dict[str, Any] = {"variant": variant, "records": n, "results": seen}
    if first is not None and last is not None and last > first:
        out["seconds"] = round(last - first, 3)
        out["rate"] = round(seen / (last - first), 1)
        out["cpu_us_per_record_total"] = round(1e6 * sum(cpu.values()) / max(seen, 1), 1)
    if seen < n:
        out["error"] = f"{seen} of {n} results visible read_committed"
    return out


def scenario_s9(ctx: Context) -> dict[str, Any]:
    n = ctx.args.s9_records
    pairs = ctx.args.s9_pairs
    ctx.say(f"S9: exactly-once against at-least-once, {pairs} interleaved pairs of {n:,} records")
    runs: list[dict[str, Any]] = []
    ratios: list[float] = []
    for pair in range(pairs):
        order = VARIANTS if pair % 2 == 0 else VARIANTS[::-1]
        got = {v: guarded(lambda v=v, p=pair: _one_run(ctx, v, n, p)) for v in order}
        runs.extend(got.values())
        alo, eos = (got[v].get("rate") for v in VARIANTS)
        if alo and eos:
            ratios.append(eos / alo)
        ctx.say(f"  pair {pair + 1}: at_least_once {alo} /s, exactly_once {eos} /s")
    out: dict[str, Any] = {"records": n, "pairs": pairs, "runs": runs}
    for v in VARIANTS:
        rates = [r["rate"] for r in runs if r.get("variant") == v and r.get("rate")]
        if rates:
            out[v] = {
                "median_rate": round(statistics.median(rates), 1),
                "min_rate": min(rates),
                "max_rate": max(rates),
            }
    if ratios:
        out["eos_over_alo_median"] = round(statistics.median(ratios), 3)
        out["eos_over_alo_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return out
