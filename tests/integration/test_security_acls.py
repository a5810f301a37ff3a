"""queueflow on a secured cluster: SASL_SSL (SCRAM-SHA-512) and mTLS, with Kafka's
StandardAuthorizer and exactly the minimal ACLs of docs/operations.md ("Secured clusters").

* a ``leader`` worker and a ``member`` worker (group ``secured``) and a ShareConsumer (group
  ``audit``), each under its own principal with its role's ACLs; then a worker with role ``all``
  and a ShareConsumer authenticated by a client certificate. Every produced record is handled
  in both groups and ACCEPTed (both groups' share-partition start offsets reach the end of the
  topic).
* a principal without ACLs, or without one of them, fails with an error naming the topic.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from security_env import LEADER_CERT, USERS, role_acls
from structlog.testing import capture_logs

from queueflow import ConfigurationError, ShareConsumer
from queueflow.devtools.broker import LocalBroker, create_topic, find_free_ports
from queueflow.devtools.broker.acls import create_acls
from queueflow.devtools.broker.secure import CertificateAuthority
from queueflow.testing import WorkerProcess, faust_worker_argv

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 60
#: Two partitions: the member worker serves both share-partitions through one leader.
PARTITIONS = 2
#: Seconds for every record to be handled and acknowledged.
DEADLINE_S = 60.0
#: The app's shared secret: on a SASL/SSL cluster queueflow refuses to run unsigned unless told
#: to (queueflow.auth.mode=auto), so the secured app signs its control messages.
SECRET = "Sx3-secured-app-9QwErTy7uIoP2aSdFgHjKl0ZxCv"


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


def consumer_for(
    broker: LocalBroker,
    app_id: str,
    user: str | None = None,
    cert: str | None = None,
    group: str = "audit",
    settings: dict[str, str] | None = None,
) -> ShareConsumer:
    """A ShareConsumer of ``group``: SCRAM-SHA-512 as ``user`` over SASL_SSL, or mTLS with the
    client certificate ``cert`` over the SSL listener; ``settings``: further share settings."""
    assert broker.security is not None
    common: dict[str, Any] = {
        "app_id": app_id,
        "settings": {
            "share.auto.offset.reset": "earliest",
            "queueflow.auth.secret": SECRET,
            **(settings or {}),
        },
        "ssl_context": broker.security.ssl_context(cert),
    }
    if cert is not None:
        return ShareConsumer(group, bootstrap_servers=broker.ssl_bootstrap, **common)
    assert user is not None
    return ShareConsumer(
        group,
        bootstrap_servers=broker.sasl_bootstrap,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=user,
        sasl_plain_password=USERS[user],
        **common,
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

    def worker(
        self, role: str, user: str, extra: dict[str, str] | None = None
    ) -> tuple[WorkerProcess, int]:
        assert self.broker.security is not None
        (web_port,) = find_free_ports(1)
        certs = Path(self.broker.security.directory)
        env = {
            # The Kafka connection uses SSL, so the direct path does (its certificate names
            # 127.0.0.1, where the endpoint listens and which it advertises).
            "QUEUEFLOW_LEADER_LISTENER": "127.0.0.1:0",
            "QUEUEFLOW_LEADER_LISTENER_SSL_KEYSTORE_LOCATION": str(
                certs / f"{LEADER_CERT}.keystore.pem"
            ),
            **(extra or {}),
            "SEC_APP_ID": self.app_id,
            "SEC_BROKER": self.broker.sasl_bootstrap,
            "SEC_TOPIC": self.topic,
            "SEC_LEDGER": str(self.ledger),
            "SEC_USER": user,
            "SEC_PASSWORD": USERS[user],
            "SEC_CAFILE": str(self.broker.security.ca_path),
            "QUEUEFLOW_ROLE": role,
            "QUEUEFLOW_AUTH_SECRET": SECRET,
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
        """Stop the workers, members before leaders (so their leave is still answered)."""
        for worker in reversed(self.workers):
            worker.stop()


@pytest.fixture
def secured(secured_broker: LocalBroker, tmp_path: Path) -> Iterator[Secured]:
    app = Secured(secured_broker, tmp_path)
    try:
        yield app
    finally:
        app.stop()


def spso(web_port: int, topic: str, group: str) -> float:
    """The sum over partitions of ``group``'s share-partition start offsets (-1 if unknown)."""
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
                and labels.get("group") == group
            ):
                total += sample.value
                seen += 1
    return total if seen == PARTITIONS else -1


