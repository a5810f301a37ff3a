"""Batch handlers (``ShareAgent(..., batch=True)``, ``@app.share_agent(..., batch=True)``)
through ``InProcessCluster``: one outcome per record applied at the leader, the failure cases
handled as on the per-record path, the batch size bound; and the reader's record building.

The cluster runs on a :class:`~queueflow.testing.FakeClock`: an agent's fetch loop that backed
off after an empty ShareFetch fetches again only once the clock has moved, so the waits below
move it a little on every check (:func:`until`)."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from inprocess_helpers import TOPIC, cluster_with, events, eventually, run, settle, until
from structlog.testing import capture_logs

import queueflow
from queueflow.engine.state import RecordState
from queueflow.errors import ConfigurationError
from queueflow.member.agent import ShareAgent, batch_outcomes
from queueflow.member.reader import share_records
from queueflow.structs import AcknowledgeType, ShareRecord
from queueflow.testing import FakeClock, ShareAgentHarness
from queueflow.testing.inprocess import InProcessCluster

ACCEPT, RELEASE, REJECT = queueflow.ACCEPT, queueflow.RELEASE, queueflow.REJECT


def state(cluster: InProcessCluster, offset: int, partition: int = 0) -> tuple[RecordState, int]:
    view = cluster.share_partition("g", TOPIC, partition).record(offset)
    return view.state, view.delivery_count


def spso(cluster: InProcessCluster, partition: int = 0) -> int | None:
    engine = cluster.share_partition("g", TOPIC, partition)
    return None if engine is None else int(engine.start_offset)


# -- outcomes --------------------------------------------------------------------------------


def test_each_record_gets_its_own_outcome_at_the_leader() -> None:
    """One outcome per record, in order: the RELEASEd records come back with delivery count 2,
    the REJECTed one never comes back (Archived), the ACCEPTed ones and ``None`` are
    Acknowledged; the handler's calls hold the records of one ShareFetch each."""
    calls: list[list[tuple[int, int]]] = []
    first = [ACCEPT, RELEASE, REJECT, None, RELEASE, AcknowledgeType.ACCEPT]

    async def handler(records: list[ShareRecord]) -> list[Any]:
        calls.append([(r.offset, r.delivery_count) for r in records])
        if len(calls) == 1:
            return first
        return [ACCEPT] * len(records)

    async def scenario() -> dict[str, int]:
        h = ShareAgentHarness(handler, topic=TOPIC, group="g", concurrency=8, batch=True)
        h.put_many(f"r{i}".encode() for i in range(6))  # before the first fetch
        async with h:
            assert (await h.run_until_idle()).done
            view = h.share_partition(0)
            assert view is not None and (view.spso, view.speo) == (6, 6)
            assert [r.state for r in h.records()] == [
                RecordState.ACKNOWLEDGED,
                RecordState.ACKNOWLEDGED,
                RecordState.ARCHIVED,
                RecordState.ACKNOWLEDGED,
                RecordState.ACKNOWLEDGED,
                RecordState.ACKNOWLEDGED,
            ]
            assert [r.outcome_types for r in h.records()] == [
                [ACCEPT],
                [RELEASE, ACCEPT],
                [REJECT],
                [ACCEPT],
                [RELEASE, ACCEPT],
                [ACCEPT],
            ]
            (agent,) = h.members
            await agent.stop()
            return agent.stats.as_dict()

    stats = run(scenario())
    # concurrency=8: the agent keeps up to 2 x 8 = 16 records acquired, and a ShareFetch of a
    # batch agent acquires half of that: the first one holds all six.
    assert calls[0] == [(o, 1) for o in range(6)]
    assert sorted(x for call in calls[1:] for x in call) == [(1, 2), (4, 2)]
    assert (stats["accepted"], stats["released"], stats["rejected"]) == (5, 2, 1)
    assert (stats["delivered"], stats["redelivered"], stats["handler_errors"]) == (8, 2, 0)


