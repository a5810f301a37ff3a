"""S1 throughput: N records of 1 KiB on a 4-partition topic, no-op handler, 4 consumer
processes; queueflow against raw aiokafka, plain Faust and native share groups."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import harness
from bench.context import (
    RECORD_SIZE,
    S1_PARTITIONS,
    S1_PROCESSES,
    S1_SWEEP,
    S1_SWEEP_WINDOW_S,
    Context,
    guarded,
)
from bench.harness import Fleet
from bench.measure import start_leader
from bench.report import fmt_rate
from bench.variants import run_faust, run_java_perf, run_native, run_queueflow, run_raw
from queueflow.devtools.broker import create_topic

__all__ = ["scenario_s1"]


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
    need = {"b": 15, "a": 40, "w": 75, "u": 45, "h": 45, "l": 40, "c": 40, "d": 20, "e": 25}

    def timeout(key: str) -> float:
        # what this variant may take, leaving the minimum of the variants run after it
        order = "bawuhlcde"
        later = sum(need[k] for k in order[order.index(key) + 1 :] if k in only)
        return max(ctx.timeout(ctx.args.s1_timeout + later) - later, 20.0)

    def run(key: str, label: str, fn: Callable[[], dict[str, Any]]) -> None:
        if key not in only:
            return
        if key in "wuhl" and not ctx.affordable(
            need[key] + need.get("c", 0) + need["d"] + need["e"], f"S1({key})", out
        ):
            return
        ctx.say(f"S1({key}) {label} ...")
        result = guarded(fn)
        result["label"] = label
        out[key] = result
        ctx.say(f"S1({key}) {fmt_rate(result)}")

    def leader_layout(key: str, **extra: Any) -> dict[str, Any]:
        """(a)'s configuration: share agents in S1_PROCESSES member workers, a leader worker."""
        return run_queueflow(
            ctx,
            f"s1{key}-queueflow",
            topic,
            S1_PARTITIONS,
            n,
            processes=S1_PROCESSES,
            concurrency=conc,
            mode="noop",
            layout="leader",
            run_timeout_s=timeout(key),
            **extra,
        )

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
                    lambda: leader_layout(
                        "a", leader_app=app_id, profile=ctx.args.profile, leader_worker=leader
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

    def own_leader(key: str, label: str, **settings_env: str) -> None:
        """(a) again, with its own leader and members under ``settings_env``."""
        if key not in only or ctx.args.qf_layout != "leader":
            return
        run(key, label, lambda: leader_layout(key, settings_env=settings_env))

    # The cost of queueflow.leader.state.durability=acked (exact delivery counts): (a) with a
    # leader that answers before its changelog writes are acknowledged.
    own_leader(
        "u",
        "queueflow share agent, queueflow.leader.state.durability=buffered",
        QUEUEFLOW_LEADER_STATE_DURABILITY="buffered",
    )
    # The cost of signed control messages: (a) with queueflow.auth.mode=hmac.
    own_leader(
        "h",
        "queueflow share agent, queueflow.auth.mode=hmac",
        QUEUEFLOW_AUTH_MODE="hmac",
        QUEUEFLOW_AUTH_SECRET="bench-7Hq2-Lm9x_Rt4Vn8Kp3Wz6Yc1Bd5Gf0Js",
    )
    if "a" in only and ctx.args.qf_layout != "leader":
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
    if out.get("u", {}).get("rate") and a:
        out["ratio_acked_buffered"] = round(a / out["u"]["rate"], 3)
    if out.get("h", {}).get("rate") and a:
        out["ratio_plain_hmac"] = round(a / out["h"]["rate"], 3)
    if out.get("c", {}).get("rate") and a:
        out["ratio_queueflow_faust"] = round(a / out["c"]["rate"], 3)
    return out
