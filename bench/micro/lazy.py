"""Lazy against eager record views: a fetched batch to what a handler touches, µs per record.

The batch is :func:`bench.micro.readpath.record_batch`'s (v2, uncompressed, 500 records of a
100-byte value, no key, no headers), CRC checked as a member reads it. Each repeat parses
``read_batches`` batches with :func:`queueflow.member.reader.records_from_batches` (eager) or
:func:`queueflow.member.lazy_records.lazy_records_from_batches` (lazy) and then touches every
record as a handler would:

* ``none``: the offsets only (a handler that counts, forwards offsets or acknowledges);
* ``value``: ``record.value``;
* ``all``: key, value, headers, timestamp and timestamp type.

Eager and lazy run as interleaved pairs (one of each per repeat, the order alternating), so
a slow phase of the machine hits both: ``lazy.<touch>.eager`` and ``lazy.<touch>.lazy`` give
µs/record (median, min..max over the repeats) and ``lazy.<touch>.ratio`` the pairs'
lazy ÷ eager (unit ``ratio``: the figures are ratios, not µs).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from bench.micro.readpath import BASE_OFFSET, BATCH_RECORDS, PARTITION, TOPIC, record_batch
from bench.micro.timing import Result, Sizes, summarize
from queueflow.member.lazy_records import lazy_records_from_batches
from queueflow.member.reader import records_from_batches

__all__ = ["BENCHMARKS", "TOUCHES", "bench_lazy"]


def _none(records: list[Any]) -> int:
    total = 0
    for r in records:
        total += r.offset
    return total


def _value(records: list[Any]) -> int:
    total = 0
    for r in records:
        total += len(r.value)
    return total


def _all(records: list[Any]) -> int:
    total = 0
    for r in records:
        r.key  # noqa: B018  # touched, as a handler would
        total += len(r.value) + len(r.headers) + r.timestamp + r.timestamp_type
    return total


#: What a handler touches -> the loop that does it.
TOUCHES: dict[str, Callable[[list[Any]], int]] = {"none": _none, "value": _value, "all": _all}


def _timed(call: Callable[[], object], units: int) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1e6 / units


def bench_lazy(sizes: Sizes) -> list[Result]:
    data = record_batch()
    acquired = [(BASE_OFFSET, BASE_OFFSET + BATCH_RECORDS - 1, 1)]
    batches = sizes.read_batches
    n = batches * BATCH_RECORDS
    parsers = {"eager": records_from_batches, "lazy": lazy_records_from_batches}
    if (
        parsers["lazy"](data, TOPIC, PARTITION, acquired)[0]
        != (parsers["eager"](data, TOPIC, PARTITION, acquired)[0])
    ):
        raise AssertionError("lazy and eager views differ")
    out = []
    for touch_name, touch in TOUCHES.items():

        def run(parse: Callable[..., Any], touch: Callable[[list[Any]], int] = touch) -> None:
            for _ in range(batches):
                touch(parse(data, TOPIC, PARTITION, acquired)[0])

        samples: dict[str, list[float]] = {"eager": [], "lazy": []}
        gc.collect()
        gc.disable()
        try:
            for i in range(sizes.repeats):
                order = ["eager", "lazy"] if i % 2 == 0 else ["lazy", "eager"]
                for name in order:
                    samples[name].append(_timed(lambda p=parsers[name]: run(p), n))
        finally:
            gc.enable()
        for name in ("eager", "lazy"):
            what = f"bytes -> {name} views, CRC checked, touching {touch_name}"
            out.append(summarize(f"lazy.{touch_name}.{name}", "record", n, samples[name], what))
        ratios = [lz / ea for lz, ea in zip(samples["lazy"], samples["eager"], strict=True)]
        what = f"lazy / eager of each interleaved pair, touching {touch_name}"
        out.append(summarize(f"lazy.{touch_name}.ratio", "ratio", n, ratios, what))
    return out


#: Name prefix -> the function that runs those benchmarks.
BENCHMARKS: dict[str, Callable[[Sizes], list[Result]]] = {"lazy": bench_lazy}
