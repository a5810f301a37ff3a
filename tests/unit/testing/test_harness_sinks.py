"""``ShareAgentHarness`` with results (``sink=``, ``dead_letter=``, ``yield``): chains of share
agents in memory, ``sent(topic)`` and ``dead_letters()`` (needs the in-process sinks of
``InProcessCluster.sink_records``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import faust

import queueflow
from queueflow import ACCEPT, REJECT, RELEASE
from queueflow.structs import ShareRecord
from queueflow.testing import RecordState, ShareAgentHarness


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_a_chain_of_two_share_agents_runs_to_idle() -> None:
    """jobs -> double (yields) -> doubled -> add_one (Result) -> out: every stage handles each
    record once, with its own group and options; ``sent`` reads each stage's results."""
    app = queueflow.App("harness-chain", broker="kafka://localhost:9092", role="member")
    handled: list[tuple[str, int]] = []

    @app.share_agent("jobs", group="g1", sink="doubled", concurrency=2)
    async def double(record: ShareRecord) -> Any:
        handled.append(("jobs", record.offset))
        yield int(record.value) * 2

    @app.share_agent("doubled", group="g2", sink=["out"])
    async def add_one(record: ShareRecord) -> Any:
        handled.append(("doubled", record.offset))
        return queueflow.Result(ACCEPT, [json.loads(record.value) + 1])

    async def scenario() -> None:
        async with ShareAgentHarness(double, add_one, topics={"out": 1}) as h:
            for i in range(5):
                h.put(str(i).encode(), key=f"k{i}".encode())
            assert (await h.run_until_idle()).done
            assert sorted(json.loads(r.value or b"") for r in h.sent("doubled")) == [
                0,
                2,
                4,
                6,
                8,
            ]
            out = h.sent("out")
            assert sorted(json.loads(r.value or b"") for r in out) == [1, 3, 5, 7, 9]
            assert sorted(r.key or b"" for r in out) == [f"k{i}".encode() for i in range(5)]
            assert len(h.acknowledged(topic="doubled")) == 5  # group g2, read off its agent
            assert [m.group for m in h.members] == ["g1", "g2"]

    run(scenario())
    assert sorted(handled) == sorted(
        [("jobs", i) for i in range(5)] + [("doubled", i) for i in range(5)]
    )


def test_sent_and_dead_letters_of_an_app_agent() -> None:
    app = queueflow.App("harness-sinks", broker="kafka://localhost:9092", role="member")

    class Job(faust.Record, serializer="json"):
        n: int

    jobs = app.topic("jobs", value_type=Job)

    @app.share_agent(jobs, group="g", sink=["results"], dead_letter="jobs-dlq")
    async def work(record: ShareRecord) -> Any:
        if record.value.n < 0:
            yield REJECT
            return
        if record.value.n == 0 and record.delivery_count == 1:
            yield RELEASE
            return
        yield {"double": record.value.n * 2}

    async def scenario() -> None:
        async with ShareAgentHarness(work, topics={"results": 1, "jobs-dlq": 1}) as h:
            h.put(Job(n=2))
            h.put(Job(n=-1))
            h.put(Job(n=0))
            assert (await h.run_until_idle()).done
            sent = [json.loads(r.value or b"") for r in h.sent("results")]
            assert sorted(d["double"] for d in sent) == [0, 4]  # the RELEASE published nothing
            (dead,) = h.dead_letters()
            assert json.loads(dead.value or b"")["n"] == -1
            assert h.history(1).state is RecordState.ARCHIVED
            assert h.history(2).outcome_types == [RELEASE, ACCEPT]

    run(scenario())
