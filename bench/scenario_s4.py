"""S4 redelivery: CPU per delivery with 10 % of the records RELEASEd once, against the same
per-record handler without releases, as interleaved rounds over steady-state windows.

The runs are S1's ``qf_release10`` and ``qf_record`` (``bench.s1_runs``) when S1 ran them;
otherwise S4 produces the S1 topic and runs its own ``--s4-pairs`` rounds of the two.
``cpu_overhead_pct``: (median of the per-round ratios of queueflow CPU, members + leader, per
handler call) - 1, in %. Ideal: 0 (a redelivery costs what a delivery costs).
"""

from __future__ import annotations

from typing import Any

from bench.context import Context
from bench.s1_runs import Steady
from bench.scenario_s1 import paired_rounds, produce_s1_topic, summarize

__all__ = ["scenario_s4"]


def scenario_s4(ctx: Context) -> dict[str, Any]:
    s1 = ctx.results.get("S1") or {}
    ratio = (s1.get("ratios") or {}).get("release10_cpu_per_delivery")
    if ratio and ratio.get("median") is not None:
        out: dict[str, Any] = {"source": "S1 rounds (qf_release10 / qf_record)", "ratio": ratio}
    else:
        args = ctx.args
        records = args.s1_topic_records
        out = {"source": "own rounds"} | produce_s1_topic(ctx, records)
        paired_rounds(
            ctx,
            out["topic"],
            ["qf_record", "qf_release10"],
            args.s4_pairs,
            Steady(args.warmup, args.window, records),
            out,
        )
        summarize(out)
        ratio = out["ratios"].get("release10_cpu_per_delivery") or {}
        out["ratio"] = ratio
    median = ratio.get("median")
    out["cpu_overhead_pct"] = round(100 * (median - 1), 1) if median is not None else None
    if median is None:
        out["error"] = "no pair with both runs measured"
    ctx.say(f"S4: CPU per delivery overhead at 10 % RELEASEd: {out['cpu_overhead_pct']} %")
    return out
