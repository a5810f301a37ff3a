"""Share agents producing results (``sink=``, ``dead_letter=``, ``Send``, ``yield``) through
``InProcessCluster``: results go to the in-memory topics before the outcome is recorded, a sink
topic feeds the share agents on it (chains), a publish failure RELEASEs the record."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from inprocess_helpers import events, run, settings, until
from structlog.testing import capture_logs

import queueflow
from queueflow.engine.state import RecordState
from queueflow.member.agent.outputs import DEAD_LETTER_HEADER, DeadLetter, Result, Send
from queueflow.structs import ShareRecord
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

ACCEPT, RELEASE, REJECT = queueflow.ACCEPT, queueflow.RELEASE, queueflow.REJECT


def cluster(topics: dict[str, int], clock: FakeClock, **overrides: Any) -> InProcessCluster:
    return InProcessCluster(topics, clock=clock, settings=settings(**overrides))


def state(c: InProcessCluster, topic: str, offset: int, group: str = "g") -> RecordState:
    engine = c.share_partition(group, topic, 0)
    return RecordState.AVAILABLE if engine is None else engine.record(offset).state


def settled(c: InProcessCluster, topic: str, offset: int, group: str = "g") -> bool:
    """The leader settled ``offset`` (Acknowledged or Archived; below the SPSO)."""
    return state(c, topic, offset, group) in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


def test_a_chain_of_share_agents_in_memory() -> None:
    """jobs -> (double, yields) -> doubled -> (add one, Result) -> out: each record handled once
    per stage, every result of an ACCEPTed record published once, with the source key."""
    clock = FakeClock()
    c = cluster({"jobs": 1, "doubled": 1, "out": 1}, clock)
    for i in range(10):
        c.produce("jobs", str(i).encode(), key=f"k{i}".encode())
    seen: Counter[tuple[str, int]] = Counter()

    async def double(record: ShareRecord) -> Any:
        seen["jobs", record.offset] += 1
        yield int(record.value) * 2

    async def add_one(record: ShareRecord) -> Result:
        seen["doubled", record.offset] += 1
        return Result(ACCEPT, [json.loads(record.value) + 1])

    async def scenario() -> None:
        async with c:
            await c.agent(double, "jobs", "g1", sink="doubled")
            await c.agent(add_one, "doubled", "g2", sink=["out"])
            await until(lambda: len(c.sink_records("out")) == 10, "ten results", clock)
            await until(lambda: settled(c, "doubled", 9, "g2"), "acknowledged", clock)

    run(scenario())
    out = c.sink_records("out")
    assert sorted(json.loads(r.value or b"") for r in out) == [2 * i + 1 for i in range(10)]
    assert sorted(r.key or b"" for r in out) == sorted(f"k{i}".encode() for i in range(10))
    assert set(seen.values()) == {1} and len(seen) == 20


def test_release_publishes_nothing_and_the_accept_after_it_publishes_once() -> None:
    clock = FakeClock()
    c = cluster({"jobs": 1, "out": 1}, clock)
    c.produce("jobs", b"x")
    calls: list[int] = []

    async def handler(record: ShareRecord) -> Any:
        calls.append(record.delivery_count)
        yield Send("out", b"result")
        if record.delivery_count == 1:
            yield RELEASE

    async def scenario() -> None:
        async with c:
            await c.agent(handler, "jobs", "g")
            await until(lambda: settled(c, "jobs", 0), "acknowledged", clock)

    run(scenario())
    assert calls == [1, 2]
    assert [r.value for r in c.sink_records("out")] == [b"result"]


def test_a_reject_with_dead_letter_publishes_the_copy_with_headers() -> None:
    clock = FakeClock()
    c = cluster({"jobs": 1, "dlq": 1, "out": 1}, clock)
    c.produce("jobs", b"poison", key=b"k", headers=(("trace", b"t1"),))
    c.produce("jobs", b"bad")
    agent_rejected: list[int] = []

    async def handler(record: ShareRecord) -> Any:
        if record.value == b"bad":
            return Result(REJECT, [Send("out", 1), DeadLetter({"v": "bad"}, reason="no good")])
        return REJECT

    async def scenario() -> None:
        async with c:
            agent = await c.agent(handler, "jobs", "g", sink="out", dead_letter="dlq")
            await until(lambda: len(c.sink_records("dlq")) == 2, "two dead letters", clock)
            await until(lambda: agent.stats.rejected == 2, "rejected", clock)
            agent_rejected.append(agent.stats.rejected)

    run(scenario())
    copy, given = c.sink_records("dlq")
    assert (copy.key, copy.value) == (b"k", b"poison")
    headers = dict(copy.headers)
    assert headers["trace"] == b"t1"
    assert headers[DEAD_LETTER_HEADER + "offset"] == b"0"
    assert headers[DEAD_LETTER_HEADER + "group"] == b"g"
    assert headers[DEAD_LETTER_HEADER + "reason"] == b"rejected"
    assert json.loads(given.value or b"") == {"v": "bad"}
    assert dict(given.headers)[DEAD_LETTER_HEADER + "reason"] == b"no good"
    assert c.sink_records("out") == []  # a REJECT publishes dead letters only
    assert agent_rejected == [2]


def test_a_missing_sink_topic_releases_the_record_and_names_the_topic() -> None:
    """The result for an existing topic is not published either: every topic of a call is
    looked up before anything is produced."""
    clock = FakeClock()
    c = cluster({"jobs": 1, "out": 1}, clock)
    c.produce("jobs", b"x")

    async def handler(record: ShareRecord) -> Any:
        yield Send("out", b"first")
        yield b"result"

    async def scenario() -> None:
        async with c:
            with capture_logs() as logs:
                agent = await c.agent(handler, "jobs", "g", sink="nowhere")
                await until(lambda: agent.stats.released >= 1, "released", clock)
        assert events(logs, "share_agent_sink_topic_missing")[0]["sink_topic"] == "nowhere"
        failed = events(logs, "share_agent_results_not_published")[0]
        assert failed["sink_topic"] == "nowhere" and failed["offset"] == 0
        assert "UnknownTopicOrPartition" in failed["error"]
        assert agent.stats.accepted == 0

    run(scenario())
    # RELEASEd each time (Archived once at the delivery count limit), never Acknowledged
    assert state(c, "jobs", 0) is not RecordState.ACKNOWLEDGED
    assert c.sink_records("out") == []  # nothing half-published


def test_a_value_the_serializer_cant_encode_releases_the_record() -> None:
    clock = FakeClock()
    c = cluster({"jobs": 1, "out": 1}, clock)
    c.produce("jobs", b"x")

    async def handler(record: ShareRecord) -> Result:
        return Result(ACCEPT, [Send("out", 1), Send("out", object())])

    async def scenario() -> None:
        async with c:
            with capture_logs() as logs:
                agent = await c.agent(handler, "jobs", "g")
                await until(lambda: agent.stats.released >= 1, "released", clock)
        failed = events(logs, "share_agent_results_not_published")[0]
        assert failed["sink_topic"] == "out"
        assert "not JSON serializable" in failed["error"]

    run(scenario())
    assert c.sink_records("out") == []  # nothing half-published: encoded before any produce


def test_a_generator_that_times_out_or_raises_midway_publishes_nothing() -> None:
    """On their first delivery the generators yield a result, then raise or hang past the
    handler timeout: nothing of it is published; their second delivery's results are."""
    clock = FakeClock()
    c = cluster({"jobs": 1, "out": 1}, clock)
    c.produce("jobs", b"raise")
    c.produce("jobs", b"hang")
    closed: list[bytes] = []

    async def handler(record: ShareRecord) -> Any:
        try:
            yield Send("out", record.value + b"-%d" % record.delivery_count)
            if record.delivery_count == 1:
                if record.value == b"raise":
                    raise ValueError("midway")
                await asyncio.Event().wait()  # never set: only the timeout ends it
        finally:
            closed.append(record.value)

    async def scenario() -> None:
        async with c:
            with capture_logs() as logs:
                await c.agent(handler, "jobs", "g", handler_timeout_ms=50, concurrency=2)
                await until(lambda: len(c.sink_records("out")) == 2, "two results", clock)
                await until(lambda: settled(c, "jobs", 1), "both acknowledged", clock)
        assert events(logs, "handler_raised_record_released")
        assert events(logs, "handler_timed_out_records_released")

    run(scenario())
    assert sorted(r.value or b"" for r in c.sink_records("out")) == [b"hang-2", b"raise-2"]
    assert sorted(closed) == [b"hang", b"hang", b"raise", b"raise"]  # every generator closed


