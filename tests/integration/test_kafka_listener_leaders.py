"""Metadata names each share-partition's leader worker (``queueflow.kafka.listener.leaders=
partition``, the default; docs/kafka-listener.md "Which node leads a share-partition"), on the
real broker: two leader workers of one app, each with a listener, split a 4-partition topic;
Metadata through either listener (librdkafka's, confluent-kafka's ``AdminClient``) names both
nodes as leaders; Kafka's Java console share consumer, bootstrapped at one listener, fetches
each share-partition from its leader's worker (the other worker's listener acts for the member
with the ticket the coordinator gives for it) and handles every record once; when one worker
the member heartbeats to stops (SIGTERM) the client joins again through the other, with the
same member id, and handles what is produced next, once."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.listener.leadership import node_id_of
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records
from tests.integration.test_kafka_listener import (
    LineReader,
    free_port,
    stop_console_consumer,
    tool_argv,
    wait_listening,
)

PARTITIONS = 4
FIRST, SECOND = 40, 20
WAIT_S = 60.0
#: Faust notices a stopped worker within its session (s): the survivor takes its partitions.
FAUST_ENV = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}
SECRET = secrets.token_urlsafe(32)


def leaders_seen(port: int, topic: str) -> tuple[set[int], dict[int, int]]:
    """``(broker node ids, partition -> leader node id)`` as Metadata through the listener at
    ``port`` names them (librdkafka's Metadata request, confluent-kafka's AdminClient)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    metadata = admin.list_topics(topic, timeout=10)
    partitions = metadata.topics[topic].partitions
    leaders = {p: partitions[p].leader for p in sorted(partitions)}
    brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    print(f"Metadata through 127.0.0.1:{port}: brokers {brokers}, partition leaders {leaders}")
    return set(metadata.brokers), leaders


def start_console_consumer(
    port: int, topic: str, group: str, stderr: Path
) -> tuple[subprocess.Popen[str], LineReader]:
    """Kafka's Java console share consumer on the listener at ``port`` (its warnings to
    ``stderr``), and its line reader."""
    with stderr.open("w") as errors:
        consumer = subprocess.Popen(
            tool_argv(
                "console-share-consumer",
                ["--bootstrap-server", f"127.0.0.1:{port}", "--topic", topic, "--group", group],
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    return consumer, LineReader(consumer)


def wait_split(ports: list[int], topic: str, nodes: set[int]) -> dict[int, int]:
    """Wait (bounded) until Metadata through every listener names exactly ``nodes`` as the
    leaders, the same on each; the partition -> leader node map."""
    deadline = time.monotonic() + WAIT_S
    while True:
        seen = [leaders_seen(port, topic) for port in ports]
        maps = [leaders for _, leaders in seen]
        if all(set(m.values()) == nodes and m == maps[0] for m in maps):
            assert all(brokers >= nodes for brokers, _ in seen), seen
            return maps[0]
        assert time.monotonic() < deadline, f"Metadata never named {nodes}: {seen}"
        time.sleep(0.5)


def test_each_share_partition_is_fetched_from_its_leaders_worker_and_clients_move_on(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = f"qf-kleaders-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    app_id = f"qf-kleaders-{uuid.uuid4().hex[:8]}"
    first = [f"a{i}" for i in range(FIRST)]
    asyncio.run(produce_records(kafka_bootstrap, topic, first, partitions=PARTITIONS))
    ports = [free_port(), free_port()]
    workers = [
        LeaderWorker(
            app_id,
            [topic],
            kafka_bootstrap,
            tmp_path / name,
            {
                "share.auto.offset.reset": "earliest",
                "group.share.heartbeat.interval.ms": 500,
                "group.share.session.timeout.ms": 6000,
                "queueflow.auth.mode": "hmac",  # the ticket request is sealed as a worker
                "queueflow.auth.secret": SECRET,
                "queueflow.kafka.listener": f"PLAINTEXT://127.0.0.1:{port}",
            },
            env=FAUST_ENV,
        )
        for name, port in zip("ab", ports, strict=True)
    ]
    nodes = {node_id_of(f"127.0.0.1:{port}") for port in ports}
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))
    consumer: Any = None
    lines: LineReader | None = None
    try:
        for worker, port in zip(workers, ports, strict=True):
            worker.start()
            wait_listening(port, WAIT_S)
        split = wait_split(ports, topic, nodes)
        named = {
            name: node_id_of(f"127.0.0.1:{port}") for name, port in zip("ab", ports, strict=True)
        }
        print(f"partition leaders {split}, worker nodes {named}")
        java_log = tmp_path / "console-share-consumer.err"
        consumer, lines = start_console_consumer(ports[0], topic, "g", java_log)
        got = lines.take(FIRST, WAIT_S)
        assert sorted(got) == sorted(first), got  # every record, each once

        async def drained() -> None:
            deadline = time.monotonic() + WAIT_S
            while any(o.lag != 0 for o in await admin.list_offsets("g")):
                assert time.monotonic() < deadline, await admin.list_offsets("g")
                await asyncio.sleep(0.5)

        asyncio.run(drained())  # every record acknowledged where it was fetched
        # The member heartbeats to one listener and fetches from both: the other acted for it.
        acting = [w for w in workers if w.events("kafka_member_acting")]
        joined = [w for w in workers if w.events("kafka_member_joined")]
        assert len(acting) == 1 and len(joined) == 1 and acting != joined, (
            workers[0].log_tail(),
            workers[1].log_tail(),
        )
        # The worker the member heartbeats to stops (it leaves the group: nothing is in flight);
        # its share-partitions move to the other worker, and the client joins again there
        # with the same member id and fetches everything from it.
        [home] = joined
        survivor = workers[1] if home is workers[0] else workers[0]
        survivor_port = ports[workers.index(survivor)]
        home.stop()
        wait_split([survivor_port], topic, {node_id_of(f"127.0.0.1:{survivor_port}")})
        second = [f"b{i}" for i in range(SECOND)]
        asyncio.run(produce_records(kafka_bootstrap, topic, second, partitions=PARTITIONS))
        more = lines.take(SECOND, WAIT_S)
        assert sorted(more) == sorted(second), more  # each once, none lost
        assert lines.within(2.0) == []  # and nothing delivered twice
        asyncio.run(drained())
        for name, worker in zip("ab", workers, strict=True):
            for event in worker.events():
                if event.get("event", "").startswith("kafka_member"):
                    fields = {k: event.get(k) for k in ("member_id", "client_id", "reason")}
                    print(f"worker {name}: {event['event']} {fields}")
        for worker in workers:
            log = worker.log_text()
            assert "kafka_frame_rejected" not in log and "kafka_request_failed" not in log, log
        assert survivor.events("kafka_listener_started")[0]["leaders"] == "partition"
        rejoined = {e["member_id"] for e in survivor.events("kafka_member_joined")}
        [first_join] = home.events("kafka_member_joined")
        assert rejoined == {first_join["member_id"]}, (rejoined, first_join)
    finally:
        if consumer is not None and lines is not None:
            stop_console_consumer(consumer, lines)
            print(f"the Java client's warnings:\n{java_log.read_text()[-5000:]}")
        for worker in workers:
            worker.stop(timeout_s=60)


pytestmark = pytest.mark.timeout(300)
