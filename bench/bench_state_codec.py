"""Encoding of durable share-partition state: version 1 (JSON) against version 2 (binary), in
one run (prints only, never asserts).

Records, shaped like S4's (every tenth record RELEASEd once, the rest ACCEPTed):

* a delta of 90 runs: 45 Acknowledged runs of 9 records, each followed by one Available record
  with delivery count 1, at offsets around 12 million;
* a snapshot of 1,000 runs of the same shape, with every 50th run Archived at count 5.

For each: encode and decode time (best of ``--repeat`` rounds of ``--number`` calls, in µs per
call; decode includes validation and building the ``StateBatch`` objects), encoded bytes, and
the v2/v1 ratios. Figures move with the machine's load; the ratios much less.

Usage: ``python -m bench.bench_state_codec [--number N] [--repeat R]``
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from functools import partial
from typing import Any

from queueflow.engine.state import RecordState, ShareSnapshot, ShareUpdate, StateBatch
from queueflow.protocol.state_codec import (
    decode_snapshot,
    decode_update,
    encode_snapshot,
    encode_snapshot_v1,
    encode_update,
    encode_update_v1,
)

START = 12_345_678
WHERE = "group=bench topic=jobs partition=0"


def runs(n: int, start: int = START) -> tuple[StateBatch, ...]:
    """``n`` runs alternating 9 Acknowledged records and 1 released (Available) record."""
    out: list[StateBatch] = []
    offset = start
    for i in range(n):
        if i % 2 == 0:
            out.append(StateBatch(offset, offset + 8, RecordState.ACKNOWLEDGED, 1))
            offset += 9
        elif i % 50 == 49:
            out.append(StateBatch(offset, offset, RecordState.ARCHIVED, 5))
            offset += 1
        else:
            out.append(StateBatch(offset, offset, RecordState.AVAILABLE, 1))
            offset += 1
    return tuple(out)


def best_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Best time of one call of ``fn`` in µs."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=500, help="calls per round")
    parser.add_argument("--repeat", type=int, default=7, help="rounds (the best is kept)")
    args = parser.parse_args()

    update = ShareUpdate(START, runs(90))
    snapshot = ShareSnapshot(41, 3, 12, START, runs(1_000))
    epochs = {"snapshot_epoch": 41, "state_epoch": 3, "delta_index": 17}

    cases: list[tuple[str, int, int, Callable[[], bytes], Callable[[], bytes], Callable[..., Any]]]
    cases = [
        (
            "delta",
            len(update.batches),
            args.number,
            lambda: encode_update_v1(update, **epochs),
            lambda: encode_update(update, **epochs),
            decode_update,
        ),
        (
            "snapshot",
            len(snapshot.batches),
            max(1, args.number // 10),
            lambda: encode_snapshot_v1(snapshot),
            lambda: encode_snapshot(snapshot),
            decode_snapshot,
        ),
    ]
    header = (
        f"{'record':<9} {'runs':>5}  {'metric':<11} {'v1 (JSON)':>10} {'v2 (binary)':>12} "
        f"{'v2/v1':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, n, number, enc_v1, enc_v2, decode in cases:
        data_v1, data_v2 = enc_v1(), enc_v2()
        assert decode(data_v1, where=WHERE) == decode(data_v2, where=WHERE)
        # Interleaved, so that a change of load hits both formats alike.
        e1 = best_us(enc_v1, number, args.repeat)
        e2 = best_us(enc_v2, number, args.repeat)
        d1 = best_us(partial(decode, data_v1, where=WHERE), number, args.repeat)
        d2 = best_us(partial(decode, data_v2, where=WHERE), number, args.repeat)
        rows = [
            ("encode µs", f"{e1:.1f}", f"{e2:.1f}", e2 / e1),
            ("decode µs", f"{d1:.1f}", f"{d2:.1f}", d2 / d1),
            ("bytes", str(len(data_v1)), str(len(data_v2)), len(data_v2) / len(data_v1)),
        ]
        for i, (metric, v1, v2, ratio) in enumerate(rows):
            label, runs_col = (name, str(n)) if i == 0 else ("", "")
            print(f"{label:<9} {runs_col:>5}  {metric:<11} {v1:>10} {v2:>12} {ratio:>6.2f}")


if __name__ == "__main__":
    main()