def test_an_agent_without_results_opens_no_producer() -> None:
    clock = FakeClock()
    c = cluster({"jobs": 1}, clock)
    c.produce("jobs", b"x")

    async def handler(record: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        async with c:
            agent = await c.agent(handler, "jobs", "g")
            await until(lambda: agent.stats.accepted == 1, "accepted", clock)
            assert agent.runner.routes is None
            assert agent.publisher._producer is None

    run(scenario())


def test_a_batch_handler_publishes_each_records_results_with_its_outcome() -> None:
    clock = FakeClock()
    c = cluster({"jobs": 1, "out": 1, "dlq": 1}, clock)
    for i in range(6):
        c.produce("jobs", str(i).encode(), key=f"k{i}".encode())

    async def handler(records: list[ShareRecord]) -> list[Any]:
        out: list[Any] = []
        for r in records:
            i = int(r.value)
            if i == 4:
                out.append(REJECT)  # the dead-letter copy
            elif i == 5 and r.delivery_count == 1:
                out.append(Result(RELEASE, [b"never"]))
            else:
                out.append(Result(ACCEPT, [r.value + b"!"]))
        return out

    async def scenario() -> None:
        async with c:
            agent = await c.agent(handler, "jobs", "g", batch=True, sink="out", dead_letter="dlq")
            await until(lambda: agent.stats.accepted == 5, "five accepted", clock)

    run(scenario())
    assert sorted(r.value or b"" for r in c.sink_records("out")) == [
        b"0!",
        b"1!",
        b"2!",
        b"3!",
        b"5!",
    ]
    assert [(r.key, r.value) for r in c.sink_records("dlq")] == [(b"k4", b"4")]


def test_nothing_of_a_call_is_published_when_one_of_its_topics_is_missing() -> None:
    clock = FakeClock()
    c = cluster({"jobs": 1, "out": 1}, clock)
    c.produce("jobs", b"x")

    async def handler(record: ShareRecord) -> Any:
        yield Send("out", b"first")
        yield Send("elsewhere", b"second")  # not a sink: not looked up at start

    async def scenario() -> None:
        async with c:
            with capture_logs() as logs:
                agent = await c.agent(handler, "jobs", "g")
                await until(lambda: agent.stats.released >= 2, "released twice", clock)
        failed = events(logs, "share_agent_results_not_published")
        assert {e["sink_topic"] for e in failed} == {"elsewhere"}

    run(scenario())
    assert c.sink_records("out") == []


def test_an_undecodable_record_is_dead_lettered_before_its_reject() -> None:
    clock = FakeClock()
    c = cluster({"jobs": 1, "dlq": 1}, clock)
    c.produce("jobs", b"\xff not json", key=b"k")
    c.produce("jobs", b"{}")

    def decode(record: ShareRecord) -> None:
        record.value = json.loads(record.raw_value or b"")

    async def handler(record: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        async with c:
            agent = await c.agent(handler, "jobs", "g", decode=decode, dead_letter="dlq")
            await until(lambda: agent.stats.rejected == 1, "rejected", clock)
            assert agent.stats.undecodable == 1 and agent.stats.accepted == 1

    run(scenario())
    (letter,) = c.sink_records("dlq")
    assert (letter.key, letter.value) == (b"k", b"\xff not json")
    reason = dict(letter.headers)[DEAD_LETTER_HEADER + "reason"].decode()
    assert reason.startswith("undecodable: UnicodeDecodeError")
