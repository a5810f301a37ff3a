"""S5 memory: leader RSS with 2,000 and 10,000 in-flight records per partition, and the
engine's bytes per in-flight record."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

from bench import harness
from bench.context import S1_PARTITIONS, Context
from bench.harness import PYTHON, ROOT, rss_bytes
from queueflow.devtools.broker import create_topic

__all__ = ["engine_memory", "scenario_s5"]


def scenario_s5(ctx: Context) -> dict[str, Any]:
    from queueflow.testing import LeaderWorker

    partitions, per_partition = S1_PARTITIONS, 10_000
    topic = ctx.uid("s5")
    create_topic(ctx.bootstrap, topic, partitions)
    harness.produce(ctx.bootstrap, topic, partitions * per_partition, 100, partitions)
    app_id = ctx.uid("s5")
    settings = {
        "share.auto.offset.reset": "earliest",
        "group.share.partition.max.record.locks": 10_000,
        "group.share.record.lock.duration.ms": 600_000,
        "group.share.max.record.lock.duration.ms": 600_000,
        # one member acquires all 10,000 per partition: lift the per-member limits
        "share.member.max.in.flight.records": 10_000,
        "share.member.max.acquisition.rate": 0,
    }
    out: dict[str, Any] = {"partitions": partitions, "leader_settings": settings}
    leader = LeaderWorker(
        app_id,
        [topic],
        ctx.bootstrap,
        ctx.run_dir / "s5-leader-data",
        settings,
        log_path=ctx.run_dir / "s5-leader.log",
    )
    ctx.say("S5: leader RSS with 2,000 and 10,000 in-flight records per partition ...")
    try:
        leader.start(timeout_s=90)
        assert leader.process is not None
        out["leader"] = asyncio.run(
            asyncio.wait_for(s5_acquire(ctx, app_id, topic, partitions, leader.process.pid), 120)
        )
    except Exception as exc:
        out["error"] = repr(exc)[:500]
    finally:
        leader.stop(timeout_s=10)
    out["engine"] = engine_memory()
    return out


async def s5_acquire(
    ctx: Context, app_id: str, topic: str, partitions: int, pid: int
) -> dict[str, Any]:
    from queueflow.kafka.config import KafkaClientConfig
    from queueflow.member.context import MemberContext
    from queueflow.member.session import ShareFetchSession
    from queueflow.settings import ShareGroupSettings
    from queueflow.structs import TopicPartition

    settings = ShareGroupSettings.load(
        {"max.poll.records": 10_000, "queueflow.request.timeout.ms": 30_000}
    )
    member = MemberContext.for_kafka(KafkaClientConfig(ctx.bootstrap), app_id, settings)
    # Raw ShareFetch requests (the session's _request): S5 measures the leader holding records
    # in flight, so nothing is read and nothing acknowledged until the fragmenting step.
    client = ShareFetchSession(member, "memory", [topic], "bench-s5", lock_duration_ms=600_000)
    await client.start()
    steps: dict[str, Any] = {}
    try:

        async def fetch_all(n: int) -> int:
            got = 0
            for p in range(partitions):
                response, _ = await client._request(TopicPartition(topic, p), n, [])
                got += sum(last - first + 1 for first, last, _ in response.acquired)
            return got

        async def rss() -> float:
            values = []
            for _ in range(6):
                await asyncio.sleep(0.5)
                values.append(rss_bytes(pid) or 0)
            return max(values)

        await fetch_all(0)  # initialise the share-partitions, acquire nothing
        steps["baseline"] = {"in_flight_per_partition": 0, "rss": await rss()}
        got = await fetch_all(2_000)
        steps["2000"] = {"in_flight_per_partition": got // partitions, "rss": await rss()}
        got += await fetch_all(8_000)
        steps["10000"] = {"in_flight_per_partition": got // partitions, "rss": await rss()}
        # Worst case for the engine: ACCEPT every other record, so each in-flight record is a
        # run of its own (5,000 Acquired + 5,000 Acknowledged interleaved per partition).
        for p in range(partitions):
            start = await client_start_offset(ctx.bootstrap, topic, p)
            acks = [(o, o, (1,)) for o in range(start + 1, start + 10_000, 2)]
            await client._request(TopicPartition(topic, p), 0, acks)
        steps["10000_fragmented"] = {
            "in_flight_per_partition": 10_000,
            "runs_per_partition": 10_000,
            "rss": await rss(),
        }
    finally:
        await client.close(leave=False)
    base = steps["baseline"]["rss"]
    for key in ("2000", "10000", "10000_fragmented"):
        step = steps[key]
        step["rss_mb"] = round(step["rss"] / 2**20, 1)
        records = step["in_flight_per_partition"] * partitions
        step["delta_bytes_per_record"] = (
            round((step["rss"] - base) / records, 1) if records else None
        )
    steps["baseline"]["rss_mb"] = round(base / 2**20, 1)
    return steps


async def client_start_offset(bootstrap: str, topic: str, partition: int) -> int:
    """The log start offset of ``topic[partition]`` (where the share-partition began)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        return int((await consumer.beginning_offsets([tp]))[tp])
    finally:
        await consumer.stop()


def engine_memory() -> dict[str, Any]:
    """bench/bench_engine_memory.py's scenarios, in a subprocess (tracemalloc is slow)."""
    code = (
        "import json, bench.bench_engine_memory as m\n"
        "out = {}\n"
        "for key, eng, base in (('own_runs', m.engine_own_runs, m.baseline_own_runs),"
        " ('batches', m.engine_batches, m.baseline_batches)):\n"
        "    used, sp = m.measure(eng)\n"
        "    b, _ = m.measure(base)\n"
        "    out[key] = {'runs': sp.run_count, 'bytes_per_record': round(used / m.N, 1),"
        " 'baseline_bytes_per_record': round(b / m.N, 1)}\n"
        "print(json.dumps(out))\n"
    )
    try:
        proc = subprocess.run(
            [PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return {"error": repr(exc)[:300]}
