"""The Kafka-protocol listener forwards the broker's record batches (docs/kafka-listener.md
"Record batches: forwarded as the broker stored them"), and a client's closed connection
releases its records at once ("A client that disconnects"), on the real broker:

* compressed batches (gzip, snappy, lz4 and zstd, from an idempotent producer) reach a raw
  Kafka client as the broker stored them (compression and producer id kept), and librdkafka's
  and Java's share consumers deliver every record once from them, a partly RELEASEd batch
  coming back with only its RELEASEd records;
* two Kafka-protocol members on one partition (Java with ``max.poll.records=5``, librdkafka)
  get whole batches that also hold the other's records: each record is delivered once;
* a librdkafka share consumer killed (SIGKILL) with records acquired: another member gets
  them long before the 30 s lock and session timeout, at the delivery count the native broker
  gives in the same steps (2: the killed client's delivery counts).
"""

from __future__ import annotations

import asyncio
import datetime
import io
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from kio.index import load_payload_module
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32
from test_kafka_listener import (
    LineReader,
    free_port,
    start_console_consumer,
    stop_console_consumer,
    wait_listening,
)

from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.errors import ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.listener.metadata import TopicIds
from queueflow.testing import LeaderWorker

WAIT_S = 60.0
#: Producers' codecs: a queueflow leader reads the topic with aiokafka (its log-end waits decode
#: records), with cramjam (a dependency, through aiokafka's extras) for snappy, lz4 and zstd.
CODECS = ("gzip", "snappy", "lz4", "zstd")
PER_CODEC = 40
#: Kafka's codec ids in a batch's attributes (bits 0-2).
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def produce_batches(bootstrap: str, topic: str, values: list[str], **config: Any) -> None:
    """``values`` to partition 0 of ``topic`` in one producer flush (one batch or few)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 200, "enable.idempotence": True, **config}
    )
    for value in values:
        producer.produce(topic, value.encode(), partition=0)
    assert producer.flush(30) == 0


def leader(
    bootstrap: str, tmp_path: Path, topics: list[str], **settings: Any
) -> tuple[str, int, LeaderWorker]:
    """A leader worker of a new app serving ``topics`` with the listener on a free port."""
    app_id, port = f"qf-lbytes-{uuid.uuid4().hex[:8]}", free_port()
    worker = LeaderWorker(
        app_id,
        topics,
        bootstrap,
        tmp_path / "data",
        {
            "share.auto.offset.reset": "earliest",
            "group.share.heartbeat.interval.ms": 500,
            "group.share.session.timeout.ms": 6000,
            "queueflow.kafka.listener": f"PLAINTEXT://127.0.0.1:{port}",
            **settings,
        },
    )
    return app_id, port, worker


# -- a raw Kafka client (kio), to see the bytes the listener answers with -------------------------
class RawClient:
    """One connection speaking Kafka's protocol with kio's types."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.correlation = 0

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        m = load_payload_module(api_key, version, EntityType.request)
        name = next(n for n in dir(m) if n.endswith("Request") and n != "RequestHeader")
        body = getattr(m, name)(**fields)
        buffer = io.BytesIO()
        header = type(body).__header_schema__
        self.correlation += 1
        entity_writer(header)(
            buffer,
            header(
                request_api_key=i16(api_key),
                request_api_version=i16(version),
                correlation_id=i32(self.correlation),
                client_id="raw",
            ),
        )
        entity_writer(type(body))(buffer, body)
        data = buffer.getvalue()
        self.sock.sendall(struct.pack(">i", len(data)) + data)
        (size,) = struct.unpack(">i", self._read(4))
        frame = self._read(size)
        r = load_payload_module(api_key, version, EntityType.response)
        schema = next(
            v for v in vars(r).values() if getattr(v, "__type__", None) is EntityType.response
        )
        _, used = entity_reader(schema.__header_schema__)(frame, 0)
        answer, _ = entity_reader(schema)(frame, used)
        return answer

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the listener closed the connection"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def raw_fetch_all(port: int, app_id: str, topic: str, group: str, count: int) -> list[bytes]:
    """Join ``group`` and ShareFetch until ``count`` offsets were acquired; the ``Records`` of
    each answer (nothing acknowledged: the connection's close releases them)."""
    client = RawClient(port)
    try:
        epoch, member = 0, uuid.uuid4().hex
        deadline = time.monotonic() + WAIT_S
        while True:
            hb = client.call(
                76,
                1,
                group_id=group,
                member_id=member,
                member_epoch=i32(epoch),
                rack_id=None,
                subscribed_topic_names=(topic,),
            )
            assert hb.error_code == 0, hb
            epoch = hb.member_epoch
            if hb.assignment is not None and hb.assignment.topic_partitions:
                break
            assert time.monotonic() < deadline, "no assignment"
            time.sleep(0.5)
        m = load_payload_module(78, 1, EntityType.request)
        topic_id = TopicIds(app_id).id_of(topic)
        records: list[bytes] = []
        acquired = 0
        session_epoch = 0
        while acquired < count:
            assert time.monotonic() < deadline, f"{acquired} of {count} acquired"
            answer = client.call(
                78,
                1,
                group_id=group,
                member_id=member,
                share_session_epoch=i32(session_epoch),
                max_wait=datetime.timedelta(milliseconds=1000),
                min_bytes=i32(1),
                max_bytes=i32(1 << 20),
                max_records=i32(500),
                batch_size=i32(500),
                topics=(
                    m.FetchTopic(
                        topic_id=topic_id,
                        partitions=(
                            m.FetchPartition(partition_index=i32(0), acknowledgement_batches=()),
                        ),
                    ),
                ),
                forgotten_topics_data=(),
            )
            session_epoch += 1
            assert answer.error_code == 0, answer
            for t in answer.responses:
                for p in t.partitions:
                    acquired += sum(a.last_offset - a.first_offset + 1 for a in p.acquired_records)
                    if p.records:
                        records.append(bytes(p.records))
        return records
    finally:
        client.close()


