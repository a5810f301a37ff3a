"""Memory used by the share-partition engine per in-flight record (prints only, never asserts).

Scenarios, each with 10,000 in-flight records:

(a) worst case: every record in its own run. 10,000 records are acquired, then every other one
    is accepted (the others stay Acquired), so no two neighbouring records can share a run.
(b) the batched case (KIP-932 "Batching"): 10,000 records acquired in 20 fetches of 500.

Changes are taken (``take_changes()``) after every request, as the persistence layer does.

Each is compared with a naive baseline measured in the same run: a dict
``offset -> (state, delivery count, member id, lock deadline)`` with one tuple per record.

Usage: ``python bench/bench_engine_memory.py``
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    RecordState,
    SharePartition,
    SharePartitionConfig,
)

N = 10_000
START = 1_000_000  # realistic offsets: not small cached ints
# one member holds all N: lift the per-member limits (share.member.max.in.flight.records,
# share.member.max.acquisition.rate), which would otherwise cap what it acquires
CFG = SharePartitionConfig(
    max_in_flight_records=N, member_max_in_flight_records=N, member_max_acquisition_rate=0
)


def measure(build: Callable[[], object]) -> tuple[int, object]:
    """Bytes still allocated by ``build()``'s result after it returns."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, result


def engine_own_runs() -> SharePartition:
    sp = SharePartition(CFG, START)
    sp.acquire("consumer-1", N, START + N, now_ms=0)
    accept = (AcknowledgeType.ACCEPT,)
    sp.acknowledge(
        "consumer-1",
        [AcknowledgementBatch(o, o, accept) for o in range(START + 1, START + N, 2)],
        now_ms=1,
    )
    sp.take_changes()  # as the persistence layer does after every request
    return sp


def engine_batches() -> SharePartition:
    sp = SharePartition(CFG, START)
    for i in range(20):
        sp.acquire(f"consumer-{i % 4}", 500, START + N, now_ms=i)
        sp.take_changes()
    return sp


def baseline_own_runs() -> dict[int, tuple[RecordState, int, str | None, int | None]]:
    member = "consumer-1"
    records: dict[int, tuple[RecordState, int, str | None, int | None]] = {}
    deadline = 30_000
    for k, o in enumerate(range(START, START + N)):
        if k % 2:
            records[o] = (RecordState.ACKNOWLEDGED, 1, None, None)
        else:
            records[o] = (RecordState.ACQUIRED, 1, member, deadline)
    return records


def baseline_batches() -> dict[int, tuple[RecordState, int, str | None, int | None]]:
    records: dict[int, tuple[RecordState, int, str | None, int | None]] = {}
    members = [f"consumer-{i}" for i in range(4)]
    for i in range(20):
        deadline = 30_000 + i
        for o in range(START + 500 * i, START + 500 * (i + 1)):
            records[o] = (RecordState.ACQUIRED, 1, members[i % 4], deadline)
    return records


def main() -> None:
    print(f"share-partition engine memory, {N:,} in-flight records (tracemalloc)")
    header = f"{'scenario':<44}{'runs':>7}{'bytes':>11}{'B/record':>10}"
    print(f"{header}{'baseline B/rec':>16}{'ratio':>8}")
    for name, engine, baseline in (
        ("(a) every record its own run", engine_own_runs, baseline_own_runs),
        ("(b) 20 batches of 500", engine_batches, baseline_batches),
    ):
        used, sp = measure(engine)
        base, _ = measure(baseline)
        assert isinstance(sp, SharePartition)
        runs = sp.run_count
        per = used / N
        base_per = base / N
        print(f"{name:<44}{runs:>7}{used:>11,}{per:>10.1f}{base_per:>16.1f}{per / base_per:>8.2f}")


if __name__ == "__main__":
    main()
