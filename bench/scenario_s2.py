"""S2 scaling past partitions: 1 partition, a handler that awaits 10 ms, 1..32 consumers."""

from __future__ import annotations

from typing import Any

from bench import harness
from bench.context import (
    RECORD_SIZE,
    S2_FAUST_LAYOUTS,
    S2_LAYOUTS,
    S2_SECONDS,
    Context,
    guarded,
)
from bench.harness import Fleet
from bench.measure import start_leader
from bench.report import fmt_rate
from bench.variants import run_faust, run_queueflow
from queueflow.devtools.broker import create_topic

__all__ = ["scenario_s2"]


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
