"""Redelivery on the real broker (docs/concepts.md "Delayed redelivery", "Throttled delivery",
"Delivery counts"): share agents in a Faust worker (role ``all``) for the issue's scenarios,
and ``ShareConsumer`` members of a ``queueflow leader`` worker for delays, the back-off policy
and ``share.delivery.count.mode=attempts``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import queueflow
from queueflow import ACCEPT, RELEASE, ConfigurationError, ShareConsumer, ShareRecord
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker, WorkerProcess, faust_worker_argv
from queueflow.testing import produce as produce_records

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 40.0
HUNG_RECORDS, HUNG = 100, frozenset([0, 1, 2, 3, 40, 41, 42, 43, 44, 45])
POISON_RECORDS, POISON = 20, 3
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 3000,
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
}
MEMBER_SETTINGS = {"group.share.heartbeat.interval.ms": 500, "max.poll.records": 10}


def _offsets(text: str) -> set[int]:
    """``"0..3,7"`` -> {0, 1, 2, 3, 7}."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("..")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _wait(check: Callable[[], bool], worker: WorkerProcess, what: str) -> None:
    deadline = time.monotonic() + 60  # from the worker's start
    while not check():
        assert worker.alive(), worker.log_tail(60)
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{worker.log_tail(60)}"
        time.sleep(0.25)


def _archived(worker: WorkerProcess, group: str) -> dict[int, str]:
    """Offset -> reason of every ``records_archived`` line of ``group`` (each offset once)."""
    out: dict[int, str] = {}
    for event in worker.events("records_archived"):
        if event.get("group") == group:
            for offset in _offsets(event["offsets"]):
                assert offset not in out, f"offset {offset} logged as archived twice"
                out[offset] = event["reason"]
    return out


@pytest.fixture(scope="module")
def agents(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, Path]]:
    """One worker running both agents of ``retry_agents_app`` on their own fresh topics."""
    hung_topic, poison_topic = (f"qf-{k}-{uuid.uuid4().hex[:8]}" for k in ("hung", "poison"))
    for topic, count in ((hung_topic, HUNG_RECORDS), (poison_topic, POISON_RECORDS)):
        create_topic(kafka_bootstrap, topic, 1)
        values = [json.dumps({"i": i}) for i in range(count)]
        asyncio.run(produce_records(kafka_bootstrap, topic, values))
    tmp = tmp_path_factory.mktemp("retry-agents")
    ledger = tmp / "ledger.jsonl"
    env = {
        "AGENT_APP_ID": f"qf-retry-{uuid.uuid4().hex[:8]}",
        "AGENT_BROKER": f"kafka://{kafka_bootstrap}",
        "HUNG_TOPIC": hung_topic,
        "POISON_TOPIC": poison_topic,
        "AGENT_LEDGER": str(ledger),
    }
    argv = faust_worker_argv("tests.integration.retry_agents_app", tmp / "data", without_web=True)
    worker = WorkerProcess(argv, tmp / "worker.log", env, cwd=ROOT)
    worker.start()
    try:
        yield worker, ledger
    finally:
        worker.stop(timeout_s=60)  # SIGKILL if not exited by then: no process leaks


def test_hung_handlers_archive_no_good_record_and_every_archive_is_logged(
    agents: tuple[WorkerProcess, Path],
) -> None:
    """The issue's scenario: 100 records, 10 handlers that never return, concurrency 4, a 5 s
    lock (delivery count limit 2 to bound the run). Records queued behind the four hung calls
    are given back before their locks run out (KIP-932's rule alone would count both of those
    deliveries and archive them unhandled), so every good record is handled and only the hung
    ones are archived, each named once by ``records_archived``."""
    worker, ledger = agents
    good = set(range(HUNG_RECORDS)) - HUNG

    def handled() -> set[int]:
        return {e["i"] for e in _ledger(ledger) if e["agent"] == "hung"}

    _wait(lambda: handled() >= good, worker, "every good record handled")
    _wait(lambda: set(_archived(worker, "hung")) >= HUNG, worker, "hung archived")
    archived = _archived(worker, "hung")
    assert archived == dict.fromkeys(HUNG, "delivery_limit")  # no good record
    counts = {e["i"]: e["delivery_count"] for e in _ledger(ledger) if e["agent"] == "hung"}
    assert max(counts.values()) <= 2
    # Some were given back: early, at the measured handling rate (adaptive acquisition), or
    # when their locks were about to end.
    assert worker.events("unstarted_records_given_back") or worker.events(
        "acquisition_lock_expired_before_handling"
    )