def test_one_outcome_for_the_whole_batch() -> None:
    """A single outcome applies to every record: RELEASE brings them all back (count 2),
    REJECT then Archives them all; nothing is delivered a third time."""
    calls: list[list[tuple[int, int]]] = []

    async def handler(records: list[ShareRecord]) -> AcknowledgeType:
        calls.append([(r.offset, r.delivery_count) for r in records])
        return RELEASE if records[0].delivery_count == 1 else REJECT

    async def scenario() -> None:
        h = ShareAgentHarness(handler, topic=TOPIC, group="g", concurrency=2, batch=True)
        h.put_many(f"r{i}".encode() for i in range(3))  # before the first fetch
        async with h:
            assert (await h.run_until_idle()).done
            assert [r.offset for r in h.archived()] == [0, 1, 2]
            assert {tuple(r.outcome_types) for r in h.records()} == {(RELEASE, REJECT)}
            (agent,) = h.members
            await agent.stop()
            assert agent.stats.rejected == 3 and agent.stats.released == 3

    run(scenario())
    handled = Counter(x for call in calls for x in call)
    assert handled == Counter([(o, c) for o in range(3) for c in (1, 2)])


def test_batch_outcomes_maps_what_a_handler_returns() -> None:
    """``batch_outcomes``: a sequence of the right length of outcomes (``None`` = ACCEPT), or
    one outcome; anything else is None (the agent then releases the batch)."""
    assert batch_outcomes([None, RELEASE, REJECT], 3) == [ACCEPT, RELEASE, REJECT]
    assert batch_outcomes((ACCEPT,), 1) == [ACCEPT]
    assert batch_outcomes(None, 4) is ACCEPT
    assert batch_outcomes(REJECT, 4) is REJECT
    assert batch_outcomes([], 0) == []
    for junk in (
        [ACCEPT, ACCEPT],  # too short
        [ACCEPT] * 4,  # too long
        [ACCEPT, "ACCEPT", None],  # an element that is not an outcome
        [ACCEPT, AcknowledgeType.RENEW, None],  # not a final outcome
        [ACCEPT, AcknowledgeType.GAP, None],
        AcknowledgeType.RENEW,
        "ACC",  # a str is not a sequence of outcomes, even of the right length
        b"\x01\x01\x01",
        {ACCEPT, RELEASE, REJECT},  # not ordered
        1,
        True,
    ):
        assert batch_outcomes(junk, 3) is None, junk


def test_a_handler_that_changes_its_list_changes_no_outcome() -> None:
    """The handler gets a list of its own: emptying it loses no record (the single ACCEPT
    still applies to the three records it was called with)."""
    clock = FakeClock()

    async def handler(records: list[ShareRecord]) -> None:
        records.clear()

    async def scenario() -> None:
        async with cluster_with(3, clock=clock) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=4, batch=True)
            await until(lambda: spso(cluster) == 3, "every record accepted", clock)
            await agent.stop()
            assert agent.stats.accepted == 3

    run(scenario())


# -- failures, as on the per-record path -----------------------------------------------------


def _run_failing(batch: bool, fail: Callable[[], Any], calls: int = 6) -> tuple[Any, ...]:
    """Three records; the handler fails (``fail()``) on the first delivery and accepts the
    second (``calls``: the records the handler sees in all). Returns the leader's states after
    the first round, the deliveries seen, the stats and the captured logs."""
    clock = FakeClock()
    seen: list[tuple[int, int]] = []

    async def per_record(record: ShareRecord) -> Any:
        seen.append((record.offset, record.delivery_count))
        if record.delivery_count == 1:
            return fail()
        return None

    async def per_batch(records: list[ShareRecord]) -> Any:
        seen.extend((r.offset, r.delivery_count) for r in records)
        if records[0].delivery_count == 1:
            return fail()
        return None

    async def scenario() -> tuple[list[tuple[RecordState, int]], dict[str, int]]:
        async with cluster_with(3, clock=clock) as cluster:
            handler = per_batch if batch else per_record
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=4, batch=batch)
            await until(lambda: len(seen) >= calls, "every record delivered twice", clock)
            await until(lambda: spso(cluster) == 3, "every record accepted", clock)
            await agent.stop()
            return [state(cluster, o) for o in range(3)], agent.stats.as_dict()

    with capture_logs() as logs:
        states, stats = run(scenario())
    return states, sorted(seen), stats, logs


