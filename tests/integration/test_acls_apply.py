"""``queueflow acls apply`` on the secured broker (docs/operations.md "Junk floods, quotas and
ACLs"): it creates the minimal ACLs of an app's leader and member principals and sets the
member principals' producer quota; then an outsider principal can't write any internal topic
(``TopicAuthorizationFailedError``), the quota is in DescribeClientQuotas, and the app works."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_security_acls as sec
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError
from security_env import USERS

from queueflow.devtools.broker import LocalBroker
from queueflow.devtools.broker.quotas import describe_user_quotas
from queueflow.protocol import topics

QUOTA = 262_144


async def outsider_write(broker: LocalBroker, topic: str) -> None:
    """Produce one record to ``topic`` as ``qf-nobody`` (a principal with no ACLs)."""
    assert broker.security is not None
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.sasl_bootstrap, **broker.security.sasl_kwargs("qf-nobody")
    )
    await producer.start()
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, b"junk", partition=0), 30)
    finally:
        await producer.stop()


def test_acls_apply_lets_only_the_apps_principals_write_and_sets_the_member_quota(
    secured_broker: LocalBroker, tmp_path: Path
) -> None:
    broker = secured_broker
    assert broker.security is not None
    secured = sec.Secured(broker, tmp_path)
    argv = [sys.executable, "-m", "queueflow", "acls", "apply", "--app", secured.app_id]
    argv += ["--topic", secured.topic, "--leader-principal", "User:qf-leader"]
    argv += ["--member-principal", "User:qf-member", "--member-principal", "User:qf-consumer"]
    argv += ["--member-producer-byte-rate", str(QUOTA)]
    argv += ["--bootstrap-server", broker.sasl_bootstrap, "--security-protocol", "SASL_SSL"]
    argv += ["--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "admin"]
    argv += ["--ssl-cafile", str(broker.security.ca_path)]
    env = {**os.environ, "QUEUEFLOW_SASL_PASSWORD": USERS["admin"]}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "applied" in done.stdout
    try:
        asyncio.run(sec.produce(broker, secured.topic, sec.RECORDS))
        leader, web_port = secured.worker("leader", "qf-leader")
        leader.wait_ready(90, what="leader worker (SASL_SSL)")
        secured.worker("member", "qf-member")
        consumer = sec.consumer_for(broker, secured.app_id, user="qf-consumer")
        assert sec.run_group(secured, consumer, web_port) == set(range(sec.RECORDS))
    finally:
        secured.stop()
    for topic in (
        topics.coordinator_topic(secured.app_id),
        topics.request_topic(secured.app_id, secured.topic),
        topics.reply_topic(secured.app_id),
    ):
        with pytest.raises(TopicAuthorizationFailedError):
            asyncio.run(outsider_write(broker, topic))
    quotas = describe_user_quotas(sec.admin_kwargs(broker), "User:qf-member")
    assert quotas == {"producer_byte_rate": float(QUOTA)}
