"""Direct-path drain, leaders carrying records (after) against members reading them (before,
``queueflow.leader.record.cache.bytes=0``): records/s and member CPU per record, interleaved
pairs on one broker. Not a test of the suite: run it by path, under the broker lock:
``flock /work/broker.lock timeout 1500 pytest -q -s tests/integration/bench_served_drain.py``."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from pathlib import Path

from queueflow import ShareConsumer
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

RECORDS = 100_000
PAIRS = 5
BASE: dict[str, int | str] = {
    "share.auto.offset.reset": "earliest",
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 6000,
    "share.member.max.acquisition.rate": 0,  # unlimited: the drain, not the token bucket
}
MEMBER = {"group.share.heartbeat.interval.ms": 500, "max.poll.records": 500}


async def drain(bootstrap: str, app_id: str, topic: str) -> tuple[float, float]:
    member = ShareConsumer(
        f"g-{uuid.uuid4().hex[:6]}", app_id=app_id, bootstrap_servers=bootstrap, settings=MEMBER
    )
    await member.subscribe([topic])
    first = await member.poll(timeout_ms=20_000)  # the start gate: assigned and fetching
    got = len(first)
    wall, cpu = time.perf_counter(), time.process_time()
    deadline = time.monotonic() + 120
    while got < RECORDS:
        assert time.monotonic() < deadline, got
        got += len(await member.poll(timeout_ms=2000))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await member.close()
    n = RECORDS - len(first)
    return n / wall, cpu / n * 1e6


def test_drain(kafka_bootstrap: str, topic_factory: object, tmp_path: Path) -> None:
    apps = {"before": f"qf-b-{uuid.uuid4().hex[:6]}", "after": f"qf-a-{uuid.uuid4().hex[:6]}"}
    settings = {
        "before": {**BASE, "queueflow.leader.record.cache.bytes": 0},
        # 2 MiB: each drain reads from offset 0 again, past what the last drain left cached.
        "after": {**BASE, "queueflow.leader.record.cache.bytes": 2 << 20},
    }
    results: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    topics = {}
    for name in apps:
        topics[name] = topic_factory(1)  # type: ignore[operator]
        values = [b"x" * 100] * RECORDS
        asyncio.run(produce_records(kafka_bootstrap, topics[name], values, partition=0))

    def leader(name: str) -> LeaderWorker:
        return LeaderWorker(
            apps[name], [topics[name]], kafka_bootstrap, tmp_path / name, settings[name]
        )

    with leader("before").start(), leader("after").start():
        for i in range(PAIRS):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for name in order:
                results[name].append(asyncio.run(drain(kafka_bootstrap, apps[name], topics[name])))
    for name, runs in results.items():
        rates = [r for r, _ in runs]
        cpus = [c for _, c in runs]
        print(
            f"\n{name}: {statistics.median(rates):,.0f} rec/s "
            f"({min(rates):,.0f}..{max(rates):,.0f}), member CPU "
            f"{statistics.median(cpus):.1f} µs/record ({min(cpus):.1f}..{max(cpus):.1f})"
        )


def test_list_offsets_round_trip(kafka_bootstrap: str, topic_factory: object) -> None:
    """What an exact log end costs when the known one leaves a fetch short: one ListOffsets."""
    from queueflow.kafka.config import KafkaClientConfig
    from queueflow.server.log_offsets import LogOffsets
    from queueflow.structs import TopicPartition

    topic = topic_factory(1)  # type: ignore[operator]

    async def measure() -> list[float]:
        offsets = LogOffsets(KafkaClientConfig(kafka_bootstrap))
        tp = TopicPartition(topic, 0)
        await offsets.log_end(tp)
        times = []
        for _ in range(300):
            started = time.perf_counter()
            await offsets.log_end(tp)
            times.append((time.perf_counter() - started) * 1000)
        await offsets.close()
        return sorted(times)

    times = asyncio.run(measure())
    print(f"\nListOffsets round trip: p50 {times[150]:.2f} ms, p99 {times[296]:.2f} ms")
