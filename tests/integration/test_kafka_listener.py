"""The Kafka-protocol listener (``queueflow.kafka.listener``; docs/kafka-listener.md) on the
real broker: Kafka's own Java ``kafka-console-share-consumer.sh`` drains a topic through a
queueflow share group, each record once, and queueflow's admin shows it as a member."""

from __future__ import annotations

import asyncio
import selectors
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic, kafka_tool_argv
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

RECORDS = 40
WAIT_S = 60.0
JVM_OPTS = ["-Xms32m", "-Xmx256m", "-XX:+UseSerialGC"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port} after {timeout_s} s"
            time.sleep(0.2)


def read_lines(proc: subprocess.Popen[str], count: int, timeout_s: float) -> list[str]:
    """``count`` lines of ``proc``'s stdout, or fail after ``timeout_s``."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while len(lines) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"only {len(lines)} of {count} records: {lines}"
            if sel.select(timeout=min(left, 1.0)):
                line = proc.stdout.readline()
                assert line, f"the consumer ended after {len(lines)} records: {lines}"
                lines.append(line.strip())
    return lines


def test_java_console_share_consumer_drains_a_queueflow_group_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = f"qf-klisten-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 2)
    app_id = f"qf-klisten-{uuid.uuid4().hex[:8]}"
    port = free_port()
    values = [f"r{i}" for i in range(RECORDS)]
    asyncio.run(produce_records(kafka_bootstrap, topic, values, partitions=2))
    worker = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path / "data",
        {
            "share.auto.offset.reset": "earliest",
            "group.share.heartbeat.interval.ms": 500,
            "group.share.session.timeout.ms": 6000,
            "queueflow.kafka.listener": f"PLAINTEXT://127.0.0.1:{port}",
        },
    )
    with worker.start():
        wait_listening(port, WAIT_S)
        consumer = subprocess.Popen(
            kafka_tool_argv(
                "console-share-consumer",
                [
                    "--bootstrap-server",
                    f"127.0.0.1:{port}",
                    "--topic",
                    topic,
                    "--group",
                    "g",
                    "--timeout-ms",
                    "120000",
                ],
                jvm_opts=JVM_OPTS,
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            got = read_lines(consumer, RECORDS, WAIT_S)
            assert sorted(got) == sorted(values), got  # every record, each once
            admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

            async def described() -> tuple[list[str], list[int]]:
                deadline = time.monotonic() + WAIT_S
                while True:
                    (group,) = await admin.describe_groups(["g"])
                    lags = [o.lag for o in await admin.list_offsets("g")]
                    if all(lag == 0 for lag in lags) or time.monotonic() > deadline:
                        return [m.client_id for m in group.members], lags
                    await asyncio.sleep(0.5)

            clients, lags = asyncio.run(described())
            assert clients == ["console-share-consumer"], clients
            assert lags == [0, 0], lags  # every record acknowledged (ACCEPTed)
            # nothing more comes: no record is delivered twice
            more = read_lines_nowait(consumer, 2.0)
            assert more == [], more
        finally:
            consumer.terminate()
            try:
                _, err = consumer.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                consumer.kill()
                _, err = consumer.communicate(timeout=30)
            print(err[-3000:] if err else "")
        # the console consumer's close left the group (ShareGroupHeartbeat epoch -1)
        deadline = time.monotonic() + WAIT_S
        while '"reason": "left"' not in (log := worker.log_path.read_text()):
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(0.2)
        assert "kafka_member_joined" in log, log[-3000:]
        assert "kafka_frame_rejected" not in log, log[-3000:]


def read_lines_nowait(proc: subprocess.Popen[str], wait_s: float) -> list[str]:
    """The lines ``proc`` prints within ``wait_s`` seconds."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + wait_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if sel.select(timeout=left):
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line.strip())
    return lines


pytestmark = pytest.mark.timeout(240)