def _raise() -> Any:
    raise RuntimeError("boom")


def test_a_raising_batch_handler_has_its_records_retried_alone() -> None:
    """The handler raises: each record of its batch is handled alone next, on the same
    delivery (docs/concepts.md "Throttled delivery"), so one poison record fails alone. Here
    every first delivery raises, so each single call raises too: each record is RELEASEd
    (delivered again with count 2) as when a per-record handler raises for it, and the batch's
    failure is counted and logged once (``batch_handler_raised_retrying_alone``)."""
    per_record = _run_failing(False, _raise)
    per_batch = _run_failing(True, _raise, calls=9)
    assert per_batch[0] == per_record[0] == [(RecordState.ARCHIVED, 0)] * 3
    assert per_record[1] == [(o, c) for o in range(3) for c in (1, 2)]
    assert per_batch[1] == [(o, c) for o in range(3) for c in (1, 1, 2)]
    stats = per_batch[2]
    assert (stats["handler_errors"], stats["released"], stats["accepted"]) == (6, 3, 3)
    (line,) = events(per_batch[3], "batch_handler_raised_retrying_alone")
    assert line["log_level"] == "warning" and "boom" in line["error"]
    assert (line["offsets"], line["records"], line["partition"]) == ("0..2", 3, 0)
    alone = events(per_batch[3], "handler_raised_batch_released")
    assert sorted(line["offsets"] for line in alone) == ["0", "1", "2"]
    assert len(events(per_record[3], "handler_raised_record_released")) == 3


@pytest.mark.parametrize(
    "junk",
    [
        pytest.param(lambda: [ACCEPT], id="too-short"),
        pytest.param(lambda: [ACCEPT] * 4, id="too-long"),
        pytest.param(lambda: [ACCEPT, "yes", ACCEPT], id="wrong-element"),
        pytest.param(lambda: "ACCEPT", id="wrong-type"),
    ],
)
def test_a_wrong_result_releases_the_batch_with_an_error_naming_agent_and_result(
    junk: Callable[[], Any],
) -> None:
    """Junk (wrong length, wrong type): every record is RELEASEd as on a raise (delivered
    again with count 2, nothing lost), with one error line naming the agent, what came back
    and what was expected."""
    states, seen, stats, logs = _run_failing(True, junk)
    assert states == [(RecordState.ARCHIVED, 0)] * 3
    assert seen == [(o, c) for o in range(3) for c in (1, 2)]
    assert (stats["handler_errors"], stats["released"], stats["accepted"]) == (3, 3, 3)
    (line,) = events(logs, "batch_handler_returned_invalid_outcome_records_released")
    assert line["log_level"] == "error"
    assert line["agent"].endswith("per_batch")
    assert line["returned"] == repr(junk())
    assert "a sequence of 3 outcomes" in line["expected"]
    assert (line["offsets"], line["records"]) == ("0..2", 3)