def batches_of(data: bytes) -> list[DefaultRecordBatch]:
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        out.append(DefaultRecordBatch(data[pos : pos + 12 + length]))
        pos += 12 + length
    return out


def test_compressed_batches_are_forwarded_and_delivered_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = f"qf-lbytes-z-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    values = []
    for codec in CODECS:
        batch = [f"{codec}-{i}" for i in range(PER_CODEC)]
        produce_batches(kafka_bootstrap, topic, batch, **{"compression.type": codec})
        values += batch
    app_id, port, worker = leader(kafka_bootstrap, tmp_path, [topic])
    with worker.start():
        wait_listening(port, WAIT_S)
        # 1. librdkafka: every record once; a partly RELEASEd batch comes back with only the
        # RELEASEd records (the client skips the others of the forwarded batch)
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
            while len(done) < len(values):
                assert time.monotonic() < deadline, f"only {sorted(done)}"
                for msg in consumer.poll(0.5):
                    if msg.error() is not None:
                        continue
                    value = (msg.value() or b"").decode()
                    assert value not in done, f"{value} delivered again"
                    if value in ("gzip-3", "gzip-4") and value not in released:
                        released.add(value)  # once: it comes back, alone of its batch
                        consumer.acknowledge(msg, AcknowledgeType.RELEASE)
                        continue
                    expected = 2 if value in released else 1
                    assert msg.delivery_count() == expected, (value, msg.delivery_count())
                    done.append(value)
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
            consumer.commit_sync()
            assert sorted(done) == sorted(values)
            assert len(released) == 2
        finally:
            consumer.close()

        # 2. Java's console share consumer: every record once
        java, lines = start_console_consumer(port, topic, "j", "--timeout-ms", "120000")
        try:
            got = lines.take(len(values), WAIT_S)
            assert sorted(got) == sorted(values), got
            assert lines.within(2.0) == []  # nothing twice
        finally:
            stop_console_consumer(java, lines)
        # 3. the bytes: the broker's batches, compressed, with their producer id (last: by then
        # a new member's first fetch goes over the direct path, whose answers carry batches)
        answers = raw_fetch_all(port, app_id, topic, "raw", len(values))
        by_base = {b.base_offset: b for data in answers for b in batches_of(data)}
        batches = list(by_base.values())
        assert {b.compression_type for b in batches} == {CODEC_IDS[c] for c in CODECS}, batches
        assert all(b.producer_id >= 0 for b in batches)
        assert sorted(m.value.decode() for b in batches for m in b) == sorted(values)

        assert "kafka_frame_rejected" not in worker.log_path.read_text()


