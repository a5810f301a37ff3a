"""S3 latency: records produced at 50 % (and 10 %) of S1's queueflow throughput."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.context import RECORD_SIZE, S1_PARTITIONS, S1_PROCESSES, S3_SECONDS, Context, guarded
from bench.harness import Fleet, percentiles, read_json
from bench.variants import run_queueflow
from queueflow.devtools.broker import create_topic

__all__ = ["latency_run", "paced_produce", "scenario_s3"]


def scenario_s3(ctx: Context) -> dict[str, Any]:
    s1_rate = ctx.results.get("S1", {}).get("a", {}).get("rate") or ctx.args.s3_fallback_rate
    out: dict[str, Any] = {
        "s1_queueflow_rate": s1_rate,
        "layout": ctx.args.qf_layout,
        "concurrency": ctx.args.qf_concurrency,
        "runs": {},
    }
    for label, share in (("50%", 0.5), ("10%", 0.1)):
        if label != "50%" and not ctx.affordable(35, f"S3 at {label}", out):
            continue
        rate = max(10.0, share * s1_rate)
        ctx.say(
            f"S3 at {label} of S1 queueflow ({s1_rate:.0f}/s): {rate:.0f} records/s for "
            f"{S3_SECONDS:.0f} s ..."
        )
        run = guarded(lambda rate=rate, label=label: latency_run(ctx, label, rate))
        out["runs"][label] = run
        ctx.say(
            f"S3 {label}: handler start p50/p99 {run.get('to_handler_ms', {}).get('p50')}/"
            f"{run.get('to_handler_ms', {}).get('p99')} ms"
        )
    # The figure is the 50 % run; the 10 % run shows the floor without a backlog.
    out.update({k: v for k, v in out["runs"]["50%"].items() if k.endswith("_ms")})
    return out


def latency_run(ctx: Context, label: str, rate: float) -> dict[str, Any]:
    count = int(rate * S3_SECONDS)
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
        run_timeout_s=ctx.timeout(30),
        during=produce_during,
    )
    out: dict[str, Any] = {
        "rate_target": round(rate, 1),
        "records": count,
        "produce_rate": produced.get("rate"),
        "members_warm_before_producing": produced.get("warm"),
        "finished": result.get("records"),
        "error": result.get("error"),
        "timings": result.get("timings"),
    }
    samples: dict[str, list[float]] = {"to_handler": [], "to_ack": [], "to_handler_record_ts": []}
    for path in result.get("samples", []):
        data = read_json(Path(path)) or {}
        for key in samples:
            samples[key].extend(data.get(key, []))
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