def test_undecodable_records_are_rejected_and_left_out_of_the_batch() -> None:
    """As on the per-record path: a record the decoder refuses is REJECTed with
    ``undecodable_record_rejected`` and the handler gets the others, decoded."""
    clock = FakeClock()
    calls: list[list[tuple[int, Any]]] = []

    def decode(record: ShareRecord) -> None:
        if record.offset == 1:
            raise ValueError("not UTF-8 enough")
        record.value = record.value.decode()

    async def handler(records: list[ShareRecord]) -> None:
        calls.append([(r.offset, r.value) for r in records])

    async def scenario() -> dict[str, int]:
        async with cluster_with(4, clock=clock) as cluster:
            agent = await cluster.agent(
                handler, TOPIC, "g", concurrency=4, batch=True, decode=decode
            )
            await until(lambda: spso(cluster) == 4, "every record acknowledged", clock)
            await agent.stop()
            return agent.stats.as_dict()

    with capture_logs() as logs:
        stats = run(scenario())
    assert calls == [[(0, "r0"), (2, "r2"), (3, "r3")]]
    assert (stats["undecodable"], stats["rejected"], stats["accepted"]) == (1, 1, 3)
    rejected = events(logs, "undecodable_record_rejected")
    assert [(e["offset"], e["delivery_count"]) for e in rejected] == [(1, 1)]


def test_a_batch_of_only_undecodable_records_does_not_call_the_handler() -> None:
    clock = FakeClock()
    calls: list[list[ShareRecord]] = []

    def decode(record: ShareRecord) -> None:
        raise ValueError("no")

    async def handler(records: list[ShareRecord]) -> None:
        calls.append(records)

    async def scenario() -> None:
        async with cluster_with(2, clock=clock) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", batch=True, decode=decode)
            await until(lambda: spso(cluster) == 2, "both archived", clock)
            await agent.stop()
            assert agent.stats.rejected == 2

    run(scenario())
    assert calls == []


def test_a_queued_batch_whose_lock_expired_is_released_unhandled() -> None:
    """As on the per-record path: records whose lock expired while their batch waited for a
    handler are released without calling it (``acquisition_lock_expired_before_handling``).

    ``concurrency=1``: the agent keeps 2 records acquired, 1 per ShareFetch; record 1 waits
    while the handler holds record 0 past the 1 s lock."""
    clock = FakeClock()
    proceed = asyncio.Event()
    calls: list[list[tuple[int, int]]] = []

    async def handler(records: list[ShareRecord]) -> None:
        calls.append([(r.offset, r.delivery_count) for r in records])
        await proceed.wait()

    async def scenario() -> dict[str, int]:
        async with cluster_with(2, clock=clock) as cluster:
            agent = await cluster.agent(
                handler, TOPIC, "g", concurrency=1, batch=True, lock_duration_ms=1000
            )
            await eventually(
                lambda: len(calls) == 1 and agent.stats.delivered == 2,
                "record 0 in the handler, record 1 queued",
            )
            clock.advance(2000)
            proceed.set()
            await eventually(lambda: agent.stats.lock_expired == 1, "record 1 released")
            await agent.stop()
            return agent.stats.as_dict()

    with capture_logs() as logs:
        stats = run(scenario())
    # (The leader then delivers both again: their locks expired there too.)
    assert calls[0] == [(0, 1)]
    assert all((1, 1) not in call for call in calls)  # its first delivery was never handled
    assert stats["lock_expired"] == 1
    (line,) = events(logs, "acquisition_lock_expired_before_handling")
    assert (line["offset"], line["delivery_count"]) == (1, 1)


# -- batch size and concurrency ----------------------------------------------------------------


def test_batch_size_bounds_every_call_and_every_record_is_handled_once() -> None:
    """``batch_size=3``: a ShareFetch of more records is split into calls of at most 3."""
    clock = FakeClock()
    calls: list[list[int]] = []

    async def handler(records: list[ShareRecord]) -> None:
        calls.append([r.offset for r in records])

    async def scenario() -> None:
        async with cluster_with(20, clock=clock) as cluster:
            agent = await cluster.agent(
                handler, TOPIC, "g", concurrency=8, batch=True, batch_size=3
            )
            await until(lambda: spso(cluster) == 20, "every record acknowledged", clock)
            await agent.stop()

    run(scenario())
    assert max(len(call) for call in calls) == 3
    # The first ShareFetch acquired 16 / 2 = 8 records: calls of 3, 3 and 2.
    for call in ([0, 1, 2], [3, 4, 5], [6, 7]):
        assert call in calls
    assert sorted(o for call in calls for o in call) == list(range(20))


