"""The Kafka-protocol listener (``queueflow.kafka.listener``; docs/kafka-listener.md) on the
real broker: Kafka's own Java ``kafka-console-share-consumer.sh`` drains a topic through a
queueflow share group, each record once, and queueflow's admin shows it as a member."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from queueflow import ShareConsumer
from queueflow.admin import ShareGroupAdmin, SharePartitionOffsets
from queueflow.devtools.broker import create_topic, find_free_ports, kafka_libs, kafka_tool_argv
from queueflow.errors import ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker, WorkerProcess, faust_worker_argv
from queueflow.testing import produce as produce_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 40
WAIT_S = 60.0
JVM_OPTS = ["-Xms32m", "-Xmx256m", "-XX:+UseSerialGC"]
#: Kafka's share-group tools come from these jars whatever the broker's release (a 3.9.1
#: broker, QUEUEFLOW_KAFKA_VERSION=3.9.1, has none): the listener is their broker.
TOOLS_VERSION = "4.3.1"


#: The tools' logging (log4j2, as Kafka 4.x uses): WARN and above to stderr, stdout kept for
#: the records and tables the tests read.
TOOLS_LOG4J2 = """\
status = error
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
"""


def tool_argv(tool: str, args: list[str]) -> list[str]:
    """The command line of Kafka's Java ``tool`` from the :data:`TOOLS_VERSION` jars, whatever
    the broker's release (the classpath and logging configuration are theirs)."""
    libs = kafka_libs(version=TOOLS_VERSION)
    config = libs.parent / "listener-tools-log4j2.properties"
    if not config.exists() or config.read_text() != TOOLS_LOG4J2:
        config.write_text(TOOLS_LOG4J2)
    argv = [
        f"-Dlog4j2.configurationFile={config}" if arg.startswith("-Dlog4j") else arg
        for arg in kafka_tool_argv(tool, args, jvm_opts=JVM_OPTS)
    ]
    argv[argv.index("-cp") + 1] = f"{libs}/*"
    return argv


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


