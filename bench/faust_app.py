"""A plain Faust agent (what users have today), run as Faust workers::

    python -m faust -A bench.faust_app --datadir D worker -l info

Environment as for :mod:`bench.qf_app`: ``BENCH_APP_ID``, ``BENCH_BROKER``, ``BENCH_TOPIC``,
``BENCH_CONCURRENCY`` (actors per worker), ``BENCH_MODE`` (``noop`` | ``sleep10``),
``BENCH_STATS``, ``BENCH_GO`` (source partitions stay paused, at the Faust level, until it
exists). A record counts as finished when the agent has processed it (Faust
acknowledges it then; offsets are committed every ``broker_commit_every``/interval).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import faust

from bench.harness import Stats, go, wait_go

MODE = os.environ.get("BENCH_MODE", "noop")
TOPIC = os.environ["BENCH_TOPIC"]
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "1"))

stats = Stats()

app = faust.App(
    os.environ["BENCH_APP_ID"],
    broker=os.environ["BENCH_BROKER"],
    store="memory://",
    consumer_auto_offset_reset="earliest",
    topic_disable_leader=True,
)
source = app.topic(TOPIC, key_serializer="raw", value_serializer="raw")


def _hold_source_partitions() -> None:
    """Keep the source partitions out of Faust's active (fetched) set until the go-file exists.

    Faust-level pause: the two choke points are patched, because Faust's own recovery resumes
    partitions after every rebalance. (An agent blocked inside its stream instead would stall
    rebalances: ``stream_wait_empty`` waits for it.)
    """
    from faust.transport.consumer import Consumer

    set_active, resume = Consumer._set_active_tps, Consumer.resume_partitions

    def _set_active_tps(self: Any, tps: Any) -> Any:
        active = set_active(self, tps)
        if not go():
            active.difference_update({tp for tp in active if tp.topic == TOPIC})
        return active

    def resume_partitions(self: Any, tps: Any) -> None:
        if not go():
            tps = {tp for tp in tps if tp.topic != TOPIC}
        resume(self, tps)

    Consumer._set_active_tps = _set_active_tps  # type: ignore[method-assign]
    Consumer.resume_partitions = resume_partitions  # type: ignore[method-assign]


_hold_source_partitions()


@app.task
async def _resume_on_go() -> None:
    await wait_go()
    app.consumer.resume_partitions({tp for tp in app.consumer.assignment() if tp.topic == TOPIC})


@app.agent(source, concurrency=CONCURRENCY)
async def consume(stream: Any) -> None:
    async for _value in stream:
        stats.delivery()
        if MODE == "sleep10":
            await asyncio.sleep(0.01)
        stats.done += 1
        stats.last = time.time()


@app.timer(0.2)
async def _probe() -> None:
    # Read in the event loop: Faust internals are not for the stats thread.
    assigned = sorted(tp.partition for tp in app.assignor.assigned_actives() if tp.topic == TOPIC)
    generation = getattr(app, "consumer_generation_id", None)
    stats.extra.update(assigned=assigned, generation=generation, ready=generation is not None)


stats.start()
