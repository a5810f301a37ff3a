"""No record and no handler result can stop a member, and a worker that can't authenticate with
its peers gives its partitions back (real broker).

* A record whose header name is not UTF-8, in one batch with good records: a ShareConsumer and
  a share agent handle every good record and REJECT that one (``undecodable_record_rejected``).
* A share agent whose handler raises ``CancelledError`` or ``GeneratorExit``, or returns an
  object whose ``repr()`` raises, on 12 of 200 records (more than its 4 handler tasks): every
  record is handled (those 12 on their second delivery).
* A leader worker with a wrong ``queueflow.auth.secret`` next to one with the right secret:
  it exits non-zero, saying why (``auth_key_mismatch``), its partitions move to the good
  worker, and a member with the right secret gets every record.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiokafka.producer.message_accumulator as accumulator
import aiokafka.producer.producer as producer_module
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from structlog.testing import capture_logs
from test_share_agent import agent_worker, wait_for_ledger
from test_share_groups import LEADER_SETTINGS, MEMBER_SETTINGS

from queueflow import ACCEPT, ShareConsumer
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

GOOD = 25
BAD_AT = 12


class _NotUtf8(str):
    """A header name that aiokafka's (Python) batch builder writes as bytes that are not UTF-8
    (no Kafka client writes one from a string; a raw producer can)."""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
        return b"\xff\xfe-not-utf8"


async def produce_with_bad_header(
    bootstrap: str, topic: str, values: list[bytes], bad_at: int
) -> None:
    """``values`` to ``topic[0]`` in one batch; the record at ``bad_at`` has a header name
    that is not UTF-8."""
    # aiokafka's C builder refuses a str subclass; its Python builder calls encode() on it.
    modules = (accumulator, producer_module)
    originals = [m.DefaultRecordBatchBuilder for m in modules]
    for module in modules:
        module.DefaultRecordBatchBuilder = _DefaultRecordBatchBuilderPy  # type: ignore[misc]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=200)
    try:
        await producer.start()
        sends = [
            await producer.send(
                topic,
                value,
                partition=0,
                headers=[(_NotUtf8("x"), b"h")] if i == bad_at else [("ok", b"1")],
            )
            for i, value in enumerate(values)
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
        for module, original in zip(modules, originals, strict=True):
            module.DefaultRecordBatchBuilder = original  # type: ignore[misc]


@pytest.fixture
def leader(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """A 1-partition topic and a leader worker of a new app: ``(topic, app_id)``."""
    topic = topic_factory(1)
    app_id = f"qf-robust-{uuid.uuid4().hex[:8]}"
    with LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "leader", LEADER_SETTINGS):
        yield topic, app_id


def test_a_share_consumer_rejects_a_record_whose_header_name_is_not_utf8(
    kafka_bootstrap: str, leader: tuple[str, str]
) -> None:
    topic, app_id = leader
    values = [f"record-{i}".encode() for i in range(GOOD + 1)]
    asyncio.run(produce_with_bad_header(kafka_bootstrap, topic, values, BAD_AT))

    async def scenario() -> tuple[list[int], list[dict[str, Any]]]:
        c = ShareConsumer(
            "robust",
            app_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            acknowledgement_mode="explicit",
            settings=MEMBER_SETTINGS,
        )
        got: list[int] = []
        with capture_logs() as logs:
            await c.subscribe([topic])
            deadline = time.monotonic() + 30
            while len(got) < GOOD:
                assert time.monotonic() < deadline, f"only {sorted(got)} within 30 s"
                for record in await c.poll(timeout_ms=500):
                    got.append(record.offset)
                    c.acknowledge(record, ACCEPT)
            await c.commit_sync()
            extra = await c.poll(timeout_ms=1500)  # the bad record is not delivered again
            await c.close()
        return got + [r.offset for r in extra], logs

    got, logs = asyncio.run(scenario())
    assert sorted(got) == [i for i in range(GOOD + 1) if i != BAD_AT]
    rejected = [e for e in logs if e["event"] == "undecodable_record_rejected"]
    assert [e["offset"] for e in rejected] == [BAD_AT], rejected
    assert "UTF-8" in rejected[0]["error"]


def test_a_share_agent_survives_undecodable_records_and_misbehaving_handlers(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path, monkeypatch: Any
) -> None:
    decoded_topic, raw_topic = topic_factory(1), topic_factory(1)
    values = [json.dumps({"i": i}).encode() for i in range(GOOD)]
    values.insert(BAD_AT, json.dumps({"i": -1}).encode())  # its header name is not UTF-8
    values.append(b"\xff not json")  # a value the agent's JSON decoder refuses
    asyncio.run(produce_with_bad_header(kafka_bootstrap, decoded_topic, values, BAD_AT))
    asyncio.run(produce_records(kafka_bootstrap, raw_topic, [str(i) for i in range(200)]))
    monkeypatch.setenv("AGENT_TOPIC2", raw_topic)

    def handled(lines: list[dict[str, Any]], agent: str) -> set[int]:
        return {e["i"] for e in lines if e["agent"] == agent}

    def done(lines: list[dict[str, Any]]) -> bool:
        return len(handled(lines, "decoded")) == GOOD and len(handled(lines, "misbehaving")) == 200

    app = "tests.integration.robust_agent_app"
    with agent_worker(app, decoded_topic, kafka_bootstrap, tmp_path) as (worker, ledger, log, _):
        lines = wait_for_ledger(worker, ledger, log, done)
    text = log.read_text()
    assert handled(lines, "decoded") == set(range(GOOD))
    second = {e["i"] for e in lines if e["agent"] == "misbehaving" and e["delivery_count"] == 2}
    assert second == {i for i in range(200) if i % 50 in (0, 1, 2)}
    assert text.count("undecodable_record_rejected") == 2  # the header, the value
    assert f"offset={BAD_AT}" in text and f"offset={GOOD + 1}" in text
    assert text.count("handler_raised_record_released") == 8  # CancelledError, GeneratorExit
    assert "repr() raised RuntimeError" in text
    assert "share_agent_handler_task_restarted" not in text


def test_a_worker_with_a_wrong_secret_exits_and_its_partitions_move(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic, records = topic_factory(2), 60
    app_id = f"qf-wrong-key-{uuid.uuid4().hex[:8]}"
    right = {"queueflow.auth.mode": "hmac", "queueflow.auth.secret": secrets.token_hex(32)}
    wrong = {**right, "queueflow.auth.secret": secrets.token_hex(32)}
    asyncio.run(
        produce_records(kafka_bootstrap, topic, [f"r{i}" for i in range(records)], partitions=2)
    )
    faust_env = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}
    bad = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path / "bad",
        {**LEADER_SETTINGS, **wrong},
        env=faust_env,
    )
    good = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path / "good",
        {**LEADER_SETTINGS, **right},
        env=faust_env,
    )
    bad.launch()
    good.launch()
    try:
        bad.worker.wait_ready(60, what="wrong-secret worker")
        good.worker.wait_ready(60, what="right-secret worker")
        member = {**MEMBER_SETTINGS, **right, "queueflow.request.timeout.ms": 2000}
        member["queueflow.member.join.timeout.ms"] = 60_000

        async def scenario() -> dict[int, list[int]]:
            # Three members: the wrong-secret worker hears their requests three times as often.
            consumers = [
                ShareConsumer(
                    "wrong-key",
                    app_id=app_id,
                    bootstrap_servers=kafka_bootstrap,
                    acknowledgement_mode="explicit",
                    settings=member,
                )
                for _ in range(3)
            ]
            deliveries: dict[int, list[int]] = {}
            deadline = time.monotonic() + 80

            async def work(c: ShareConsumer) -> None:
                await c.subscribe([topic])
                while len(deliveries) < records:
                    assert time.monotonic() < deadline, f"{len(deliveries)} records within 80 s"
                    for record in await c.poll(timeout_ms=500):
                        key = record.partition * 1000 + record.offset
                        deliveries.setdefault(key, []).append(record.delivery_count)
                        c.acknowledge(record, ACCEPT)
                await c.commit_sync()

            try:
                await asyncio.gather(*(work(c) for c in consumers))
            finally:
                for c in consumers:
                    await c.close()
            return deliveries

        deliveries = asyncio.run(scenario())
        assert bad.process is not None
        code = bad.process.wait(timeout=30)
    finally:
        bad.stop()
        good.stop()
    assert code != 0
    mismatch = bad.events("auth_key_mismatch")
    assert len(mismatch) == 1 and "queueflow.auth.secret differs" in mismatch[0]["note"]
    assert not good.events("auth_key_mismatch")
    assert len(deliveries) == records  # every record handled, none lost