class LineReader:
    """``proc``'s stdout lines (or ``stream``'s), read by a thread (a pipe's buffered reader
    hides lines from select)."""

    def __init__(self, proc: subprocess.Popen[str], stream: IO[str] | None = None) -> None:
        stream = stream or proc.stdout
        assert stream is not None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.strip())
        self.lines.put(None)

    def take(self, count: int, timeout_s: float) -> list[str]:
        """``count`` lines, or fail after ``timeout_s``."""
        got: list[str] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"only {len(got)} of {count} records: {got}"
            try:
                line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            assert line is not None, f"the consumer ended after {len(got)} records: {got}"
            got.append(line)
        return got

    def within(self, wait_s: float) -> list[str]:
        """The lines that come within ``wait_s`` seconds."""
        got: list[str] = []
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            got.append(line)
        return got

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def start_console_consumer(
    port: int, topic: str, group: str, *extra: str
) -> tuple[subprocess.Popen[str], LineReader]:
    """Kafka's Java console share consumer on the listener at ``port``, and its line reader."""
    consumer = subprocess.Popen(
        tool_argv(
            "console-share-consumer",
            [
                "--bootstrap-server",
                f"127.0.0.1:{port}",
                "--topic",
                topic,
                "--group",
                group,
                *extra,
            ],
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return consumer, LineReader(consumer)


def stop_console_consumer(consumer: subprocess.Popen[str], lines: LineReader) -> None:
    """SIGTERM the console consumer (SIGKILL after 30 s) and close its output."""
    consumer.terminate()
    try:
        consumer.wait(timeout=30)
    except subprocess.TimeoutExpired:
        consumer.kill()
        consumer.wait(timeout=30)
    lines.join(10)
    assert consumer.stdout is not None
    consumer.stdout.close()


def listener_worker(
    bootstrap: str,
    tmp_path: Path,
    prefix: str,
    values: list[str],
    settings: dict[str, Any] | None = None,
) -> tuple[str, str, int, LeaderWorker]:
    """A new 2-partition topic holding ``values`` and a (not yet started) leader worker of a new
    app serving it with the Kafka-protocol listener on a free port: (topic, app id, listener
    port, worker)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    app_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    port = free_port()
    asyncio.run(produce_records(bootstrap, topic, values, partitions=2))
    worker = LeaderWorker(
        app_id,
        [topic],
        bootstrap,
        tmp_path / "data",
        {
            "share.auto.offset.reset": "earliest",
            "group.share.heartbeat.interval.ms": 500,
            "group.share.session.timeout.ms": 6000,
            "queueflow.kafka.listener": f"PLAINTEXT://127.0.0.1:{port}",
            **(settings or {}),
        },
    )
    return topic, app_id, port, worker


def test_java_console_share_consumer_drains_a_queueflow_group_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    values = [f"r{i}" for i in range(RECORDS)]
    topic, app_id, port, worker = listener_worker(kafka_bootstrap, tmp_path, "qf-klisten", values)
    with worker.start():
        wait_listening(port, WAIT_S)
        consumer, lines = start_console_consumer(port, topic, "g", "--timeout-ms", "120000")
        try:
            got = lines.take(RECORDS, WAIT_S)
            assert sorted(got) == sorted(values), got  # every record, each once
            admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

            async def described() -> tuple[list[str], list[int | None]]:
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
            more = lines.within(2.0)
            assert more == [], more
        finally:
            stop_console_consumer(consumer, lines)
        # the console consumer's close left the group (ShareGroupHeartbeat epoch -1)
        deadline = time.monotonic() + WAIT_S
        while '"reason": "left"' not in (log := worker.log_path.read_text()):
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(0.2)
        assert "kafka_member_joined" in log, log[-3000:]
        assert "kafka_frame_rejected" not in log, log[-3000:]


def share_groups(port: int, *args: str) -> str:
    """Kafka's ``kafka-share-groups.sh`` against the listener: its stdout (it must succeed)."""
    proc = subprocess.run(
        tool_argv("share-groups", ["--bootstrap-server", f"127.0.0.1:{port}", *args]),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    print(f"$ kafka-share-groups.sh {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Error" not in proc.stdout, proc.stdout + proc.stderr
    return proc.stdout


def rows(text: str) -> list[list[str]]:
    """The table rows of a tool's output, split on blanks, without the header."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    return [row for row in lines if row and row[0] not in ("GROUP", "TOPIC")]


def test_kafka_share_groups_describes_resets_and_deletes_a_queueflow_group(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    values = [f"r{i}" for i in range(10)]
    # The app's default coordinator topic (8 partitions, docs/architecture.md "Coordinator
    # sharding"): the group's state is on one of them.
    topic, app_id, port, worker = listener_worker(kafka_bootstrap, tmp_path, "qf-kadmin", values)
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

    async def offsets_until(done: Callable[[list[SharePartitionOffsets]], bool]) -> list[Any]:
        deadline = time.monotonic() + WAIT_S
        while not done(got := await admin.list_offsets("g")):
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.5)
        return got

    with worker.start():
        wait_listening(port, WAIT_S)
        consumer, lines = start_console_consumer(port, topic, "g")
        try:
            assert sorted(lines.take(len(values), WAIT_S)) == sorted(values)
            asyncio.run(offsets_until(lambda got: all(o.lag == 0 for o in got)))
            ends = {o.partition: o.log_end_offset for o in asyncio.run(admin.list_offsets("g"))}
            described = rows(share_groups(port, "--describe", "--group", "g"))
            assert sorted((r[0], r[1], int(r[2]), int(r[3]), r[4]) for r in described) == [
                ("g", topic, p, ends[p], "0") for p in (0, 1)
            ], described
            members = share_groups(port, "--describe", "--group", "g", "--members")
            assert "console-share-consumer" in members and f"{topic}:0,1" in members, members
            state = share_groups(port, "--describe", "--group", "g", "--state")
            assert "Stable" in state, state
            assert "g" in share_groups(port, "--list").split()
        finally:
            stop_console_consumer(consumer, lines)
        deadline = time.monotonic() + WAIT_S
        while asyncio.run(admin.describe_groups(["g"]))[0].state != "Empty":
            assert time.monotonic() < deadline, "the console consumer did not leave"
            time.sleep(0.5)
        # Kafka's tool reads the group's state itself (ShareGroupDescribe through the
        # listener) and refuses a group that isn't Empty
        reset = share_groups(
            port, "--reset-offsets", "--to-earliest", "--execute", "--group", "g", "--topic", topic
        )
        assert sorted((r[1], r[2], r[3]) for r in rows(reset)) == [
            (topic, "0", "0"),
            (topic, "1", "0"),
        ], reset
        after = asyncio.run(offsets_until(lambda got: all(o.start_offset == 0 for o in got)))
        assert [o.lag for o in after] == [ends[0], ends[1]], after
        deleted = share_groups(port, "--delete-offsets", "--group", "g", "--topic", topic)
        assert "Successful" in deleted, deleted
        asyncio.run(offsets_until(lambda got: all(o.start_offset is None for o in got)))
        deleted = share_groups(port, "--delete", "--group", "g")
        assert "Deletion of requested share groups ('g') was successful" in deleted, deleted
        assert "g" not in share_groups(port, "--list").split()
        log = worker.log_path.read_text()
        assert "kafka_frame_rejected" not in log, log[-3000:]


def test_confluent_kafka_share_consumer_in_explicit_mode(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """librdkafka's share consumer (confluent-kafka's ``ShareConsumer``, explicit mode): every
    record once; RELEASEd records come back with their delivery count raised."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    values = [f"c{i}" for i in range(RECORDS)]
    topic, app_id, port, worker = listener_worker(kafka_bootstrap, tmp_path, "qf-klisten", values)
    with worker.start():
        wait_listening(port, WAIT_S)
        consumer = ShareConsumer(
            {
                "bootstrap.servers": f"127.0.0.1:{port}",
                "group.id": "c",
                "share.acknowledgement.mode": "explicit",
            }
        )
        done: list[str] = []
        released: set[str] = set()
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + WAIT_S
            while len(done) < RECORDS:
                assert time.monotonic() < deadline, f"only {sorted(done)}"
                for msg in consumer.poll(0.5):
                    if msg.error() is not None:
                        continue
                    value = (msg.value() or b"").decode()
                    if value in ("c3", "c4") and value not in released:
                        released.add(value)  # once: it comes back
                        consumer.acknowledge(msg, AcknowledgeType.RELEASE)
                        continue
                    expected = 2 if value in released else 1
                    assert msg.delivery_count() == expected, (value, msg.delivery_count())
                    done.append(value)
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
            consumer.commit_sync()
            assert sorted(done) == sorted(values), done  # every record, each once
        finally:
            consumer.close()
        admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

        async def lags() -> list[int | None]:
            deadline = time.monotonic() + WAIT_S
            while True:
                found = [o.lag for o in await admin.list_offsets("c")]
                if found == [0, 0] or time.monotonic() > deadline:
                    return found
                await asyncio.sleep(0.5)

        assert asyncio.run(lags()) == [0, 0]


def test_a_mixed_group_handles_every_record_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Kafka's Java console share consumer (through the listener), a queueflow
    ``ShareConsumer`` and a share agent in one group: every record handled once, by one of
    them."""
    topic = f"qf-kmixed-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 3)
    app_id = f"qf-kmixed-{uuid.uuid4().hex[:8]}"
    port = free_port()
    ledger, log = tmp_path / "ledger.jsonl", tmp_path / "worker.log"
    (web_port,) = find_free_ports(1)
    env = {
        "AGENT_APP_ID": app_id,
        "AGENT_TOPIC": topic,
        "AGENT_BROKER": f"kafka://{kafka_bootstrap}",
        "AGENT_LEDGER": str(ledger),
        "QUEUEFLOW_KAFKA_LISTENER": f"PLAINTEXT://127.0.0.1:{port}",
        "QUEUEFLOW_GROUP_SHARE_HEARTBEAT_INTERVAL_MS": "500",
    }
    argv = faust_worker_argv(
        "tests.integration.listener_agent_app", tmp_path / "data", web_port=web_port
    )
    worker = WorkerProcess(argv, log, env, cwd=ROOT)
    worker.start()
    python_got: list[int] = []
    stop = threading.Event()

    async def python_member() -> None:
        async with ShareConsumer(
            "mixed",
            app_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            settings={"group.share.heartbeat.interval.ms": 500},
            client_id="queueflow-member",
        ) as member:
            await member.subscribe([topic])
            while not stop.is_set():
                python_got.extend(json.loads(r.value)["i"] for r in await member.poll(500))

    member_thread = threading.Thread(target=asyncio.run, args=(python_member(),), daemon=True)
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

    async def clients() -> list[str]:
        try:
            (group,) = await admin.describe_groups(["mixed"])
        except ShareGroupError:
            return []  # no member joined yet
        return sorted(m.client_id for m in group.members)

    def agent_got() -> list[int]:
        text = ledger.read_text() if ledger.exists() else ""
        return [json.loads(line)["i"] for line in text.splitlines()]

    console: tuple[subprocess.Popen[str], LineReader] | None = None
    try:
        worker.wait_ready(90, what="agent worker")
        wait_listening(port, WAIT_S)
        console = start_console_consumer(port, topic, "mixed")
        lines = console[1]
        member_thread.start()
        deadline = time.monotonic() + WAIT_S
        while len(joined := asyncio.run(clients())) < 3:
            assert time.monotonic() < deadline, joined
            time.sleep(0.5)
        java_got: list[int] = []
        for wave in range(3):  # in waves, so that each member is fetching when records come
            values = [json.dumps({"i": i}) for i in range(wave * 30, wave * 30 + 30)]
            asyncio.run(produce_records(kafka_bootstrap, topic, values, partitions=3))
            deadline = time.monotonic() + WAIT_S
            while len(java_got) + len(python_got) + len(agent_got()) < 30 * (wave + 1):
                assert time.monotonic() < deadline, (java_got, python_got, agent_got())
                java_got += [json.loads(line)["i"] for line in lines.within(0.5)]
        java_got += [json.loads(line)["i"] for line in lines.within(2.0)]  # nothing more
        handled = java_got + python_got + agent_got()
        assert sorted(handled) == list(range(90)), sorted(handled)  # each once
        print(f"java {len(java_got)}, queueflow {len(python_got)}, agent {len(agent_got())}")
        assert "console-share-consumer" in joined and "queueflow-member" in joined, joined
        # each kind of member handled some: the group really is mixed
        assert java_got and python_got and agent_got(), (java_got, python_got, agent_got())
    finally:
        stop.set()
        member_thread.join(30)
        if console is not None:
            stop_console_consumer(*console)
        worker.stop(timeout_s=60)  # SIGKILL if not exited by then: no process leaks
    assert "kafka_frame_rejected" not in log.read_text()


pytestmark = pytest.mark.timeout(240)
