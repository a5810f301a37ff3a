"""S4 redelivery: RELEASE 10 % of the records once; the overhead against S1(a)."""

from __future__ import annotations

from typing import Any

from bench import harness
from bench.context import RECORD_SIZE, S1_PARTITIONS, S1_PROCESSES, Context, guarded
from bench.variants import run_queueflow
from queueflow.devtools.broker import create_topic

__all__ = ["scenario_s4"]


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