def test_a_poison_record_in_a_batch_does_not_archive_its_neighbours(
    agents: tuple[WorkerProcess, Path],
) -> None:
    """A batch handler raising for one poison record: its records are retried alone, so the
    neighbours are ACCEPTed on their first delivery and only the poison record is archived."""
    worker, ledger = agents
    good = set(range(POISON_RECORDS)) - {POISON}

    def entries() -> list[dict[str, Any]]:
        return [e for e in _ledger(ledger) if e["agent"] == "poison"]

    def done() -> bool:  # every record handled; the poison one on all 3 deliveries
        seen = entries()
        poison = {e["delivery_count"] for e in seen if e["i"] == POISON}
        return {e["i"] for e in seen} >= good and poison >= {1, 2, 3}

    _wait(done, worker, "every record handled and the poison record delivered 3 times")
    # The neighbours were ACCEPTed on their first delivery (a whole-batch RELEASE would
    # deliver them again, and archive them with the poison record at the limit).
    assert all(e["delivery_count"] == 1 for e in entries() if e["i"] != POISON), entries()
    alone = {e["i"] for e in entries() if e["batch"] == 1}
    assert alone - {POISON}  # the failed batch's other records, retried alone
    _wait(lambda: POISON in _archived(worker, "poison"), worker, "the poison record archived")
    assert _archived(worker, "poison") == {POISON: "delivery_limit"}
    assert worker.events("batch_handler_raised_retrying_alone")


# -- ShareConsumer members of a leader worker --------------------------------------------------