def run_group(secured: Secured, consumer: ShareConsumer, web_port: int) -> set[int]:
    """Poll ``consumer`` (group ``audit``) until it and the workers' agents (group ``secured``)
    each handled every record, and both groups' start offsets reached the end of the topic
    (every record ACCEPTed); within :data:`DEADLINE_S`. Returns what the consumer got."""
    everything = set(range(RECORDS))

    async def consume() -> set[int]:
        got: set[int] = set()
        deadline = time.monotonic() + DEADLINE_S
        async with consumer:
            await consumer.subscribe([secured.topic])
            while not (
                got == everything
                and secured.handled() == everything
                and spso(web_port, secured.topic, "secured") == RECORDS
                and spso(web_port, secured.topic, "audit") == RECORDS
            ):
                assert time.monotonic() < deadline, (
                    f"consumer lacks {everything - got}, agents lack "
                    f"{everything - secured.handled()}\n"
                    + "\n".join(w.log_tail() for w in secured.workers)
                )
                for worker in secured.workers:
                    assert worker.alive(), worker.log_tail()
                got |= {json.loads(r.value)["i"] for r in await consumer.poll(300)}
        return got

    return asyncio.run(consume())


def test_leader_member_and_consumer_under_minimal_acls(secured: Secured) -> None:
    """Roles ``leader`` and ``member`` and a ShareConsumer, each with only its role's ACLs."""
    secured.grant("leader", "qf-leader")
    secured.grant("member", "qf-member")
    secured.grant("consumer", "qf-consumer")
    asyncio.run(produce(secured.broker, secured.topic, RECORDS))
    leader, web_port = secured.worker("leader", "qf-leader")
    leader.wait_ready(90, what="leader worker (SASL_SSL)")
    secured.worker("member", "qf-member")
    consumer = consumer_for(secured.broker, secured.app_id, user="qf-consumer")
    assert run_group(secured, consumer, web_port) == set(range(RECORDS))
    assert {json.loads(x)["worker"] for x in secured.ledger.read_text().splitlines()} == {
        "qf-member"
    }


def test_role_all_and_an_mtls_consumer(secured: Secured) -> None:
    """Role ``all`` over SASL_SSL, and a ShareConsumer authenticated by its client certificate
    (principal ``User:CN=qf-mtls``) with the consumer ACLs."""
    secured.grant("all", "qf-all")
    secured.grant("consumer", "CN=qf-mtls")
    asyncio.run(produce(secured.broker, secured.topic, RECORDS))
    worker, web_port = secured.worker("all", "qf-all")
    worker.wait_ready(90, what="worker with role all (SASL_SSL)")
    consumer = consumer_for(secured.broker, secured.app_id, cert="qf-mtls")
    assert run_group(secured, consumer, web_port) == set(range(RECORDS))


def test_a_principal_without_acls_is_told_what_is_missing(secured: Secured) -> None:
    async def subscribe() -> None:
        async with consumer_for(secured.broker, secured.app_id, user="qf-nobody") as consumer:
            await asyncio.wait_for(consumer.subscribe([secured.topic]), 30)

    with pytest.raises(ConfigurationError, match="not authorized") as info:
        asyncio.run(subscribe())
    assert repr(secured.topic) in str(info.value)
    assert "Secured clusters" in str(info.value)