def test_without_batch_size_a_call_gets_the_whole_share_fetch() -> None:
    """Each call holds the records of one ShareFetch: with ``concurrency=8`` the agent keeps up
    to 16 records acquired and a ShareFetch acquires half of that, so 10 records come in two
    ShareFetches (8, then the 2 left), handled in two calls."""
    clock = FakeClock()
    calls: list[list[int]] = []

    async def handler(records: list[ShareRecord]) -> None:
        calls.append([r.offset for r in records])

    async def scenario() -> None:
        async with cluster_with(10, clock=clock) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=8, batch=True)
            await until(lambda: spso(cluster) == 10, "every record acknowledged", clock)
            await agent.stop()

    run(scenario())
    assert sorted(calls) == [list(range(8)), [8, 9]]


def test_concurrency_is_concurrent_batches() -> None:
    """``concurrency=2``: two batch calls run at once (each waits for the other, so one at a
    time would never finish), never more; every record is handled exactly once."""
    clock = FakeClock()
    handled: Counter[tuple[int, int]] = Counter()
    running = peak = 0
    two_running = asyncio.Event()

    async def handler(records: list[ShareRecord]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 2:
            two_running.set()
        await two_running.wait()
        handled.update((r.partition, r.offset) for r in records)
        running -= 1

    async def scenario() -> None:
        async with cluster_with(20, partitions=2, clock=clock) as cluster:
            agent = await cluster.agent(
                handler, TOPIC, "g", concurrency=2, batch=True, batch_size=2
            )
            await until(
                lambda: (spso(cluster, 0), spso(cluster, 1)) == (10, 10),
                "every record acknowledged",
                clock,
            )
            await agent.stop()

    run(scenario())
    assert handled == Counter({(p, o): 1 for p in (0, 1) for o in range(10)})
    assert peak == 2


# -- stopping ----------------------------------------------------------------------------------


def test_stop_releases_the_queued_batches_and_sends_the_running_ones_outcomes() -> None:
    """Graceful drain with batches: the batches still queued are RELEASEd unhandled (count
    stays 1), the batches in their handlers finish and their outcomes are sent.

    ``concurrency=2, batch_size=1``: the agent keeps 4 records acquired, 2 per ShareFetch, so
    two calls run (records 0 and 1) and two batches wait (2 and 3)."""
    proceed = asyncio.Event()
    calls: list[list[int]] = []

    async def handler(records: list[ShareRecord]) -> AcknowledgeType:
        calls.append([r.offset for r in records])
        await proceed.wait()
        return ACCEPT if records[0].offset == 0 else REJECT

    async def scenario() -> dict[str, int]:
        async with cluster_with(6) as cluster:
            agent = await cluster.agent(
                handler, TOPIC, "g", concurrency=2, batch=True, batch_size=1
            )
            await eventually(
                lambda: len(calls) == 2 and agent.stats.delivered == 4,
                "two batches in their handlers, two queued",
            )
            stopping = asyncio.ensure_future(agent.stop())
            for _ in range(100):  # stop() releases the queued batches before it waits
                if agent.stats.released or stopping.done():
                    break
                await asyncio.sleep(0)
            assert agent.stats.released == 2
            assert not stopping.done()  # still waiting for the handlers
            proceed.set()
            await asyncio.wait_for(stopping, timeout=5)
            await settle(cluster)
            assert spso(cluster) == 2  # 0 ACCEPTed, 1 REJECTed
            # Never handed to a handler: their delivery is given back (docs/concepts.md
            # "Delivery counts").
            assert state(cluster, 2) == state(cluster, 3) == (RecordState.AVAILABLE, 0)
            assert cluster.share_partition("g", TOPIC, 0).acquired_count == 0
            return agent.stats.as_dict()

    with capture_logs() as logs:
        stats = run(scenario())
    assert sorted(calls) == [[0], [1]]
    assert (stats["accepted"], stats["rejected"], stats["released"]) == (1, 1, 2)
    assert not events(logs, "drain_timeout")
    assert not events(logs, "member_records_released")  # the agent released them itself


# -- declaration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 10}, "needs batch=True"),
        ({"batch": True, "batch_size": 0}, "must be >= 1"),
    ],
)
def test_bad_batch_arguments_are_refused_at_declaration(
    kwargs: dict[str, Any], message: str
) -> None:
    async def handler(records: list[ShareRecord]) -> None:
        return None

    cluster = InProcessCluster({TOPIC: 1}, clock=FakeClock())
    with pytest.raises(ConfigurationError, match=message):
        ShareAgent(cluster.member_context, handler, TOPIC, "g", **kwargs)


