"""Per-record cost on a member: building records, and dispatching them to handlers (prints
only, never asserts).

(a) reader: turning aiokafka ``ConsumerRecord`` objects into ``ShareRecord`` objects, the hot
    loop of every member read. The old way (the loop ``PartitionReader._read`` had before
    ``queueflow.member.reader.share_records``, copied below: ``ShareRecord(...)`` with a keyword
    argument and key and value read twice) against the new one (slots filled in place, no
    ``__init__`` call), in the same run, on the same records, with the garbage collector off.
(b) dispatch: a share agent with a no-op handler through ``InProcessCluster`` (real coordinator,
    leader, session and agent in memory; no Kafka), per record against ``batch=True``: wall and
    CPU time per record from the agent's start until every record is handled and its
    acknowledgement flushed. The leader's work is in the figures too.

Both are the best of several interleaved rounds (the machine may be busy).

Usage: ``python -m bench.bench_reader [records]``
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Callable
from typing import Any

from aiokafka.structs import ConsumerRecord

from queueflow.member.reader import share_records
from queueflow.structs import ShareRecord

ROUNDS = 15
READ_RECORDS = 2_000
READ_REPEAT = 50


def consumer_records(n: int) -> list[Any]:
    """``n`` records of a 100-byte value, as aiokafka returns them."""
    return [
        ConsumerRecord("jobs", 0, o, 1_700_000_000_000 + o, 0, None, b"x" * 100, None, -1, 100, ())
        for o in range(1_000_000, 1_000_000 + n)
    ]


def read_old(messages: list[Any], expected: int, last: int) -> list[ShareRecord]:
    """The loop of ``PartitionReader._read`` before ``share_records`` (verbatim)."""
    records: list[ShareRecord] = []
    gaps: list[int] = []
    delivery_count = 1
    append = records.append
    for m in messages:
        offset = m.offset
        if offset != expected:  # offsets without records (compaction, markers)
            gaps.extend(range(expected, min(offset, last + 1)))
            if offset > last:
                expected = last + 1
                break
        append(
            ShareRecord(
                m.topic,
                m.partition,
                offset,
                m.key,
                m.value,
                m.headers,
                m.timestamp,
                delivery_count,
                m.value,
                m.key,
                timestamp_type=m.timestamp_type,
            )
        )
        expected = offset + 1
    return records


def read_new(messages: list[Any], expected: int, last: int) -> list[ShareRecord]:
    """The reader's loop now."""
    records: list[ShareRecord] = []
    share_records(messages, "jobs", 0, expected, last, 1, records, [])
    return records


def best_us_per_record(
    ways: dict[str, Callable[[], object]], records: int, repeat: int
) -> dict[str, float]:
    """µs per record of each way: the best of :data:`ROUNDS` interleaved rounds."""
    best = dict.fromkeys(ways, float("inf"))
    gc.collect()
    gc.disable()
    try:
        for _ in range(ROUNDS):
            for name, way in ways.items():
                started = time.perf_counter()
                for _ in range(repeat):
                    way()
                elapsed = time.perf_counter() - started
                best[name] = min(best[name], elapsed / repeat / records * 1e6)
    finally:
        gc.enable()
    return best


def bench_reader() -> None:
    messages = consumer_records(READ_RECORDS)
    first, last = messages[0].offset, messages[-1].offset
    assert read_old(messages, first, last) == read_new(messages, first, last)
    best = best_us_per_record(
        {
            "old": lambda: read_old(messages, first, last),
            "new": lambda: read_new(messages, first, last),
        },
        READ_RECORDS,
        READ_REPEAT,
    )
    print(f"(a) reader, {READ_RECORDS} records per read, best of {ROUNDS}:")
    print(f"    old (ShareRecord(...), keyword argument): {best['old']:.3f} µs/record")
    print(f"    new (share_records, slots filled)       : {best['new']:.3f} µs/record")
    print(f"    new / old: {best['new'] / best['old']:.2f}")


async def dispatch_once(records: int, batch: bool) -> tuple[float, float]:
    """Wall and CPU seconds for an agent to handle ``records`` records (no-op handler)."""
    from queueflow.settings import ShareGroupSettings
    from queueflow.testing.inprocess import InProcessCluster

    settings = ShareGroupSettings(
        auto_offset_reset="earliest",
        heartbeat_interval_ms=200,
        session_timeout_ms=10_000,
        request_timeout_ms=2_000,
    )
    done = asyncio.Event()
    handled = 0

    async def per_record(record: ShareRecord) -> None:
        nonlocal handled
        handled += 1
        if handled == records:
            done.set()

    async def per_batch(batch_records: list[ShareRecord]) -> None:
        nonlocal handled
        handled += len(batch_records)
        if handled == records:
            done.set()

    async with InProcessCluster({"jobs": 1}, settings=settings) as cluster:
        for i in range(records):
            cluster.produce("jobs", b"r%d" % i)
        wall, cpu = time.perf_counter(), time.process_time()
        handler: Any = per_batch if batch else per_record
        agent = await cluster.agent(handler, "jobs", "g", concurrency=1, batch=batch)
        await asyncio.wait_for(done.wait(), timeout=120)
        await agent.stop()
        return time.perf_counter() - wall, time.process_time() - cpu


def bench_dispatch(records: int) -> None:
    best: dict[str, list[float]] = {"per record": [1e9, 1e9], "batch=True": [1e9, 1e9]}
    for _ in range(3):
        for name, batch in (("per record", False), ("batch=True", True)):
            wall, cpu = asyncio.run(dispatch_once(records, batch))
            best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
    print(f"(b) share agent, no-op handler, {records} records in process, best of 3:")
    for name, (wall, cpu) in best.items():
        print(
            f"    {name:<10}: {wall / records * 1e6:7.2f} µs/record wall, "
            f"{cpu / records * 1e6:7.2f} µs/record CPU"
        )
    (old_wall, old_cpu), (new_wall, new_cpu) = best["per record"], best["batch=True"]
    print(f"    batch / per record: wall {new_wall / old_wall:.2f}, CPU {new_cpu / old_cpu:.2f}")


def main() -> None:
    records = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    bench_reader()
    bench_dispatch(records)


if __name__ == "__main__":
    main()
