"""Member dispatch end to end in process: records through a share agent with a no-op handler.

A :class:`~queueflow.testing.inprocess.InProcessCluster` (the real coordinator, leader, fetch
session and :class:`~queueflow.ShareAgent`, topics and tables in memory, requests through the
real wire encoding; no Kafka, no Faust) holds every record before the agent starts. The agent
(``concurrency=1``) handles a warm-up window, then one window per repeat; a figure is a
window's time divided by the records handled in it, so the agent's start and the group's join
are not in it. The leader's work and the in-memory read (which builds ``ShareRecord`` objects
directly, not from Kafka bytes: see ``read.*`` for that) are in the figures, as is the
acknowledgement flush of earlier windows. The garbage collector stays on. The acquisition rate
limit is lifted (``share.member.max.acquisition.rate=0``; its default, 20,000 records/s per member
and share-partition, alone makes 50 µs/record).

* ``dispatch.record`` / ``dispatch.record.cpu``: a per-record handler
  (``async def handler(record)``): wall µs and CPU µs (this process) per record;
* ``dispatch.batch`` / ``dispatch.batch.cpu``: a batch handler (``batch=True``, the records of
  one ShareFetch per call).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from bench.micro.timing import Result, Sizes, summarize
from queueflow.settings import AutoOffsetReset, ShareGroupSettings
from queueflow.structs import ShareRecord
from queueflow.testing.inprocess import InProcessCluster

__all__ = ["BENCHMARKS", "windows"]

#: Seconds a run may take before it is given up as stuck.
TIMEOUT_S = 300.0
#: The largest batch a window is planned to overrun by (records produced beyond the windows'
#: own: a handler call never gets more than a fetch acquires).
SLACK_RECORDS = 2_000


async def windows(records: int, repeats: int, batch: bool) -> list[tuple[int, float, float]]:
    """Run a no-op agent over a warm-up window and ``repeats`` windows of ``records`` records.

    Returns:
        ``(records handled so far, perf_counter, process_time)`` at the end of the warm-up and
        of every window: ``repeats + 1`` marks. A window ends with the first handler call that
        reaches ``records`` records in it, so a batch larger than a window (adaptive
        acquisition on a loaded machine) makes it longer, never merges two windows.
    """
    settings = ShareGroupSettings(
        auto_offset_reset=AutoOffsetReset.EARLIEST,
        heartbeat_interval_ms=200,
        session_timeout_ms=10_000,
        request_timeout_ms=2_000,
        # The default (20,000 records/s per member and share-partition) is a 50 µs/record
        # floor: it would be measured instead of the dispatch.
        member_max_acquisition_rate=0,
    )
    windows = repeats + 1
    # Room for every window to overrun by a batch of up to SLACK_RECORDS records.
    total = windows * (records + SLACK_RECORDS)
    marks: list[tuple[int, float, float]] = []
    done = asyncio.Event()
    handled = 0
    next_mark = records

    def count(k: int) -> None:
        nonlocal handled, next_mark
        handled += k
        if handled >= next_mark and not done.is_set():
            marks.append((handled, time.perf_counter(), time.process_time()))
            next_mark = handled + records
            if len(marks) == windows:
                done.set()

    async def per_record(record: ShareRecord) -> None:
        count(1)

    async def per_batch(batch_records: list[ShareRecord]) -> None:
        count(len(batch_records))

    async with InProcessCluster({"jobs": 1}, settings=settings) as cluster:
        for i in range(total):
            cluster.produce("jobs", b"r%d" % i, partition=0)
        handler: Any = per_batch if batch else per_record
        agent = await cluster.agent(handler, "jobs", "bench", concurrency=1, batch=batch)
        await asyncio.wait_for(done.wait(), timeout=TIMEOUT_S)
        await agent.stop()
    return marks


def bench_dispatch(sizes: Sizes) -> list[Result]:
    out = []
    for batch, name in ((False, "dispatch.record"), (True, "dispatch.batch")):
        marks = asyncio.run(windows(sizes.dispatch_records, sizes.repeats, batch))
        wall: list[float] = []
        cpu: list[float] = []
        for (n0, w0, c0), (n1, w1, c1) in itertools.pairwise(marks):
            wall.append((w1 - w0) * 1e6 / (n1 - n0))
            cpu.append((c1 - c0) * 1e6 / (n1 - n0))
        handler = "batch handler (batch=True)" if batch else "per-record handler"
        what = f"share agent, no-op {handler}, in-process cluster"
        n = sizes.dispatch_records
        out.append(summarize(name, "record", n, wall, f"{what}: wall"))
        out.append(summarize(f"{name}.cpu", "record", n, cpu, f"{what}: CPU of the process"))
    return out


#: Name prefix -> the function that runs those benchmarks.
BENCHMARKS: dict[str, Callable[[Sizes], list[Result]]] = {"dispatch": bench_dispatch}
