"""``share.isolation.level=read_committed`` on the real broker (docs/concepts.md
"read_committed"): a transactional producer commits and aborts in turn, then leaves a
transaction open. A share agent and a ShareConsumer of read_committed groups are handed exactly
the committed records, none past the last stable offset while the transaction is open (their
share-partitions' SPEO stays at or below it), the aborted ones are acknowledged as GAP
(``queueflow_acknowledgements_total{type="gap"}``) or archived by the leader's hole reader; a
read_uncommitted group of the same topic is handed everything, the open transaction's records
too."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from queueflow import ShareConsumer
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import find_free_ports
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import WorkerProcess, faust_worker_argv

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 40.0
MEMBER_SETTINGS = {"group.share.heartbeat.interval.ms": 500}


@contextlib.contextmanager
def agent_worker(topic: str, bootstrap: str, tmp_path: Path) -> Iterator[dict[str, object]]:
    """Run the read_committed agent app (role ``all``) until the block ends (SIGTERM)."""
    ledger, log = tmp_path / "ledger.txt", tmp_path / "worker.log"
    (web_port,) = find_free_ports(1)
    app_id = f"qf-committed-{uuid.uuid4().hex[:8]}"
    env = {
        "AGENT_APP_ID": app_id,
        "AGENT_TOPIC": topic,
        "AGENT_BROKER": f"kafka://{bootstrap}",
        "AGENT_LEDGER": str(ledger),
    }
    argv = faust_worker_argv(
        "tests.integration.committed_agent_app", tmp_path / "data", web_port=web_port
    )
    worker = WorkerProcess(argv, log, env, cwd=ROOT)
    worker.start()
    assert worker.process is not None
    try:
        yield {
            "process": worker.process,
            "ledger": ledger,
            "log": log,
            "web_port": web_port,
            "app_id": app_id,
        }
    finally:
        worker.stop(timeout_s=60)  # SIGKILL if not exited by then: no process leaks


def worker_log(worker: dict[str, object]) -> str:
    log = worker["log"]
    assert isinstance(log, Path)
    return log.read_text()[-6000:]


def handled(worker: dict[str, object]) -> list[str]:
    ledger = worker["ledger"]
    assert isinstance(ledger, Path)
    return ledger.read_text().splitlines() if ledger.exists() else []


def wait_until(
    worker: dict[str, object], done: Callable[[], bool], what: str, timeout_s: float = WAIT_S
) -> None:
    process, log = worker["process"], worker["log"]
    assert isinstance(process, subprocess.Popen) and isinstance(log, Path)
    deadline = time.monotonic() + timeout_s
    while not done():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, (
            f"not within {timeout_s} s: {what}\n" + (log.read_text()[-3000:])
        )
        time.sleep(0.2)


async def transactions(bootstrap: str, topic: str) -> tuple[AIOKafkaProducer, list[str], int]:
    """Four transactions of 5 records, committed and aborted in turn, then a fifth left open
    with 3 records; returns (the producer, the committed values, the open transaction's first
    offset)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"qf-committed-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    committed: list[str] = []
    for t in range(4):
        values = [f"t{t}-{i}" for i in range(5)]
        await producer.begin_transaction()
        for value in values:
            await producer.send(topic, value.encode(), partition=0)
        if t % 2:
            await producer.abort_transaction()
        else:
            await producer.commit_transaction()
            committed += values
    await producer.begin_transaction()
    sent = [await producer.send(topic, f"open-{i}".encode(), partition=0) for i in range(3)]
    first_open = (await sent[0]).offset
    await asyncio.gather(*sent)
    return producer, committed, first_open


async def poll_values(consumer: ShareConsumer, polls: int) -> list[str]:
    got: list[str] = []
    for _ in range(polls):
        got += [r.value.decode() for r in await consumer.poll(timeout_ms=500)]
    return got


async def poll_until(consumer: ShareConsumer, wanted: set[str]) -> list[str]:
    """Poll (implicit acknowledgement) until every value of ``wanted`` came, within WAIT_S."""
    got: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while not wanted <= set(got):
        assert time.monotonic() < deadline, (sorted(wanted - set(got)), got)
        got += [r.value.decode() for r in await consumer.poll(timeout_ms=500)]
    return got


def sample(text: str, name: str, labels: dict[str, str]) -> float:
    """The value of metric ``name{labels}`` in the /metrics ``text`` (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def test_read_committed_groups_get_exactly_the_committed_records(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    with agent_worker(topic, kafka_bootstrap, tmp_path) as worker:
        app_id = str(worker["app_id"])

        def member(group: str) -> ShareConsumer:
            return ShareConsumer(
                group, app_id=app_id, bootstrap_servers=kafka_bootstrap, settings=MEMBER_SETTINGS
            )

        async def scenario() -> None:
            producer, committed, first_open = await transactions(kafka_bootstrap, topic)
            opened = [f"open-{i}" for i in range(3)]
            aborted = [f"t{t}-{i}" for t in (1, 3) for i in range(5)]
            admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))
            committed_member, everything = member("committed-consumer"), member("everything")
            try:
                await committed_member.subscribe([topic])
                await everything.subscribe([topic])
                # read_uncommitted: every record, the open transaction's too.
                seen = await poll_until(everything, set(committed + aborted + opened))
                assert sorted(seen) == sorted(committed + aborted + opened)
                # read_committed: exactly the committed records, nothing past the LSO.
                got = await poll_until(committed_member, set(committed))
                got += await poll_values(committed_member, 3)
                assert got == committed
                await asyncio.to_thread(
                    wait_until, worker, lambda: len(handled(worker)) >= len(committed), "agent"
                )
                assert sorted(handled(worker)) == sorted(committed), (
                    handled(worker),
                    worker_log(worker),
                )
                for group in ("committed-consumer", "committed-agent"):
                    (offsets,) = await admin.list_offsets(group, [topic])
                    assert offsets.end_offset is not None
                    assert offsets.end_offset <= first_open, (group, offsets)
                # The transaction commits: its records are handed out now.
                await producer.commit_transaction()
                assert await poll_until(committed_member, set(opened)) == opened
                await asyncio.to_thread(
                    wait_until,
                    worker,
                    lambda: len(handled(worker)) >= len(committed) + 3,
                    "agent, open",
                )
                assert sorted(handled(worker)) == sorted(committed + opened)
            finally:
                await committed_member.close()
                await everything.close()
                await producer.stop()

        asyncio.run(asyncio.wait_for(scenario(), 3 * WAIT_S))
        labels = {"group": "committed-agent", "topic": topic}
        url = f"http://127.0.0.1:{worker['web_port']}/metrics"

        def counted() -> bool:
            with urllib.request.urlopen(url, timeout=10) as r:
                metrics = r.read().decode()
            acks = "queueflow_acknowledgements_total"
            # 10 aborted records and 5 markers: GAPped by the agent, the first ones at least
            # (from the first GAP on, the leader's hole reader archives them itself:
            # docs/concepts.md "Acquisition counts records"); the 13 committed records accepted.
            gaps = sample(metrics, acks, {**labels, "type": "gap"})
            return 1 <= gaps <= 15 and sample(metrics, acks, {**labels, "type": "accept"}) == 13

        wait_until(worker, counted, "the agent's GAP and ACCEPT counts", timeout_s=15)
