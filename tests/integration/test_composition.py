"""Share agents producing results on the real broker: a chain share agent -> topic -> share
agent -> Faust agent with a table (at-least-once: results published and acknowledged before the
outcome), dead letters, and the bad inputs (a missing sink topic, a value the serializer can't
encode); and the exactly_once member side: its transactional producer commits results with the
ShareAcknowledge message to the ack topic, and an aborted transaction is invisible to
read_committed consumers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from queueflow.devtools.broker import create_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.member.agent import ShareAgent
from queueflow.member.agent.outputs import DEAD_LETTER_HEADER, Outbound
from queueflow.member.agent.results import HandlerResult, Returned
from queueflow.member.agent.transactions import TransactionalPublisher
from queueflow.member.context import MemberContext
from queueflow.member.producer import KafkaResultProducer
from queueflow.member.session import ShareFetchSession
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics as internal
from queueflow.settings import ProcessingGuarantee, ShareGroupSettings
from queueflow.structs import AcknowledgeType, ShareRecord
from queueflow.testing import JSON_LOG_ENV, WorkerProcess, events, faust_worker_argv
from queueflow.testing import produce as produce_records
from tests.integration.topic_reads import read_partition

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 30
WAIT_S = 60


@contextlib.contextmanager
def composition_worker(
    mode: str, bootstrap: str, tmp_path: Path, **topics: str
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """Run tests/integration/composition_app.py in ``mode``; yields (process, ledger, log) and
    stops it with SIGTERM."""
    ledger, log = tmp_path / "ledger.jsonl", tmp_path / "worker.log"
    env = {
        "COMP_APP_ID": f"qf-comp-{uuid.uuid4().hex[:8]}",
        "COMP_BROKER": f"kafka://{bootstrap}",
        "COMP_LEDGER": str(ledger),
        "COMP_MODE": mode,
        **{f"COMP_{name.upper()}": value for name, value in topics.items()},
        **JSON_LOG_ENV,
    }
    argv = faust_worker_argv("tests.integration.composition_app", tmp_path / "data")
    worker = WorkerProcess(argv, log, env, cwd=ROOT)
    worker.start()
    assert worker.process is not None
    try:
        yield worker.process, ledger, log
    finally:
        worker.stop(timeout_s=60)  # SIGKILL if not exited by then: no process leaks


def wait_for(
    worker: subprocess.Popen[bytes], log: Path, done: Callable[[], bool], what: str
) -> None:
    """Poll ``done()`` every 0.5 s until it holds, within :data:`WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert worker.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{what}: " + log.read_text()[-3000:]
        time.sleep(0.5)


def ledger_lines(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []


async def read_topic(
    bootstrap: str, topic: str, isolation_level: str = "read_uncommitted"
) -> list[Any]:
    """Every record of partition 0 of ``topic`` up to its end now (``read_committed``: up to
    the last stable offset, committed records only)."""
    return (await read_partition(bootstrap, topic, isolation_level))[0]


def test_a_chain_share_agent_to_share_agent_to_a_faust_agent_with_a_table(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """jobs -> first (yield) -> mid -> second (Result, Send) -> out -> a Faust agent counting per
    key in a table. Every record is handled once per stage (i % 7 == 3: RELEASEd once after
    yielding, then ACCEPTed: published once); the results are exactly the ACCEPTed records'; a
    REJECT (i % 10 == 9) publishes the record's copy with dead-letter headers only; the table's
    counts per key equal the ACCEPTed results."""
    names = {n: topic_factory(1) for n in ("jobs", "mid", "out", "dlq")}
    keys = [f"k{i % 4}" for i in range(RECORDS)]
    values = [json.dumps({"i": i}) for i in range(RECORDS)]
    asyncio.run(produce_records(kafka_bootstrap, names["jobs"], values, keys=keys))
    rejected = {i for i in range(RECORDS) if i % 10 == 9}
    accepted = [i for i in range(RECORDS) if i not in rejected]
    with composition_worker("chain", kafka_bootstrap, tmp_path, **names) as (worker, ledger, log):

        def counted() -> bool:
            return len([e for e in ledger_lines(ledger) if e["agent"] == "count"]) >= len(accepted)

        wait_for(worker, log, counted, "every result counted")
        dead = asyncio.run(read_topic(kafka_bootstrap, names["dlq"]))
        mid = asyncio.run(read_topic(kafka_bootstrap, names["mid"]))
        out = asyncio.run(read_topic(kafka_bootstrap, names["out"]))
    lines = ledger_lines(ledger)
    first: dict[int, list[int]] = defaultdict(list)
    for e in lines:
        if e["agent"] == "first":
            first[e["i"]].append(e["delivery_count"])
    assert first == {i: ([1, 2] if i % 7 == 3 else [1]) for i in range(RECORDS)}
    assert sorted(json.loads(r.value)["i"] for r in mid) == accepted  # each once
    assert sorted(json.loads(r.value)["i"] for r in out) == accepted
    assert all(r.key == f"k{json.loads(r.value)['i'] % 4}".encode() for r in out)  # by key
    assert sorted(e["i"] for e in lines if e["agent"] == "second") == accepted
    assert sorted(json.loads(r.value)["i"] for r in dead) == sorted(rejected)
    for r in dead:
        headers = {k: v.decode() for k, v in r.headers}
        i = json.loads(r.value)["i"]
        assert r.key == f"k{i % 4}".encode() and r.value == values[i].encode()  # raw copy
        assert headers[DEAD_LETTER_HEADER + "group"] == "first"
        assert headers[DEAD_LETTER_HEADER + "topic"] == names["jobs"]
        assert headers[DEAD_LETTER_HEADER + "offset"] == str(i)
        assert headers[DEAD_LETTER_HEADER + "reason"] == "rejected"
    final: dict[str, int] = {}
    for e in lines:
        if e["agent"] == "count":
            final[e["key"]] = e["count"]
    assert final == dict(Counter(f"k{i % 4}" for i in accepted))


def test_a_missing_sink_topic_or_an_unencodable_value_releases_the_records(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """A sink topic that doesn't exist: logged at start, naming it; each record's results fail
    within the request timeout (not 60 s), the record is RELEASEd and delivered again; a value
    JSON can't encode: RELEASEd with the serializer's error in the log. Nothing is published,
    nothing ACCEPTed."""
    names = {n: topic_factory(1) for n in ("jobs", "mid", "out")}
    names["missing"] = f"qf-missing-{uuid.uuid4().hex[:10]}"
    for topic in (names["jobs"], names["mid"]):
        asyncio.run(produce_records(kafka_bootstrap, topic, [json.dumps({"i": i}) for i in (0, 1)]))
    with composition_worker("bad", kafka_bootstrap, tmp_path, **names) as (worker, ledger, log):

        def redelivered() -> bool:
            seen = {(e["agent"], e["i"]) for e in ledger_lines(ledger) if e["delivery_count"] >= 2}
            return len(seen) == 4

        wait_for(worker, log, redelivered, "every record delivered again")
        out = asyncio.run(read_topic(kafka_bootstrap, names["out"]))
    (missing,) = events(log, "share_agent_sink_topic_missing")
    assert missing["sink_topic"] == names["missing"]
    failed = events(log, "share_agent_results_not_published")
    by_topic = defaultdict(list)
    for e in failed:
        by_topic[e["sink_topic"]].append(e)
    assert by_topic[names["missing"]] and by_topic[names["out"]]
    assert all("serialize" in e["error"] for e in by_topic[names["out"]])  # the codec's error
    assert out == []
    drained = {e["group"]: e for e in events(log, "share_agent_drained")}
    assert drained["missing"]["accepted"] == drained["unencodable"]["accepted"] == 0


# -- exactly_once, member side ---------------------------------------------------------------


def _agent(bootstrap: str, topic: str, tmp: str) -> ShareAgent:
    """An exactly_once agent whose session is built but not joined: enough for its
    transactional publisher, which needs the member's ShareAcknowledge envelope only."""
    settings = ShareGroupSettings(
        request_timeout_ms=3000, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE
    )
    ctx = MemberContext.for_kafka(KafkaClientConfig(bootstrap), tmp, settings)

    async def handler(record: ShareRecord) -> None:
        return None

    agent = ShareAgent(ctx, handler, topic, "g", processing_guarantee="exactly_once")
    agent.session = ShareFetchSession(ctx, "g", [topic], "test")
    return agent


def _record(topic: str, offset: int) -> ShareRecord:
    return ShareRecord(
        topic, 0, offset, None, b"v", [], 0, 1, b"v", b"k", lock_deadline=time.monotonic() + 30
    )


def test_the_transactional_publisher_commits_results_with_the_ack_message(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    """One transaction: the results and one ShareAcknowledge per share-partition to the ack
    topic (the member's request, sealed for the ack topic); visible to read_committed once
    committed. A transaction with a produce to a missing topic is aborted: nothing of it is
    visible to read_committed, and its records are RELEASEd on the normal path (and what an
    aborted transaction wrote stays invisible to read_committed)."""
    source, out = topic_factory(1), topic_factory(1)
    app_id = f"qf-eos-{uuid.uuid4().hex[:8]}"
    ack_topic = internal.ack_topic(app_id, source)
    create_topic(kafka_bootstrap, ack_topic, 1, timeout_s=30)  # named by the app, not the test

    async def scenario() -> tuple[list[Any], list[Any], list[Any], dict[str, int]]:
        agent = _agent(kafka_bootstrap, source, app_id)
        assert agent.session is not None
        transactions = agent.transactions = TransactionalPublisher(agent)
        await transactions.start(agent.session.member_id)
        try:
            good = [_record(source, 0), _record(source, 1)]
            outputs = ((Outbound(out, b"k", b"r0"),), (Outbound(out, b"k", b"r1"),))
            accept = (AcknowledgeType.ACCEPT, AcknowledgeType.REJECT)
            left = transactions.submit(
                HandlerResult(good, accept, None, Returned(None), True, outputs)
            )
            assert left.records == []  # nothing on the normal path
            await transactions.flush()
            assert transactions.committed == 1
            bad = [_record(source, 2)]
            missing = f"qf-missing-{uuid.uuid4().hex[:8]}"
            outputs = ((Outbound(out, b"k", b"r2"), Outbound(missing, b"k", b"x")),)
            transactions.submit(
                HandlerResult(bad, (AcknowledgeType.ACCEPT,), None, Returned(None), False, outputs)
            )
            await transactions.flush()
            assert transactions.aborted == 1
        finally:
            await transactions.close()
            await agent.session.close(leave=False)
        # The producer seam aborts what it wrote: acknowledged by the broker, never committed.
        producer = KafkaResultProducer(
            KafkaClientConfig(kafka_bootstrap), "t", 3000, "txn-" + app_id
        )
        await producer.start()
        try:
            await producer.begin()
            await (await producer.send(out, b"r3", b"k", [], 0))
            await producer.abort()
        finally:
            await producer.close()
        committed = await read_topic(kafka_bootstrap, out, "read_committed")
        everything = await read_topic(kafka_bootstrap, out)
        acks = await read_topic(kafka_bootstrap, ack_topic, "read_committed")
        return committed, everything, acks, agent.stats.as_dict()

    committed, everything, acks, stats = asyncio.run(scenario())
    assert [r.value for r in committed] == [b"r0", b"r1"]  # the aborted r2, r3: invisible
    assert b"r3" in [r.value for r in everything]  # r3 written, then aborted
    (ack,) = acks
    request = protocol.decode(ack.value)
    assert isinstance(request, protocol.ShareFetchRequest)
    assert (request.topic, request.partition, request.max_records) == (source, 0, 0)
    acks_sent = [(first, last, tuple(kinds)) for first, last, kinds in request.acks]
    assert acks_sent == [(0, 0, (1,)), (1, 1, (3,))]  # ACCEPT offset 0, REJECT offset 1
    assert ack.key is not None
    assert (stats["accepted"], stats["rejected"], stats["released"]) == (1, 1, 1)
