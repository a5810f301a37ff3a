"""queueflow on a secured cluster: SASL_SSL (SCRAM-SHA-512) with Kafka's StandardAuthorizer and
exactly the minimal ACLs of docs/operations.md ("Secured clusters").

A ``leader`` worker, a ``member`` worker and a ShareConsumer, each under its own principal, work
one share group; every produced record is handled and ACCEPTed (the share-partition start
offsets reach the end of the topic). A principal without ACLs fails with an authorization
error that names what it lacks.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from security_env import USERS, role_acls

from queueflow import ShareConsumer
from queueflow.devtools.broker import LocalBroker, create_topic, find_free_ports
from queueflow.devtools.broker.acls import create_acls
from queueflow.testing import WorkerProcess, faust_worker_argv

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 60
PARTITIONS = 2
#: Seconds for every record to be handled and acknowledged.
DEADLINE_S = 60.0


def admin_kwargs(broker: LocalBroker) -> dict[str, Any]:
    assert broker.security is not None
    return {"bootstrap_servers": broker.sasl_bootstrap, **broker.security.sasl_kwargs("admin")}


async def produce(broker: LocalBroker, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(**admin_kwargs(broker), acks="all")
    await producer.start()
    try:
        for i in range(count):
            await producer.send(topic, json.dumps({"i": i}).encode(), partition=i % PARTITIONS)
        await producer.flush()
    finally:
        await producer.stop()


def consumer_for(broker: LocalBroker, user: str, app_id: str) -> ShareConsumer:
    assert broker.security is not None
    return ShareConsumer(
        "secured",
        app_id=app_id,
        bootstrap_servers=broker.sasl_bootstrap,
        settings={"share.auto.offset.reset": "earliest"},
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=user,
        sasl_plain_password=USERS[user],
        ssl_context=broker.security.ssl_context(),
    )


class Secured:
    """One app on the secured broker: its topic, ACLs and worker processes."""

    def __init__(self, broker: LocalBroker, tmp_path: Path) -> None:
        assert broker.security is not None
        self.broker = broker
        self.tmp_path = tmp_path
        self.app_id = f"qf-sec-{uuid.uuid4().hex[:8]}"
        self.topic = f"qf-sec-src-{uuid.uuid4().hex[:8]}"
        self.ledger = tmp_path / "ledger.jsonl"
        self.workers: list[WorkerProcess] = []
        create_topic(
            broker.bootstrap,
            self.topic,
            PARTITIONS,
            client_kwargs={**admin_kwargs(broker), "bootstrap_servers": broker.sasl_bootstrap},
            timeout_s=30,
        )

    def grant(self, role: str, user: str) -> None:
        create_acls(
            admin_kwargs(self.broker), role_acls(role, f"User:{user}", self.app_id, [self.topic])
        )

    def worker(self, role: str, user: str) -> tuple[WorkerProcess, int]:
        assert self.broker.security is not None
        (web_port,) = find_free_ports(1)
        env = {
            "SEC_APP_ID": self.app_id,
            "SEC_BROKER": self.broker.sasl_bootstrap,
            "SEC_TOPIC": self.topic,
            "SEC_LEDGER": str(self.ledger),
            "SEC_USER": user,
            "SEC_PASSWORD": USERS[user],
            "SEC_CAFILE": str(self.broker.security.ca_path),
            "QUEUEFLOW_ROLE": role,
        }
        argv = faust_worker_argv(
            "tests.integration.security_app", self.tmp_path / f"data-{role}", web_port=web_port
        )
        worker = WorkerProcess(argv, self.tmp_path / f"{role}.log", env, cwd=ROOT)
        self.workers.append(worker.start())
        return worker, web_port

    def handled(self) -> set[int]:
        if not self.ledger.exists():
            return set()
        return {json.loads(line)["i"] for line in self.ledger.read_text().splitlines()}

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


@pytest.fixture
def secured(secured_broker: LocalBroker, tmp_path: Path) -> Iterator[Secured]:
    app = Secured(secured_broker, tmp_path)
    try:
        yield app
    finally:
        app.stop()


def spso(web_port: int, topic: str) -> float:
    """The sum over partitions of the group's share-partition start offsets (-1 if unknown)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return -1
    total, seen = 0.0, 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "queueflow_share_partition_start_offset"
                and labels.get("topic") == topic
                and labels.get("group") == "secured"
            ):
                total += sample.value
                seen += 1
    return total if seen == PARTITIONS else -1


def test_leader_member_and_consumer_under_minimal_acls(secured: Secured) -> None:
    secured.grant("leader", "qf-leader")
    secured.grant("member", "qf-member")
    secured.grant("consumer", "qf-consumer")
    asyncio.run(produce(secured.broker, secured.topic, RECORDS))
    leader, leader_port = secured.worker("leader", "qf-leader")
    leader.wait_ready(90, what="leader worker (SASL_SSL)")
    member, _ = secured.worker("member", "qf-member")

    async def consume() -> set[int]:
        got: set[int] = set()
        deadline = time.monotonic() + DEADLINE_S
        async with consumer_for(secured.broker, "qf-consumer", secured.app_id) as consumer:
            await consumer.subscribe([secured.topic])
            while (got | secured.handled()) != set(range(RECORDS)):
                assert time.monotonic() < deadline, (
                    f"not handled: {set(range(RECORDS)) - got - secured.handled()}\n"
                    f"{leader.log_tail()}\n{member.log_tail()}"
                )
                assert leader.alive() and member.alive(), leader.log_tail() + member.log_tail()
                got |= {json.loads(r.value)["i"] for r in await consumer.poll(500)}
            # all handled: wait (polling, acknowledging) until every record is ACCEPTed
            while spso(leader_port, secured.topic) != RECORDS:
                assert time.monotonic() < deadline, leader.log_tail()
                await consumer.poll(200)
        return got

    by_consumer = asyncio.run(consume())
    assert by_consumer | secured.handled() == set(range(RECORDS))
