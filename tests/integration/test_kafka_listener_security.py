"""Security on the Kafka-protocol listener (docs/kafka-listener.md "Security") on the secured
broker: a worker of an app that reaches Kafka over SASL_SSL (SCRAM-SHA-512) serves its
listener over SASL_SSL. Kafka's Java console share consumer authenticates with SCRAM through
it (the exchange is relayed to the broker) and drains a queueflow group; a wrong password is
refused with SASL_AUTHENTICATION_FAILED, a principal without ACLs with
GROUP_AUTHORIZATION_FAILED, and a request before authentication closes the connection.

One worker serves every test of the module (the secured broker is the session's)."""

from __future__ import annotations

import asyncio
import json
import queue
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from security_env import LEADER_CERT, USERS
from test_kafka_listener import LineReader, free_port, tool_argv, wait_listening
from test_security_acls import ROOT, SECRET, admin_kwargs, produce

from queueflow.devtools.broker import LocalBroker, create_topic, find_free_ports
from queueflow.devtools.broker.acls import AclBinding, create_acls, role_acls
from queueflow.listener.codec import SIZE, encode_request
from queueflow.testing import WorkerProcess, faust_worker_argv

RECORDS = 20
GROUP = "g-java"
#: Seconds for a Java client to start, authenticate and finish.
CLIENT_S = 35.0


@dataclass
class Served:
    """The secured app: its topic, listener port, CA file and working directory."""

    broker: LocalBroker
    topic: str
    port: int
    cafile: Path
    tmp: Path
    worker: WorkerProcess


@pytest.fixture(scope="module")
def served(
    secured_broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    assert secured_broker.security is not None
    tmp = tmp_path_factory.mktemp("listener-sec")
    app_id = f"qf-lsec-{uuid.uuid4().hex[:8]}"
    topic = f"qf-lsec-src-{uuid.uuid4().hex[:8]}"
    create_topic(
        secured_broker.bootstrap,
        topic,
        2,
        client_kwargs={
            **admin_kwargs(secured_broker),
            "bootstrap_servers": secured_broker.sasl_bootstrap,
        },
        timeout_s=30,
    )
    asyncio.run(produce(secured_broker, topic, RECORDS))
    create_acls(
        admin_kwargs(secured_broker),
        [
            *role_acls("all", "User:qf-all", app_id, [topic]),
            AclBinding("User:qf-consumer", "group", GROUP, "read"),
            AclBinding("User:qf-consumer", "topic", topic, "read"),
        ],
    )
    port = free_port()
    (web_port,) = find_free_ports(1)
    certs = Path(secured_broker.security.directory)
    keystore = str(certs / f"{LEADER_CERT}.keystore.pem")
    env = {
        "QUEUEFLOW_LEADER_LISTENER": "127.0.0.1:0",
        "QUEUEFLOW_LEADER_LISTENER_SSL_KEYSTORE_LOCATION": keystore,
        "QUEUEFLOW_KAFKA_LISTENER": f"SASL_SSL://127.0.0.1:{port}",
        "QUEUEFLOW_KAFKA_LISTENER_SSL_KEYSTORE_LOCATION": keystore,
        "SEC_APP_ID": app_id,
        "SEC_BROKER": secured_broker.sasl_bootstrap,
        "SEC_TOPIC": topic,
        "SEC_LEDGER": str(tmp / "ledger.jsonl"),
        "SEC_USER": "qf-all",
        "SEC_PASSWORD": USERS["qf-all"],
        "SEC_CAFILE": str(secured_broker.security.ca_path),
        "QUEUEFLOW_ROLE": "all",
        "QUEUEFLOW_AUTH_SECRET": SECRET,
    }
    argv = faust_worker_argv("tests.integration.security_app", tmp / "data", web_port=web_port)
    worker = WorkerProcess(argv, tmp / "worker.log", env, cwd=ROOT).start()
    try:
        wait_listening(port, 90)
        yield Served(
            secured_broker, topic, port, Path(secured_broker.security.ca_path), tmp, worker
        )
    finally:
        worker.stop()


def client_config(
    served: Served, user: str, password: str, mechanism: str = "SCRAM-SHA-512"
) -> Path:
    """A Java client properties file: SASL_SSL, ``mechanism`` (SCRAM-SHA-512 or PLAIN) as
    ``user``, the CA as a PEM trust store."""
    path = served.tmp / f"{user}-{uuid.uuid4().hex[:6]}.properties"
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    path.write_text(
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={mechanism}\n"
        f"sasl.jaas.config=org.apache.kafka.common.security.{module} required "
        f'username="{user}" password="{password}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={served.cafile}\n"
    )
    return path


def console_consumer(served: Served, config: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        tool_argv(
            "console-share-consumer",
            [
                "--bootstrap-server",
                f"127.0.0.1:{served.port}",
                "--topic",
                served.topic,
                "--group",
                GROUP,
                "--command-config",
                str(config),
                *extra,
            ],
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def refused(served: Served, config: Path, error: str) -> str:
    """The first stderr line of a console share consumer with ``config`` that holds ``error``
    (any case; the client logs it and retries or exits; it is stopped then), checking that it
    got no record."""
    proc = console_consumer(served, config)
    assert proc.stderr is not None
    errors = LineReader(proc, proc.stderr)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + CLIENT_S
        while not seen or error.lower() not in seen[-1].lower():
            left = deadline - time.monotonic()
            assert left > 0, f"no {error!r} from the client within {CLIENT_S} s: {seen[-20:]}"
            try:
                line = errors.lines.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"the client ended without {error!r}: {seen[-20:]}"
            seen.append(line)
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        errors.join(10)
    assert out == "", f"records reached a refused client: {out!r}"
    return seen[-1]


def test_java_console_share_consumer_authenticates_with_scram_and_drains_the_group(
    served: Served,
) -> None:
    proc = console_consumer(
        served, client_config(served, "qf-consumer", USERS["qf-consumer"]), "--timeout-ms", "60000"
    )
    lines = LineReader(proc)
    try:
        got = lines.take(RECORDS, CLIENT_S)
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)
        lines.join(10)
    assert sorted(json.loads(line)["i"] for line in got) == list(range(RECORDS))
    log = (served.tmp / "worker.log").read_text()
    assert '"principal": "User:qf-consumer"' in log and "kafka_client_authenticated" in log


def test_a_wrong_password_is_refused(served: Served) -> None:
    config = client_config(served, "qf-consumer", "not-the-password")
    line = refused(served, config, "failed authentication")
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in line, line


def test_a_principal_without_acls_is_refused(served: Served) -> None:
    # PLAIN this time: relayed as SCRAM is, in one round
    config = client_config(served, "qf-nobody", USERS["qf-nobody"], "PLAIN")
    line = refused(served, config, "authoriz")  # Java: GroupAuthorizationException
    assert GROUP in line, line
    log = (served.tmp / "worker.log").read_text()
    assert f"User:qf-nobody is not authorized to READ group {GROUP}" in log


def test_a_request_before_authentication_closes_the_connection(served: Served) -> None:
    from kio.index import load_request_schema

    metadata = load_request_schema(3, 12)(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )

    async def send() -> bytes:
        context = ssl.create_default_context(cafile=str(served.cafile))
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port, ssl=context)
        try:
            writer.write(encode_request(metadata, 1, "probe"))
            await writer.drain()
            return await asyncio.wait_for(reader.read(SIZE.size), 10)
        finally:
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), 10)

    assert asyncio.run(send()) == b""  # closed, nothing answered (ILLEGAL_SASL_STATE)