@pytest.fixture(scope="module")
def leader(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    topics = {k: f"qf-redeliver-{k}-{uuid.uuid4().hex[:8]}" for k in ("delay", "backoff", "mode")}
    for name in topics.values():
        create_topic(kafka_bootstrap, name, 1)
    worker = LeaderWorker(
        f"qf-redeliver-{uuid.uuid4().hex[:8]}",
        list(topics.values()),
        kafka_bootstrap,
        tmp_path_factory.mktemp("redeliver") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield worker, topics


def member(bootstrap: str, app_id: str, group: str) -> ShareConsumer:
    return ShareConsumer(
        group,
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode="explicit",
        settings=MEMBER_SETTINGS,
    )


async def poll_one(c: ShareConsumer, timeout_s: float = WAIT_S) -> tuple[ShareRecord, float]:
    """The next record and the monotonic time it arrived."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = await c.poll(timeout_ms=200)
        if records:
            assert len(records) == 1, records
            return records[0], time.monotonic()
    raise AssertionError(f"no record within {timeout_s} s")


async def set_group_configs(
    bootstrap: str, worker: LeaderWorker, c: ShareConsumer, group: str, configs: dict[str, Any]
) -> None:
    """Set ``configs`` for ``group`` (it exists: ``c`` joined) and poll with ``c`` until the
    leader applied them (its ``share_group_configs_applied`` line, which lists the configs
    that differ from their defaults: the first of ``configs`` must)."""
    admin = ShareGroupAdmin(worker.app_id, KafkaClientConfig(bootstrap))
    await admin.alter_group_configs(group, configs)
    deadline = time.monotonic() + WAIT_S
    while not any(
        e.get("group") == group and next(iter(configs)) in e.get("configs", {})
        for e in worker.events("share_group_configs_applied")
    ):
        assert time.monotonic() < deadline, worker.log_tail(40)
        assert await c.poll(timeout_ms=200) == []


def test_a_delayed_release_is_not_redelivered_before_its_time(
    kafka_bootstrap: str, leader: tuple[LeaderWorker, dict[str, str]]
) -> None:
    worker, topics = leader
    topic = topics["delay"]

    async def scenario() -> None:
        c = member(kafka_bootstrap, worker.app_id, "delay")
        await c.subscribe([topic])
        try:
            await produce_records(kafka_bootstrap, topic, ["r0"])
            record, _ = await poll_one(c)
            # Bad input: a clear error, and the record is still to be acknowledged.
            for kind, delay, words in (
                (RELEASE, -1, ">= 0 seconds"),
                (RELEASE, 13 * 3600, "above the maximum"),
                (ACCEPT, 1, "RELEASE only"),
            ):
                with pytest.raises(ConfigurationError, match=words):
                    c.acknowledge(record, kind, delay=delay)
            c.acknowledge(record, queueflow.release(3))
            released_at = time.monotonic()
            assert (await c.commit_sync())[next(iter(c.assignment()))] is None
            again, at = await poll_one(c)
            assert again.offset == record.offset and again.delivery_count == 2
            assert at - released_at >= 3.0, at - released_at
            c.acknowledge(again, ACCEPT)
            await c.commit_sync()
        finally:
            await c.close()

    asyncio.run(scenario())


def test_the_back_off_policy_spaces_redeliveries(
    kafka_bootstrap: str, leader: tuple[LeaderWorker, dict[str, str]]
) -> None:
    """``share.redelivery.backoff.ms=1000`` x 2.0: a record RELEASEd (as a raised handler's
    would be) after its 1st and 2nd deliveries is Available again 1 s, then 2 s later."""
    worker, topics = leader
    topic = topics["backoff"]

    async def scenario() -> list[float]:
        c = member(kafka_bootstrap, worker.app_id, "backoff")
        await c.subscribe([topic])
        try:
            await set_group_configs(
                kafka_bootstrap,
                worker,
                c,
                "backoff",
                {"share.redelivery.backoff.ms": 1000, "share.redelivery.backoff.multiplier": 2},
            )
            await produce_records(kafka_bootstrap, topic, ["r0"])
            gaps = []
            record, _ = await poll_one(c)
            for _ in range(2):
                c.acknowledge(record, RELEASE)
                released_at = time.monotonic()
                await c.commit_sync()
                record, at = await poll_one(c)
                gaps.append(at - released_at)
            assert record.delivery_count == 3
            c.acknowledge(record, ACCEPT)
            await c.commit_sync()
            return gaps
        finally:
            await c.close()

    gaps = asyncio.run(scenario())
    assert gaps[0] >= 1.0 and gaps[1] >= 2.0, gaps


def test_attempts_mode_does_not_count_deliveries_whose_lock_ran_out(
    kafka_bootstrap: str, leader: tuple[LeaderWorker, dict[str, str]]
) -> None:
    """``share.delivery.count.mode=attempts`` with a delivery count limit of 2: records whose
    members sat on them until their locks ran out (twice) are delivered a third time with
    delivery count 1, where KIP-932's rule would have archived them."""
    worker, topics = leader
    topic = topics["mode"]

    async def scenario() -> list[ShareRecord]:
        first = member(kafka_bootstrap, worker.app_id, "mode")
        await first.subscribe([topic])
        holders = [first]
        try:
            await set_group_configs(
                kafka_bootstrap,
                worker,
                first,
                "mode",
                {"share.delivery.count.mode": "attempts", "share.delivery.count.limit": 2},
            )
            await produce_records(kafka_bootstrap, topic, ["a", "b", "c"])
            got: list[ShareRecord] = []
            for _ in range(3):  # two holders let the locks run out; the third ACCEPTs
                c = holders[-1]
                got = []
                deadline = time.monotonic() + WAIT_S
                while len(got) < 3:
                    assert time.monotonic() < deadline, got
                    got += await c.poll(timeout_ms=500)
                if len(holders) < 3:
                    nxt = member(kafka_bootstrap, worker.app_id, "mode")
                    await nxt.subscribe([topic])
                    holders.append(nxt)
            for record in got:
                holders[-1].acknowledge(record, ACCEPT)
            await holders[-1].commit_sync()
            return got
        finally:
            for c in holders:  # their RELEASEs of records they no longer hold are dropped
                await c.close()

    got = asyncio.run(scenario())
    assert sorted(r.delivery_count for r in got) == [1, 1, 1], got
