"""S1 throughput as interleaved rounds over steady-state windows.

One topic of ``--s1-topic-records`` records of 1 KiB on 4 partitions is produced once; every run
reads it from its start in a group of its own (a fresh queueflow app and share group, a fresh
native share group with ``share.auto.offset.reset=earliest``, a fresh raw consumer group). Each
round runs every variant of :mod:`bench.s1_runs` once, in the order of ``--s1-variants`` in
even rounds and reversed in odd ones (:func:`bench.steady.round_orders`); ``--pairs`` rounds.
Figures: per variant the median and min..max of its rounds' rates and CPU per record; per
comparison the median (and min..max) of the per-round ratios.
"""

from __future__ import annotations

import time
from typing import Any

from bench import harness
from bench.context import RECORD_SIZE, S1_PARTITIONS, Context, guarded
from bench.s1_runs import LABELS, VARIANTS, Steady, run_variant
from bench.steady import pair_ratios, round_orders, summary
from queueflow.devtools.broker import create_topic

__all__ = ["COMPARISONS", "paired_rounds", "produce_s1_topic", "scenario_s1"]

#: name -> (numerator variant, denominator variant, figure compared)
COMPARISONS = {
    "batch_vs_native": ("qf_batch", "native_batch", "rate"),
    "record_vs_native": ("qf_record", "native_record", "rate"),
    "batch_vs_raw": ("qf_batch", "raw", "rate"),
    "uvloop_vs_asyncio": ("qf_batch_uvloop", "qf_batch", "rate"),
    # S4: CPU per handler call with 10 % RELEASEd against without
    "release10_cpu_per_delivery": ("qf_release10", "qf_record", "qf_cpu_us_per_delivery"),
}


def produce_s1_topic(ctx: Context, records: int) -> dict[str, Any]:
    """Create and fill the S1 topic once (librdkafka producer); its name and the time taken."""
    topic = ctx.uid("s1")
    create_topic(ctx.bootstrap, topic, S1_PARTITIONS)
    ctx.say(
        f"S1: producing {records:,} records of {RECORD_SIZE} B "
        f"({records * RECORD_SIZE / 2**30:.2f} GiB) to {topic} ({S1_PARTITIONS} partitions)"
    )
    seconds = harness.produce(
        ctx.bootstrap, topic, records, RECORD_SIZE, S1_PARTITIONS, timeout_s=900
    )
    ctx.say(f"S1: produced in {seconds:.1f} s ({records / seconds:,.0f} records/s)")
    return {"topic": topic, "records": records, "produce_s": round(seconds, 1)}


def paired_rounds(
    ctx: Context, topic: str, variants: list[str], rounds: int, steady: Steady, out: dict[str, Any]
) -> None:
    """Run ``rounds`` interleaved rounds of ``variants`` into ``out`` (``runs``: per variant the
    list of its rounds' results; ``rounds``: per round each variant's figures; ``orders``).
    A round is started only when the budget leaves as long as the longest round so far."""
    orders = round_orders(variants, rounds)
    out.setdefault("runs", {k: [] for k in variants})
    out.setdefault("rounds", [])
    out["orders"] = []
    longest = 0.0
    for index, order in enumerate(orders):
        if index and not ctx.affordable(longest, f"round {index + 1} of {rounds}", out):
            break
        t0 = time.monotonic()
        figures: dict[str, Any] = {}
        for key in order:
            ctx.say(f"round {index + 1}/{rounds}: {key} ({LABELS[key]}) ...")
            result = guarded(lambda key=key: run_variant(ctx, key, topic, steady))
            out["runs"][key].append(result)
            figures[key] = {
                "rate": result.get("rate") if not result.get("error") else None,
                "client_cpu_us": result.get("client_cpu_us"),
                "qf_cpu_us_per_delivery": result.get("qf_cpu_us_per_delivery"),
            }
            ctx.say(
                f"  {key}: {result.get('rate') or 0:,.0f} records/s, client CPU "
                f"{result.get('client_cpu_us')} us/record"
                + (f" [{result['error']}]" if result.get("error") else "")
            )
        out["rounds"].append(figures)
        out["orders"].append(order)
        longest = max(longest, time.monotonic() - t0)


def summarize(out: dict[str, Any]) -> None:
    """``variants`` (median and min..max of rate and CPU per record), ``cpu`` (client CPU
    medians), ``ratios`` (per comparison whose variants both ran) from ``out['runs']``."""
    runs: dict[str, list[dict[str, Any]]] = out.get("runs", {})
    out["variants"] = {}
    out["cpu"] = {}
    for key, results in runs.items():
        ok = [r for r in results if not r.get("error")]
        out["variants"][key] = {
            "label": LABELS[key],
            "rate": summary([r.get("rate") for r in ok], 1),
            "client_cpu_us": summary([r.get("client_cpu_us") for r in ok], 2),
            "leader_cpu_us": summary([r.get("leader_cpu_us") for r in ok], 2),
            "broker_cpu_us": summary([r.get("broker_cpu_us") for r in ok], 2),
            "errors": [r["error"] for r in results if r.get("error")],
        }
        out["cpu"][key] = out["variants"][key]["client_cpu_us"]
    out["ratios"] = {}
    for name, (a, b, figure) in COMPARISONS.items():
        if a not in runs or b not in runs:
            continue
        per_round = [{k: v.get(figure) for k, v in r.items()} for r in out.get("rounds", [])]
        out["ratios"][name] = summary(pair_ratios(per_round, a, b), 3)
        out["ratios"][name]["of"] = f"{a} / {b} ({figure})"


def scenario_s1(ctx: Context) -> dict[str, Any]:
    args = ctx.args
    out: dict[str, Any] = produce_s1_topic(ctx, args.s1_topic_records)
    variants = list(args.s1_variants)
    if "S4" in args.scenarios and "qf_release10" not in variants and "qf_record" in variants:
        variants.append("qf_release10")  # S4's figure, interleaved with qf_record
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown S1 variants {unknown}; known: {', '.join(VARIANTS)}")
    steady = Steady(args.warmup, args.window, args.s1_topic_records)
    out.update(
        pairs=args.pairs,
        warmup_s=args.warmup,
        window_s=args.window,
        variants_order=variants,
        acquisition_rate="share.member.max.acquisition.rate=0 (unlimited) for S1",
    )
    ctx.results["S1"] = out  # S4 reads the runs while later rounds go on
    paired_rounds(ctx, out["topic"], variants, args.pairs, steady, out)
    summarize(out)
    for name, r in out["ratios"].items():
        ctx.say(f"S1 {name}: median {r['median']} (min..max {r['min']}..{r['max']}, n {r['n']})")
    return out