def test_a_missing_write_acl_names_the_topic(secured: Secured) -> None:
    """The consumer ACLs without WRITE on the coordinator topic (WRITE implies DESCRIBE): the
    consumer can't see the topic, and its start fails with an error naming it."""
    coordinator = f"{secured.app_id}-share-coordinator"
    acls = role_acls("consumer", "User:qf-consumer", secured.app_id, [secured.topic])
    create_acls(
        admin_kwargs(secured.broker),
        [a for a in acls if (a.resource_name, a.operation) != (coordinator, "write")],
    )

    async def subscribe() -> None:
        async with consumer_for(secured.broker, secured.app_id, user="qf-consumer") as consumer:
            await asyncio.wait_for(consumer.subscribe([secured.topic]), 30)

    with pytest.raises(ConfigurationError, match=f"not authorized to access topic.*{coordinator}"):
        asyncio.run(subscribe())


async def consume_all(secured: Secured, consumer: ShareConsumer) -> list[ssl.SSLObject | None]:
    """Poll ``consumer`` until it got every record (within :data:`DEADLINE_S`); returns the TLS
    state of its direct connections that were answered (an ``SSLObject``, or None: plaintext)."""
    everything, got = set(range(RECORDS)), set()
    deadline = time.monotonic() + DEADLINE_S
    async with consumer:
        await consumer.subscribe([secured.topic])
        while got != everything:
            assert time.monotonic() < deadline, f"lacks {everything - got}"
            got |= {json.loads(r.value)["i"] for r in await consumer.poll(300)}
        assert consumer._session is not None
        connections = consumer._session._direct._connections.values()
        return [
            c.writer.get_extra_info("ssl_object")
            for c in connections
            if c.answered and c.writer is not None
        ]


def test_the_direct_path_uses_tls_and_refuses_members_it_cannot_trust(
    secured: Secured, tmp_path: Path
) -> None:
    """On an SSL cluster the direct path uses TLS by default; with
    ``queueflow.leader.listener.ssl.client.auth=required`` only members with a certificate of a
    trusted CA reach it. A member without one, with one of another CA, or in plaintext is
    refused there (the error names what to set) and gets every record through the request
    topics: nothing is lost."""
    assert secured.broker.security is not None
    secured.grant("all", "qf-all")
    secured.grant("consumer", "CN=qf-mtls")
    secured.grant("consumer", "qf-consumer")
    asyncio.run(produce(secured.broker, secured.topic, RECORDS))
    worker, _ = secured.worker(
        "all", "qf-all", {"QUEUEFLOW_LEADER_LISTENER_SSL_CLIENT_AUTH": "required"}
    )
    worker.wait_ready(90, what="worker with role all (SASL_SSL, mTLS direct path)")
    (listening,) = worker.events("leader_endpoint_listening")
    assert listening["tls"] is True, listening

    trusted = consumer_for(secured.broker, secured.app_id, cert="qf-mtls", group="mtls")
    states = asyncio.run(consume_all(secured, trusted))
    assert states and all(s is not None and s.version() in ("TLSv1.2", "TLSv1.3") for s in states)

    stranger = CertificateAuthority(tmp_path / "stranger")
    stranger.issue("qf-stranger")
    refused = {
        "no-certificate": {},
        "other-ca": {
            "queueflow.leader.listener.ssl.keystore.location": str(
                stranger.directory / "qf-stranger.keystore.pem"
            )
        },
        "plaintext": {"queueflow.leader.listener.security.protocol": "PLAINTEXT"},
    }
    for group, settings in refused.items():
        consumer = consumer_for(
            secured.broker, secured.app_id, user="qf-consumer", group=group, settings=settings
        )
        with capture_logs() as logs:
            states = asyncio.run(consume_all(secured, consumer))
        assert states == [], group  # no direct connection ever answered
        reasons = [e["reason"] for e in logs if e["event"] == "direct_path_rerouted"]
        assert reasons, f"{group}: never tried the direct path"
        setting = {"plaintext": "security.protocol"}.get(group, "ssl.client.auth=required")
        assert f"queueflow.leader.listener.{setting}" in reasons[0], reasons
        print(f"{group}: {reasons[0]}")
