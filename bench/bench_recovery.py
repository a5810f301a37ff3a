"""How long a leader takes to restore a share-partition (issue "Nothing lost", item 9).

Builds durable state for one share-partition with 10,000 in-flight records in mixed states
(Available with delivery counts, Acknowledged, Archived, Acquired) written as 5,000 deltas after
one snapshot, in a real RocksDB (rocksdict) table, then times
``DurableSharePartition.load`` (read snapshot, read and decode the deltas,
replay, rebuild the engine, write a fresh snapshot). Prints figures and the ratio against a
baseline that only reads the same keys; never asserts.

    python -m bench.bench_recovery
"""

from __future__ import annotations

import random
import tempfile
import time

from rocksdict import Rdict

from queueflow.engine.partition import AcknowledgementBatch, AcknowledgeType, SharePartitionConfig
from queueflow.server.durable import DurableSharePartition

IN_FLIGHT = 10_000
DELTAS = 5_000


class RocksTable:
    """The StateTable protocol over a rocksdict database (what Faust's store does underneath)."""

    def __init__(self, path: str) -> None:
        self.db = Rdict(path)

    def get(self, key: bytes, default: None = None) -> bytes | None:
        return self.db.get(key, default)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.db[key] = value

    def __delitem__(self, key: bytes) -> None:
        del self.db[key]


def build(table: RocksTable, config: SharePartitionConfig) -> None:
    rng = random.Random(7)
    durable = DurableSharePartition.create(table, "g", "t", 0, config, DELTAS + 1, start_offset=0)
    engine = durable.engine
    now = 0
    deltas = 0
    # Acquire everything in small batches (one delta each), then acknowledge single records
    # with mixed outcomes so the state fragments into many runs (one delta each).
    while engine.end_offset < IN_FLIGHT:
        now += 1
        engine.acquire("m", 50, IN_FLIGHT, now)
        durable.persist()
        deltas += 1
    kinds = [AcknowledgeType.ACCEPT, AcknowledgeType.REJECT, AcknowledgeType.RELEASE]
    offsets = list(range(1, IN_FLIGHT))  # keep offset 0 acquired so the SPSO can't move
    rng.shuffle(offsets)
    for offset in offsets[: DELTAS - deltas]:
        engine.acknowledge("m", [AcknowledgementBatch(offset, offset, (rng.choice(kinds),))], now)
        durable.persist()
    assert durable.delta_index == DELTAS, durable.delta_index


def main() -> None:
    config = SharePartitionConfig(max_in_flight_records=IN_FLIGHT)
    with tempfile.TemporaryDirectory() as tmp:
        table = RocksTable(f"{tmp}/state.db")
        build(table, config)
        keys = list(table.db.keys())  # materialise before timing
        t0 = time.perf_counter()
        for key in keys:
            table.get(key)
        baseline = time.perf_counter() - t0
        t0 = time.perf_counter()
        durable = DurableSharePartition.load(table, "g", "t", 0, config, DELTAS)
        elapsed = time.perf_counter() - t0
        assert durable is not None
        engine = durable.engine
        print(
            f"restored share-partition: {engine.in_flight_count} in-flight records, "
            f"{sum(1 for _ in engine.in_flight())} runs, from 1 snapshot + {DELTAS} deltas"
        )
        print(
            f"restore time: {elapsed * 1000:.1f} ms  (baseline, reading the {len(keys)} keys "
            f"only: {baseline * 1000:.1f} ms; ratio {elapsed / baseline:.1f}x)"
        )
        table.db.close()


if __name__ == "__main__":
    main()