def test_two_members_on_one_partition_each_deliver_only_their_records(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Java (5 records per ShareFetch) and librdkafka share one partition whose batches hold
    100 records each: answers forward whole batches holding records the other member
    acquired, and every record is delivered once, by one of them."""
    topic = f"qf-lbytes-2m-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    app_id, port, worker = leader(kafka_bootstrap, tmp_path, [topic])
    with worker.start():
        wait_listening(port, WAIT_S)
        java, lines = start_console_consumer(
            port, topic, "two", "--command-property", "max.poll.records=5"
        )
        consumer = ShareConsumer(
            {
                "bootstrap.servers": f"127.0.0.1:{port}",
                "group.id": "two",
                "share.acknowledgement.mode": "explicit",
            }
        )
        java_got: list[str] = []
        rdkafka_got: list[str] = []
        expected: list[str] = []
        try:
            consumer.subscribe([topic])
            admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))
            deadline = time.monotonic() + WAIT_S
            while not members_assigned(admin, "two", 2):
                assert time.monotonic() < deadline, "the two members were not both assigned"
                assert [m for m in consumer.poll(0.5) if m.error() is None] == []
            wave = 0
            while wave < 2 or not (java_got and rdkafka_got):  # both took some of one batch
                assert wave < 8, (len(java_got), len(rdkafka_got))
                values = [f"w{wave}-{i}" for i in range(100)]
                expected += values
                produce_batches(kafka_bootstrap, topic, values, **{"compression.type": "gzip"})
                deadline = time.monotonic() + WAIT_S
                while len(java_got) + len(rdkafka_got) < len(expected):
                    assert time.monotonic() < deadline, (len(java_got), len(rdkafka_got))
                    for msg in consumer.poll(0.2):
                        if msg.error() is None:
                            rdkafka_got.append((msg.value() or b"").decode())
                            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                    java_got += lines.within(0.2)
                wave += 1
            consumer.commit_sync()
            java_got += lines.within(2.0)  # nothing more
            assert [m for m in consumer.poll(1.0) if m.error() is None] == []
        finally:
            consumer.close()
            stop_console_consumer(java, lines)
        handled = java_got + rdkafka_got
        assert sorted(handled) == sorted(expected)  # each once
        print(f"{wave} waves: java {len(java_got)}, librdkafka {len(rdkafka_got)}")


def members_assigned(admin: ShareGroupAdmin, group: str, count: int) -> bool:
    """``count`` members of ``group`` each hold an assignment."""

    async def described() -> bool:
        try:
            (described,) = await admin.describe_groups([group])
        except ShareGroupError:
            return False  # no member yet
        members = described.members
        return len(members) == count and all(m.assignment for m in members)

    return asyncio.run(described())


# -- a killed client ------------------------------------------------------------------------------
HOLDER = """
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                   "share.acknowledgement.mode": "explicit"})
c.subscribe([sys.argv[3]])
got = []
while len(got) < int(sys.argv[4]):
    got += [m for m in c.poll(0.5) if m.error() is None]
print("held", " ".join(f"{m.offset()}@{m.delivery_count()}" for m in got), flush=True)
time.sleep(600)  # holding them, unacknowledged, until killed
"""
HELD = 4


def killed_then_taken(bootstrap: str, topic: str, group: str) -> tuple[list[str], list[str], float]:
    """A share consumer (its own process) acquires ``HELD`` records and is SIGKILLed; another
    takes them: (what the first held, what the second got, seconds from the kill)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, bootstrap, group, topic, str(HELD)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines = LineReader(holder)
    try:
        (line,) = lines.take(1, WAIT_S)
        held = line.split()[1:]
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
        lines.join(10)
        assert holder.stdout is not None
        holder.stdout.close()
    killed = time.monotonic()
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )
    got: list[Any] = []
    try:
        consumer.subscribe([topic])
        deadline = killed + WAIT_S
        while len(got) < HELD:
            assert time.monotonic() < deadline, got
            for msg in consumer.poll(0.2):
                if msg.error() is None:
                    got.append(msg)
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
        took = time.monotonic() - killed
        consumer.commit_sync()
    finally:
        consumer.close()
    return held, [f"{m.offset()}@{m.delivery_count()}" for m in got], took


def test_a_killed_client_s_records_go_to_another_member_at_once_as_on_native(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Kafka 4.x ties a share session to its connection: when it closes (here the client is
    SIGKILLed) the broker releases the member's acquired records at once, their delivery given
    back. Through the listener the same: the next member gets them well before the 30 s lock
    and session timeout, with the delivery count native gives."""
    configs = {
        "share.auto.offset.reset": "earliest",
        "share.record.lock.duration.ms": "30000",
        "share.delivery.count.limit": "5",
    }
    native_topic, qf_topic = (f"qf-lbytes-kill-{s}-{uuid.uuid4().hex[:6]}" for s in ("n", "q"))
    for t in (native_topic, qf_topic):
        create_topic(kafka_bootstrap, t, 1)
        produce_batches(kafka_bootstrap, t, [f"k{i}" for i in range(HELD)])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = ConfigResource(
        ResourceType.GROUP,
        "native-kill",
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=WAIT_S)
    native = killed_then_taken(kafka_bootstrap, native_topic, "native-kill")
    _app, port, worker = leader(
        kafka_bootstrap,
        tmp_path,
        [qf_topic],
        **{
            "group.share.session.timeout.ms": 30000,
            "group.share.record.lock.duration.ms": 30000,
            "group.share.delivery.count.limit": 5,
        },
    )
    with worker.start():
        wait_listening(port, WAIT_S)
        queueflow = killed_then_taken(f"127.0.0.1:{port}", qf_topic, "qf-kill")
        log = worker.log_path.read_text()
    print(f"native: held {native[0]}, then {native[1]} after {native[2]:.1f} s")
    print(f"queueflow: held {queueflow[0]}, then {queueflow[1]} after {queueflow[2]:.1f} s")
    assert native[0] == queueflow[0] == [f"{o}@1" for o in range(HELD)]
    assert queueflow[1] == native[1]  # the same delivery counts as native
    assert queueflow[2] < 15.0, queueflow  # not the 30 s lock or session timeout
    assert '"reason": "connection closed"' in log, log[-3000:]


pytestmark = pytest.mark.timeout(300)