@pytest.mark.usefixtures("restore_logging")
def test_app_share_agent_declares_a_batch_agent() -> None:
    """``@app.share_agent(..., batch=True, batch_size=...)`` passes both on to the agent."""
    app = queueflow.App("batch-test", broker="kafka://localhost:9092", role="member")

    @app.share_agent("jobs", group="g", batch=True, batch_size=7)
    async def handle(records: list[ShareRecord]) -> None:
        return None

    assert isinstance(handle, ShareAgent)
    assert (handle.batch, handle.batch_size) == (True, 7)


# -- the reader's records ----------------------------------------------------------------------


def test_share_records_builds_the_records_the_constructor_builds() -> None:
    """``share_records`` (the reader's hot loop) fills every field of ``ShareRecord`` as the
    constructor does, reports offsets without records as gaps, and stops at ``last``."""
    messages = [
        ConsumerRecord("jobs", 3, offset, 1000 + offset, 1, b"k", b"v%d" % offset, None, 1, 2, ())
        for offset in (5, 6, 8, 9, 12)
    ]
    records: list[ShareRecord] = []
    gaps: list[int] = []
    expected = share_records(messages, "jobs", 3, 5, 10, 2, records, gaps)
    assert expected == 11
    assert gaps == [7, 10]
    assert records == [
        ShareRecord("jobs", 3, o, b"k", b"v%d" % o, (), 1000 + o, 2, b"v%d" % o, b"k", math.inf, 1)
        for o in (5, 6, 8, 9)
    ]


def test_share_records_stops_at_the_offset_after_last() -> None:
    """A read of ``last - first + 1`` records over a transaction marker (or a compacted hole)
    returns the record right after ``last`` too: it was not acquired, so it is not a record
    of the range (it was handed out, then delivered again when acquired)."""
    messages = [
        ConsumerRecord("jobs", 0, offset, 0, 1, None, b"v", None, 0, 1, ())
        for offset in (0, 1, 2, 4, 5)  # 3: a transaction marker
    ]
    records: list[ShareRecord] = []
    gaps: list[int] = []
    assert share_records(messages, "jobs", 0, 0, 4, 1, records, gaps) == 5
    assert [r.offset for r in records] == [0, 1, 2, 4]
    assert gaps == [3]


def test_share_records_stops_at_last_when_skipped_offsets_let_the_fetch_run_past_it() -> None:
    """A fetch for ``last - first + 1`` records returns records after ``last`` when offsets in
    between hold none (aborted records left out by a read_committed fetch, markers,
    compaction): they are not the member's and must not be handed to a handler."""
    messages = [
        ConsumerRecord("jobs", 0, offset, 0, 0, None, b"v", None, 1, 1, ())
        for offset in (0, 5, 6, 7, 8)  # 1..4: an aborted transaction and its marker
    ]
    records: list[ShareRecord] = []
    gaps: list[int] = []
    assert share_records(messages, "jobs", 0, 0, 5, 1, records, gaps) == 6
    assert [r.offset for r in records] == [0, 5]
    assert gaps == [1, 2, 3, 4]
