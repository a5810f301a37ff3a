"""The ceiling: a raw aiokafka consumer-group member that reads records and does nothing else.

    python -m bench.raw_consumer      # BENCH_BROKER (host:port), BENCH_TOPIC, BENCH_GROUP

Assigned partitions stay paused until the driver's go-file exists, so every member of the group
has joined (and the group is stable) before anything is fetched. Each record returned by
``getmany`` counts as finished.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

from bench.harness import Stats, go

stats = Stats()


class _Listener(ConsumerRebalanceListener):
    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.assigned: list[int] = []

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.assigned = []

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if not go():
            self.consumer.pause(*assigned)
        self.assigned = sorted(tp.partition for tp in assigned)


async def main() -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=os.environ["BENCH_BROKER"],
        group_id=os.environ["BENCH_GROUP"],
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        client_id="bench-raw",
    )
    listener = _Listener(consumer)
    await consumer.start()
    try:
        consumer.subscribe([os.environ["BENCH_TOPIC"]], listener=listener)
        stats.probe = lambda: {"assigned": listener.assigned, "ready": bool(listener.assigned)}
        stats.start()
        while not go():
            await consumer.getmany(timeout_ms=20)  # drives the group membership; all paused
        consumer.resume(*consumer.assignment())
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=10_000)
            n = sum(len(messages) for messages in batches.values())
            if n:
                now = time.time()
                if stats.first is None:
                    stats.first = now
                stats.delivered += n
                stats.done += n
                stats.last = now
    finally:
        await consumer.stop()


if __name__ == "__main__":
    asyncio.run(main())
