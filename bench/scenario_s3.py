"""S3 latency: records produced at fixed rates (2,500 and 10,000 records/s), produce → handler
start and produce → acknowledgement answered, over a window after a warm-up."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.context import RECORD_SIZE, S1_PARTITIONS, S1_PROCESSES, Context, guarded
from bench.harness import Fleet, percentiles, read_json
from bench.variants import run_queueflow
from queueflow.devtools.broker import create_topic

__all__ = ["latency_run", "paced_produce", "scenario_s3"]


def scenario_s3(ctx: Context) -> dict[str, Any]:
    """Latency at fixed produce rates (``--s3-rates``, default 2,500 and 10,000 records/s):
    a warm-up, then a measured window; percentiles of the records produced in the window."""
    warmup, window = ctx.args.s3_warmup, ctx.args.s3_window
    out: dict[str, Any] = {
        "rates": ctx.args.s3_rates,
        "warmup_s": warmup,
        "window_s": window,
        "layout": ctx.args.qf_layout,
        "concurrency": ctx.args.qf_concurrency,
        "runs": {},
    }
    for rate in ctx.args.s3_rates:
        label = f"{rate:g}"
        if out["runs"] and not ctx.affordable(40 + warmup + window, f"S3 at {label}/s", out):
            continue
        ctx.say(f"S3: {rate:,.0f} records/s, {warmup:g} s warm-up + {window:g} s window ...")
        run = guarded(lambda rate=rate, label=label: latency_run(ctx, label, rate))
        out["runs"][label] = run
        ctx.say(
            f"S3 {label}/s: handler start p50/p99/p99.9 "
            f"{run.get('to_handler_ms', {}).get('p50')}/{run.get('to_handler_ms', {}).get('p99')}/"
            f"{run.get('to_handler_ms', {}).get('p999')} ms"
            + (f" [{run['error']}]" if run.get("error") else "")
        )
    return out


def latency_run(ctx: Context, label: str, rate: float) -> dict[str, Any]:
    """``rate`` records/s for warm-up + window seconds into a fresh topic, queueflow members
    (per-record handler) consuming; samples of records produced after the warm-up."""
    warmup, window = ctx.args.s3_warmup, ctx.args.s3_window
    count = int(rate * (warmup + window))
    topic = ctx.uid("s3")
    create_topic(ctx.bootstrap, topic, S1_PARTITIONS)
    produced: dict[str, Any] = {}

    def produce_during(fleet: Fleet) -> None:
        # A running queue's latency, not a cold start's: produce once every member has had an
        # empty long poll answered (its share-partitions exist and its fetches are parked).
        members = [w for w in fleet.workers if not w.name.startswith("leader")]
        warm = fleet.wait(
            lambda stats: all((s.get("timings") or {}).get("empty_fetches") for s in stats),
            30,
            members=members,
        )
        produced["window_from"] = time.time() + warmup
        produced.update(paced_produce(ctx.bootstrap, topic, count, rate, S1_PARTITIONS))
        produced["warm"] = warm

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
        run_timeout_s=ctx.timeout(warmup + window + 30),
        during=produce_during,
    )
    out: dict[str, Any] = {
        "rate_target": round(rate, 1),
        "warmup_s": warmup,
        "window_s": window,
        "records": count,
        "produce_rate": produced.get("rate"),
        "members_warm_before_producing": produced.get("warm"),
        "finished": result.get("records"),
        "error": result.get("error"),
        "timings": result.get("timings"),
    }
    samples: dict[str, list[float]] = {"to_handler": [], "to_ack": [], "to_handler_record_ts": []}
    since = produced.get("window_from", 0.0)
    for path in result.get("samples", []):
        data = read_json(Path(path)) or {}
        where = data.get("to_handler_where", [])
        for key, at in (
            ("to_handler", [w[0] for w in where]),
            ("to_handler_record_ts", [w[0] for w in where]),
            ("to_ack", data.get("to_ack_produced", [])),
        ):
            values = data.get(key, [])
            if len(at) == len(values):  # keep the records produced in the window
                values = [v for v, t in zip(values, at, strict=True) if t >= since]
            samples[key].extend(values)
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
