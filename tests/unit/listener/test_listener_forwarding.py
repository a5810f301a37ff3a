"""ShareFetch answers forward the leader's record batches as they are, and a closed client
connection releases its share session's records at once: the listener over the in-process
cluster (real leaders, members and direct endpoint over TCP; batches built as Kafka stores
them, queueflow.testing.batches), a Kafka client's frames written with kio. Record batches as
answers carry them, compressed ones included (aiokafka's batch builder).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from inprocess_helpers import TOPIC, direct_cluster, run
from kio.records.readers import read_batch
from kio.schema.errors import ErrorCode
from listener_stubs import unit_limits
from test_listener_protocol import exchange, heartbeat, record, response_of, share_fetch

from queueflow.listener import KafkaListener
from queueflow.listener.batches import answer_records, batch_spans, record_batch
from queueflow.listener.held import HeldRecords
from queueflow.member.session import ShareFetchSession
from queueflow.structs import TopicPartition
from queueflow.testing.batches import record_batch as stored_batch

TP = TopicPartition(TOPIC, 0)


def built_batch(
    base: int, values: list[bytes], compression: int = 0, producer_id: int = -1
) -> bytes:
    """A v2 batch as a producer writes it (aiokafka's builder; ``compression``: Kafka's codec
    id, 1 gzip), at ``base``."""
    builder = DefaultRecordBatchBuilder(
        2, compression, 0, producer_id, 0 if producer_id >= 0 else -1, -1, 1 << 24
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=value, headers=[])
    data = bytearray(builder.build())
    data[0:8] = base.to_bytes(8, "big")  # the base offset is outside the CRC
    return bytes(data)


# -- answer_records: forwarding rules (pure) -----------------------------------------------------
def test_batches_are_forwarded_as_they_are_compressed_with_their_producer_id() -> None:
    data = built_batch(10, [b"a", b"b", b"c", b"d"], compression=1, producer_id=42)
    forwarded, ranges = answer_records([record(11), record(12)], data)
    assert forwarded is data  # not copied, not re-encoded
    assert ranges == [(11, 12, 1)]  # only the acquired offsets: 10 and 13 are skipped
    batch = DefaultRecordBatch(forwarded)
    assert batch.compression_type == 1 and batch.producer_id == 42
    assert [m.value for m in batch] == [b"a", b"b", b"c", b"d"]
    assert batch_spans(data) == [(10, 13)]


def test_records_after_the_batches_are_written_anew_after_them() -> None:
    data = built_batch(0, [b"a", b"b"])
    tail = [record(5, value=b"late")]
    forwarded, ranges = answer_records([record(0), record(1), *tail], data)
    assert forwarded[: len(data)] == data and forwarded[len(data) :] == record_batch(tail)
    assert ranges == [(0, 1, 1), (5, 5, 1)]


@pytest.mark.parametrize(
    ("offsets", "data"),
    [
        ([3], built_batch(5, [b"a"])),  # a record before the batches
        ([0, 3, 5], built_batch(0, [b"a"]) + built_batch(5, [b"b"])),  # one between them
        ([0], b"\0" * 20),  # not record batches
        ([0], built_batch(0, [b"a"])[:-3]),  # a batch cut short
        ([0], b""),  # nothing carried
    ],
)
def test_otherwise_every_record_is_written_anew(offsets: list[int], data: bytes) -> None:
    records = [record(o) for o in offsets]
    forwarded, ranges = answer_records(records, data)
    assert forwarded == record_batch(records)
    assert [o for first, last, _ in ranges for o in range(first, last + 1)] == offsets


def test_held_records_are_cut_by_acknowledgements() -> None:
    held = HeldRecords()
    held.add(TP, 0, 9)
    held.add(TP, 10, 14)  # adjacent: one run
    held.add(TP, 20, 29)
    held.remove(TP, 3, 4)
    held.remove(TP, 25, 40)
    assert held.runs() == {TP: [(0, 2), (5, 14), (20, 24)]} and len(held) == 18
    held.add(TP, 3, 3)  # out of order (a redelivery): merged back in
    assert held.runs() == {TP: [(0, 3), (5, 14), (20, 24)]}
    for first, last in [(0, 3), (5, 14), (20, 24)]:
        held.remove(TP, first, last)
    assert held.runs() == {} and len(held) == 0


# -- over the in-process cluster -----------------------------------------------------------------
def listener_of(cluster: Any, sessions: list[ShareFetchSession]) -> KafkaListener:
    def factory(
        group: str, topics: list[str], client_id: str, on_ack: Any, *, member_id: str
    ) -> ShareFetchSession:
        session = ShareFetchSession(
            cluster.member_context,
            group,
            topics,
            client_id,
            on_acknowledged=on_ack,
            member_id=member_id,
        )
        sessions.append(session)
        return session

    async def served() -> dict[str, int]:
        return {TOPIC: 1}

    return KafkaListener(
        "PLAINTEXT://127.0.0.1:0",
        "127.0.0.1",
        "app",  # the topic ids' namespace, as test_listener_protocol's requests use
        served,
        factory,
        object(),  # type: ignore[arg-type]  # no admin API is asked here
        heartbeat_interval_ms=200,
        session_timeout_ms=60_000,
        limits=unit_limits(),
        max_connections=8,
        monotonic=asyncio.get_running_loop().time,
    )


def fetched(answer: bytes) -> tuple[bytes, list[tuple[int, int, int]]]:
    body = response_of(78, 2, answer)[1]
    assert body.error_code == ErrorCode.none
    if not body.responses:
        return b"", []
    (part,) = body.responses[0].partitions
    ranges = [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records]
    return part.records or b"", ranges


async def joined(kl: KafkaListener, member: str) -> None:
    """``member`` joins (on a connection of its own, closed after) and is assigned the
    partition."""
    for _ in range(50):
        (answer,) = await exchange(
            kl.port, heartbeat(0, member) if _ == 0 else heartbeat(1, member)
        )
        body = response_of(76, 1, answer)[1]
        if body.assignment is not None and body.assignment.topic_partitions:
            return
    raise AssertionError(f"{member} was not assigned {TP}")


def test_the_leader_s_batches_reach_the_client_as_the_broker_stored_them() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=0) as cluster:
            for i in range(4):
                cluster.produce(TOPIC, f"r{i}".encode(), key=b"k", headers=(("h", b"1"),))
            sessions: list[ShareFetchSession] = []
            kl = listener_of(cluster, sessions)
            await kl.start()
            try:
                await joined(kl, "m1")
                (answer,) = await exchange(kl.port, share_fetch(0, max_wait_ms=2000))
                data, ranges = fetched(answer)
                log = cluster.records[TP]
                assert data == b"".join(stored_batch(o, log[o]) for o in range(4))
                assert ranges == [(0, 3, 1)]
                batch, _ = read_batch(data, 0)  # what a Kafka client reads
                assert [r.value for r in batch.records] == [b"r0"]
                assert sessions[0].forward_batches and sessions[0].lazy_records
            finally:
                await kl.close()

    run(scenario())


def test_a_closed_connection_gives_its_records_to_another_member_at_once() -> None:
    """Records returned to a client whose connection closed (killed) are RELEASEd long before
    their 30 s lock: the next member gets them, the delivery counted (count 2), as from Kafka
    4.3.1's brokers."""

    async def scenario() -> None:
        async with direct_cluster(records=3, record_lock_duration_ms=30_000) as cluster:
            sessions: list[ShareFetchSession] = []
            kl = listener_of(cluster, sessions)
            await kl.start()
            try:
                await joined(kl, "a")
                (answer,) = await exchange(kl.port, share_fetch(0, member="a", max_wait_ms=2000))
                assert fetched(answer)[1] == [(0, 2, 1)]  # then its connection closes
                await joined(kl, "b")
                reader, writer = await asyncio.open_connection("127.0.0.1", kl.port)
                try:
                    got: list[tuple[int, int, int]] = []
                    for epoch in range(20):
                        writer.write(share_fetch(epoch, member="b", max_wait_ms=500))
                        size = await asyncio.wait_for(reader.readexactly(4), 5)
                        body = await reader.readexactly(int.from_bytes(size, "big"))
                        got += fetched(size + body)[1]
                        if got:
                            break
                    assert got == [(0, 2, 2)]
                finally:
                    writer.close()
                    await writer.wait_closed()
            finally:
                await kl.close()

    run(scenario())
