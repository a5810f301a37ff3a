"""Timing for the micro-benchmarks: repeats of a timed call, reported as µs per unit.

A *unit* is what a benchmark counts: a record (``µs/record``), a message or a call. Every
benchmark takes at least :data:`MIN_REPEATS` repeats and reports their median with the min..max
spread, so one slow repeat (another process on the core) shows as spread, not as the figure.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FULL", "MIN_REPEATS", "QUICK", "Result", "Sizes", "sample", "summarize"]

#: The fewest repeats a benchmark reports (the median of at least this many).
MIN_REPEATS = 7


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each repeat does.

    Attributes:
        repeats: repeats per benchmark (>= :data:`MIN_REPEATS`).
        engine_records: records acquired and acknowledged per repeat of an engine benchmark.
        in_flight: records in flight for the lock-expiry tick.
        calls: calls per repeat of a codec benchmark.
        read_batches: 500-record batches parsed per repeat of a read-path benchmark.
        dispatch_records: records handled per repeat (window) of a dispatch benchmark.
        listener_batches: 125-record batches of 1 KiB records per repeat of a listener answer
            benchmark.
    """

    repeats: int
    engine_records: int
    in_flight: int
    calls: int
    read_batches: int
    dispatch_records: int
    listener_batches: int = 8


#: ``make bench-micro``: about half a minute on 2 cores.
FULL = Sizes(
    repeats=9,
    engine_records=20_000,
    in_flight=10_000,
    calls=2_000,
    read_batches=40,
    dispatch_records=20_000,
    listener_batches=8,
)
#: ``--quick``: tiny sizes, to check that everything runs (figures mean little).
QUICK = Sizes(
    repeats=MIN_REPEATS,
    engine_records=500,
    in_flight=1_000,
    calls=20,
    read_batches=1,
    dispatch_records=100,
    listener_batches=1,
)


@dataclass(frozen=True, slots=True)
class Result:
    """One benchmark's figures.

    Attributes:
        name: dotted name (``engine.accept.b500``), what ``--only`` matches.
        unit: what one figure is per: ``record``, ``message`` or ``call``.
        median_us / min_us / max_us: µs per unit: median, fastest and slowest repeat.
        repeats: how many repeats the figures are taken from.
        n: units per repeat.
        what: one line saying what was timed.
    """

    name: str
    unit: str
    median_us: float
    min_us: float
    max_us: float
    repeats: int
    n: int
    what: str

    def as_json(self) -> dict[str, Any]:
        """The JSON object of this result (every attribute but ``name``, the key)."""
        out = asdict(self)
        del out["name"]
        return out


def sample(
    call: Callable[[], object],
    *,
    units: int,
    repeats: int,
    setup: Callable[[], object] | None = None,
) -> list[float]:
    """Time ``call`` ``repeats`` times; the garbage collector is off while it runs.

    Args:
        call: one repeat's work, covering ``units`` units.
        units: units per call (records, messages or calls of an inner loop).
        repeats: how many times to time it.
        setup: run before each repeat, untimed (e.g. a fresh share-partition).

    Returns:
        µs per unit of each repeat, in the order they ran.
    """
    out: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            if setup is not None:
                setup()
            started = time.perf_counter()
            call()
            out.append((time.perf_counter() - started) * 1e6 / units)
    finally:
        gc.enable()
    return out


def summarize(name: str, unit: str, n: int, samples: Sequence[float], what: str) -> Result:
    """The :class:`Result` of ``samples`` (µs per unit, one per repeat)."""
    return Result(
        name=name,
        unit=unit,
        median_us=round(statistics.median(samples), 4),
        min_us=round(min(samples), 4),
        max_us=round(max(samples), 4),
        repeats=len(samples),
        n=n,
        what=what,
    )
