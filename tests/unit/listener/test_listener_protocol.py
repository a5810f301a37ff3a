"""The Kafka-protocol listener without a broker: frames (kio), ApiVersions, Metadata and
FindCoordinator answers, error codes, share-session epochs, record batches, and bounded
framing on a real socket (docs/kafka-listener.md)."""

from __future__ import annotations

import asyncio
import datetime
import io
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from kio.index import load_payload_module
from kio.records.readers import read_batch
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64
from listener_stubs import unit_limits

from queueflow.errors import ConfigurationError, ShareGroupError
from queueflow.errors import ErrorCode as QfErrorCode
from queueflow.listener import KafkaListener, parse_listener
from queueflow.listener.apis import SERVED, api_versions_response
from queueflow.listener.batches import acquired_ranges, record_batch
from queueflow.listener.codec import FrameError, decode_request, encode_response
from queueflow.listener.leadership import Cluster, Node
from queueflow.listener.metadata import TopicIds, find_coordinator_response, metadata_response
from queueflow.member.session import FetchResult
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

TOPIC = "jobs"


def request_frame(api_key: int, version: int, body: Any, correlation_id: int = 7) -> bytes:
    """A request frame (size prefix included) as a Kafka client writes it, with kio (the
    request header its schema names: v1 for the versions before flexible ones)."""
    buffer = io.BytesIO()
    header = type(body).__header_schema__
    entity_writer(header)(
        buffer,
        header(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id="test-client",
        ),
    )
    entity_writer(type(body))(buffer, body)
    data = buffer.getvalue()
    return struct.pack(">i", len(data)) + data


def request(api_key: int, version: int, **fields: Any) -> Any:
    m = load_payload_module(api_key, version, EntityType.request)
    name = next(n for n in dir(m) if n.endswith("Request") and n != "RequestHeader")
    return getattr(m, name)(**fields)


def response_of(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, body) of a response frame (size prefix included)."""
    m = load_payload_module(api_key, version, EntityType.response)
    schema = next(
        v for v in vars(m).values() if getattr(v, "__type__", None) is EntityType.response
    )
    header, used = entity_reader(schema.__header_schema__)(frame, 4)
    body, size = entity_reader(schema)(frame, 4 + used)
    assert 4 + used + size == len(frame)
    return header.correlation_id, body


# -- frames and ApiVersions ------------------------------------------------------------------
def test_a_java_client_s_api_versions_request_decodes() -> None:
    # ApiVersions v4 as Kafka 4.3.1's console share consumer sent it (captured).
    frame = request_frame(
        18,
        4,
        request(18, 4, client_software_name="apache-kafka-java", client_software_version="4.3.1"),
        correlation_id=1,
    )
    decoded = decode_request(frame[4:])
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (18, 4, 1)
    assert decoded.body.client_software_name == "apache-kafka-java"


def test_api_versions_lists_what_is_served() -> None:
    _, body = response_of(18, 4, encode_response(3, api_versions_response(4)))
    assert body.error_code == ErrorCode.none
    assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys} == dict(SERVED)


def test_an_unsupported_api_versions_version_gets_v0_with_the_list() -> None:
    correlation_id, body = response_of(18, 0, encode_response(9, api_versions_response(99)))
    assert correlation_id == 9 and body.error_code == ErrorCode.unsupported_version
    assert {k.api_key for k in body.api_keys} == set(SERVED)


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"\0\x03", "no request header"),
        (struct.pack(">hhi", 999, 0, 1), "API key 999"),
        (struct.pack(">hhi", 3, 13, 1) + b"\xff\xff", "does not parse|left over"),
    ],
)
def test_malformed_frames_are_frame_errors(frame: bytes, match: str) -> None:
    with pytest.raises(FrameError, match=match):
        decode_request(frame)


# -- Metadata -----------------------------------------------------------------------------------
def test_metadata_names_the_listener_and_refuses_unserved_topics() -> None:
    ids = TopicIds("app")
    node = Node(0, "127.0.0.1", 9192)
    MetadataRequestTopic = load_payload_module(3, 13, EntityType.request).MetadataRequestTopic
    body = request(
        3,
        13,
        topics=(
            MetadataRequestTopic(topic_id=None, name=TOPIC),
            MetadataRequestTopic(topic_id=None, name="nope"),
        ),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    answer = metadata_response(13, body, {TOPIC: 3}, Cluster(node, gateway=True), ids, "app")
    _, decoded = response_of(3, 13, encode_response(1, answer))
    (broker,) = decoded.brokers
    assert (broker.node_id, broker.host, broker.port) == (0, "127.0.0.1", 9192)
    served, unknown = decoded.topics
    assert served.error_code == ErrorCode.none and served.topic_id == ids.id_of(TOPIC)
    assert [(p.partition_index, p.leader_id) for p in served.partitions] == [(0, 0), (1, 0), (2, 0)]
    assert unknown.error_code == ErrorCode.unknown_topic_or_partition
    assert TopicIds("app").id_of(TOPIC) == ids.id_of(TOPIC) != TopicIds("other").id_of(TOPIC)


def test_parse_listener() -> None:
    assert parse_listener("PLAINTEXT://127.0.0.1:9192") == ("127.0.0.1", 9192)
    assert parse_listener("0.0.0.0:0") == ("0.0.0.0", 0)
    assert parse_listener("SASL_SSL://host:9093") == ("host", 9093)
    with pytest.raises(ConfigurationError, match="not a security protocol"):
        parse_listener("KERBEROS://host:9093")
    with pytest.raises(ConfigurationError, match="expected PLAINTEXT://host:port"):
        parse_listener("PLAINTEXT://host")


# -- record batches ---------------------------------------------------------------------------
def record(offset: int, count: int = 1, value: bytes = b"v") -> ShareRecord:
    return ShareRecord(
        TOPIC,
        0,
        offset,
        b"k",
        value,
        [("h", b"1")],
        1_700_000_000_123,
        count,
        raw_value=value,
        raw_key=b"k",
    )


def test_records_become_one_batch_kafka_clients_read() -> None:
    records = [record(5), record(6), record(9, value=b"nine")]
    batch, _ = read_batch(record_batch(records), 0)
    assert batch.base_offset == 5 and batch.last_offset_delta == 4
    assert [(r.offset, r.key, r.value) for r in batch.records] == [
        (5, b"k", b"v"),
        (6, b"k", b"v"),
        (9, b"k", b"nine"),
    ]
    assert batch.records[0].headers[0].key == b"h"


def test_timestamps_survive_to_the_millisecond() -> None:
    stamps = [1_700_000_000_123 + 7 * i for i in range(500)] + [0, 1, 999]
    records = [
        ShareRecord(TOPIC, 0, i, None, b"v", [], ts, 1, raw_value=b"v")
        for i, ts in enumerate(stamps)
    ]
    batch = DefaultRecordBatch(record_batch(records))  # as aiokafka's consumer reads it
    assert batch.validate_crc()
    assert [r.timestamp for r in batch] == stamps
    assert record_batch([]) == b""


def test_acquired_ranges_group_consecutive_offsets_by_delivery_count() -> None:
    records = [record(1), record(2), record(3, 2), record(4, 2), record(7, 2)]
    assert acquired_ranges(records) == [(1, 2, 1), (3, 4, 2), (7, 7, 2)]


# -- the server, with a member stub ---------------------------------------------------------------
class StubSession:
    """Stands in for a ShareFetchSession: assigned partition 0, one record per fetch."""

    def __init__(self, group: str, topics: list[str], client_id: str, on_ack: Any) -> None:
        self.on_ack = on_ack
        self.pending: list[int] = []
        self.member_id = str(uuid.uuid4())
        self.assignment = {TopicPartition(TOPIC, 0)}
        self.acked: list[tuple[int, AcknowledgeType]] = []
        self.ranges: list[tuple[int, int, AcknowledgeType]] = []  # acknowledge_range calls
        self.next_offset = 0
        self.closed = False
        self.released: list[int] = []  # a closed share session's records, RELEASEd
        self.released_event = asyncio.Event()

    async def start(self) -> None:
        pass

    async def close(self, leave: bool = True) -> None:
        self.closed = True

    def prepare(self, tp: TopicPartition) -> None:
        pass

    def acknowledge(self, tp: TopicPartition, offset: int, kind: AcknowledgeType) -> None:
        self.acked.append((offset, kind))
        self.pending.append(offset)

    def acknowledge_range(
        self, tp: TopicPartition, first: int, last: int, kind: AcknowledgeType
    ) -> None:
        self.ranges.append((first, last, kind))
        for offset in range(first, last + 1):
            self.acknowledge(tp, offset, kind)
            if kind is AcknowledgeType.RELEASE:  # only the listener releases here
                self.released.append(offset)
                self.released_event.set()

    async def flush(self, tp: TopicPartition) -> None:
        return None

    async def flush_all(self) -> dict[TopicPartition, None]:
        return {}

    async def fetch(self, tp: TopicPartition, max_records: int, max_wait_ms: int) -> FetchResult:
        # offsets from 100 on are refused as stale, the way a leader answers
        if stale := [o for o in self.pending if o >= 100]:
            self.on_ack(tp, stale, ShareGroupError(QfErrorCode.INVALID_RECORD_STATE, "stale"))
        self.pending.clear()
        if not max_records:
            return FetchResult()
        self.next_offset += 1
        return FetchResult(records=[record(self.next_offset - 1)], lock_timeout_ms=30_000)


@pytest.fixture
def listener() -> Iterator[tuple[KafkaListener, list[StubSession]]]:
    sessions: list[StubSession] = []

    def factory(group: str, topics: list[str], client_id: str, on_ack: Any, **_: Any) -> Any:
        sessions.append(StubSession(group, topics, client_id, on_ack))
        return sessions[-1]

    async def served() -> dict[str, int]:
        return {TOPIC: 1}

    loop = asyncio.new_event_loop()
    kl = KafkaListener(
        "PLAINTEXT://127.0.0.1:0",
        "127.0.0.1",
        "app",
        served,
        factory,
        object(),  # type: ignore[arg-type]  # no admin API is asked here
        heartbeat_interval_ms=500,
        session_timeout_ms=60_000,
        limits=unit_limits(),
        max_connections=4,
        monotonic=loop.time,
    )
    loop.run_until_complete(kl.start())
    kl.loop = loop  # type: ignore[attr-defined]
    yield kl, sessions
    loop.run_until_complete(kl.close())
    loop.close()


async def exchange(port: int, *frames: bytes) -> list[bytes]:
    """Send ``frames`` on one connection; the answer frames, until the listener closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for frame in frames:
            writer.write(frame)
        await writer.drain()
        answers = []
        while len(answers) < len(frames):
            try:
                size = await asyncio.wait_for(reader.readexactly(4), 5)
            except asyncio.IncompleteReadError:
                break  # closed by the listener
            answers.append(size + await reader.readexactly(struct.unpack(">i", size)[0]))
        return answers
    finally:
        writer.close()
        await writer.wait_closed()


def run(kl: KafkaListener, coro: Any) -> Any:
    return kl.loop.run_until_complete(coro)  # type: ignore[attr-defined]


def api_versions_frame() -> bytes:
    return request_frame(
        18, 4, request(18, 4, client_software_name="t", client_software_version="1")
    )


def test_oversized_and_junk_frames_close_their_connection_only(listener: Any) -> None:
    kl, _ = listener
    assert run(kl, exchange(kl.port, struct.pack(">i", 1 << 20) + b"x" * 16)) == []
    assert run(kl, exchange(kl.port, struct.pack(">i", -5))) == []
    junk = struct.pack(">i", 12) + struct.pack(">hhi", 3, 13, 1) + b"\xff\xff\xff\xff"
    assert run(kl, exchange(kl.port, junk)) == []
    # an unsupported version of another API: closed, as Kafka's brokers do
    old = request_frame(3, 1, request(3, 1, topics=None))
    assert run(kl, exchange(kl.port, old)) == []
    (answer,) = run(kl, exchange(kl.port, api_versions_frame()))
    assert response_of(18, 4, answer)[1].error_code == ErrorCode.none


def test_api_versions_of_an_unknown_version_is_answered(listener: Any) -> None:
    kl, _ = listener
    body = request(18, 4, client_software_name="t", client_software_version="1")
    (answer,) = run(
        kl,
        exchange(
            kl.port,
            request_frame(18, 4, body)[:6] + struct.pack(">h", 9) + request_frame(18, 4, body)[8:],
        ),
    )
    assert response_of(18, 0, answer)[1].error_code == ErrorCode.unsupported_version


def heartbeat(
    epoch: int, member_id: str = "m1", topics: tuple[str, ...] | None = (TOPIC,)
) -> bytes:
    return request_frame(
        76,
        1,
        request(
            76,
            1,
            group_id="g",
            member_id=member_id,
            member_epoch=i32(epoch),
            subscribed_topic_names=topics,
        ),
    )


def share_fetch(
    epoch: int,
    acks: tuple[tuple[int, int, int], ...] = (),
    member: str = "m1",
    topic_id: uuid.UUID | None = None,
    max_wait_ms: int = 0,
) -> bytes:
    m = load_payload_module(78, 2, EntityType.request)
    tid = topic_id or TopicIds("app").id_of(TOPIC)
    batches = tuple(
        m.AcknowledgementBatch(
            first_offset=i64(f), last_offset=i64(last), acknowledge_types=(i8(k),)
        )
        for f, last, k in acks
    )
    return request_frame(
        78,
        2,
        m.ShareFetchRequest(
            group_id="g",
            member_id=member,
            share_session_epoch=i32(epoch),
            max_wait=datetime.timedelta(milliseconds=max_wait_ms),
            min_bytes=i32(1),
            max_records=i32(10),
            batch_size=i32(10),
            topics=(
                m.FetchTopic(
                    topic_id=tid,
                    partitions=(
                        m.FetchPartition(partition_index=i32(0), acknowledgement_batches=batches),
                    ),
                ),
            ),
            forgotten_topics_data=(),
        ),
    )


def test_heartbeat_join_assignment_and_fencing(listener: Any) -> None:
    kl, sessions = listener
    answers = run(
        kl, exchange(kl.port, heartbeat(0), heartbeat(1), heartbeat(7), heartbeat(3, "x"))
    )
    joined, steady, fenced, unknown = (response_of(76, 1, a)[1] for a in answers)
    assert joined.error_code == ErrorCode.none and joined.member_epoch == 1
    (tps,) = joined.assignment.topic_partitions
    assert tps.topic_id == TopicIds("app").id_of(TOPIC) and tps.partitions == (0,)
    assert steady.error_code == ErrorCode.none and steady.assignment is None  # unchanged
    assert fenced.error_code == ErrorCode.fenced_member_epoch
    assert unknown.error_code == ErrorCode.unknown_member_id
    (leave,) = run(kl, exchange(kl.port, heartbeat(-1)))
    assert response_of(76, 1, leave)[1].member_epoch == -1 and sessions[0].closed
    (nothing,) = run(kl, exchange(kl.port, heartbeat(0, "m2", ("other",))))
    assert response_of(76, 1, nothing)[1].error_code == ErrorCode.unknown_topic_or_partition


def test_acknowledgements_after_the_leave_count_until_the_share_session_closes(
    listener: Any,
) -> None:
    """As Kafka's brokers (4.3), where a leave heartbeat leaves the share session open (only its
    end or the connection's releases the member's records): librdkafka's close sends its last
    acknowledgements after its leave heartbeat, and they are applied."""
    kl, sessions = listener
    answers = run(
        kl,
        exchange(
            kl.port,
            heartbeat(0),
            share_fetch(0),  # offset 0 acquired
            heartbeat(-1),  # leaves with its session open
            share_fetch(-1, acks=((0, 0, 1),)),  # the session's end carries the ACCEPT
        ),
    )
    left, closed = response_of(76, 1, answers[2])[1], response_of(78, 2, answers[3])[1]
    assert left.error_code == ErrorCode.none and left.member_epoch == -1
    assert closed.error_code == ErrorCode.none
    assert closed.responses[0].partitions[0].acknowledge_error_code == ErrorCode.none
    assert sessions[0].acked == [(0, AcknowledgeType.ACCEPT)] and sessions[0].closed
    assert kl.members.members == {}


def test_share_sessions_epochs_records_and_acknowledgements(listener: Any) -> None:
    kl, sessions = listener
    answers = run(
        kl,
        exchange(
            kl.port,
            share_fetch(0, member="nobody"),  # not a member
            heartbeat(0),
            share_fetch(3),  # no session yet
            share_fetch(0),  # opens it: the next epoch is 1
            share_fetch(1, acks=((0, 0, 1),)),  # ACCEPT offset 0 rides along
            share_fetch(1),  # the epoch again
            share_fetch(2, acks=((100, 100, 1),)),  # refused by the leader as stale
        ),
    )
    nobody = response_of(78, 2, answers[0])[1]
    missing, opened, second, repeated, stale = (response_of(78, 2, a)[1] for a in answers[2:])
    assert nobody.error_code == ErrorCode.unknown_member_id
    assert missing.error_code == ErrorCode.share_session_not_found
    (topic,) = opened.responses
    (part,) = topic.partitions
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] == [
        (0, 0, 1)
    ]
    batch, _ = read_batch(part.records, 0)
    assert [r.value for r in batch.records] == [b"v"]
    assert opened.acquisition_lock_timeout == datetime.timedelta(seconds=30)
    assert second.error_code == ErrorCode.none
    assert sessions[0].acked[0] == (0, AcknowledgeType.ACCEPT)
    assert repeated.error_code == ErrorCode.invalid_share_session_epoch
    assert second.responses[0].partitions[0].acknowledge_error_code == ErrorCode.none
    (topic,) = stale.responses
    assert topic.partitions[0].acknowledge_error_code == ErrorCode.invalid_record_state


def test_the_final_epoch_releases_what_the_session_held_and_was_not_acknowledged(
    listener: Any,
) -> None:
    """As Kafka's brokers (releaseSession on the final epoch): the request's own
    acknowledgements first, then the rest of what the session returned is RELEASEd."""
    kl, sessions = listener
    answers = run(
        kl,
        exchange(
            kl.port,
            heartbeat(0),
            share_fetch(0),  # offset 0
            share_fetch(1),  # offset 1: 0 and 1 held
            share_fetch(-1, acks=((0, 0, 1),)),  # ACCEPT 0 and close
        ),
    )
    closed = response_of(78, 2, answers[3])[1]
    assert closed.error_code == ErrorCode.none
    session = sessions[0]
    assert session.acked[0] == (0, AcknowledgeType.ACCEPT) and session.released == [1]
    assert kl.members.members[("g", "m1")].share_session is None


def test_a_closed_connection_closes_its_share_session_and_releases_what_it_held(
    listener: Any,
) -> None:
    """As Kafka 4.x brokers: the share session belongs to the connection that opened it; when
    that connection closes, the records returned and not acknowledged are RELEASEd at once,
    and the member stays in its group."""
    kl, sessions = listener
    answers = run(
        kl,
        exchange(
            kl.port,
            heartbeat(0),
            share_fetch(0),  # offset 0
            share_fetch(1, acks=((0, 0, 1),)),  # ACCEPT 0; offset 1 returned
            share_fetch(2),  # offset 2 returned: 1 and 2 held
        ),
    )
    assert all(response_of(78, 2, a)[1].error_code == ErrorCode.none for a in answers[1:])
    session = sessions[0]
    run(kl, asyncio.wait_for(session.released_event.wait(), 5))
    assert session.released == [1, 2]
    assert (1, AcknowledgeType.RELEASE) in session.acked and not session.closed
    assert ("g", "m1") in kl.members.members  # still a member: its heartbeats decide
    (again,) = run(kl, exchange(kl.port, share_fetch(3)))  # another connection
    assert response_of(78, 2, again)[1].error_code == ErrorCode.share_session_not_found


def test_a_frame_that_never_arrives_closes_its_connection(listener: Any) -> None:
    kl, _ = listener
    kl._read_s = 0.2  # queueflow.direct.frame.read.timeout.ms

    async def slow() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", kl.port)
        writer.write(struct.pack(">i", 100) + b"\0" * 10)  # 90 bytes never come
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
            await writer.wait_closed()

    assert run(kl, slow()) == b""
    (answer,) = run(kl, exchange(kl.port, api_versions_frame()))
    assert response_of(18, 4, answer)[1].error_code == ErrorCode.none


def test_find_coordinator_names_the_listener_for_groups_only() -> None:
    node = Node(0, "10.0.0.5", 9192)
    groups = find_coordinator_response(
        6, request(10, 6, key_type=i8(0), coordinator_keys=("g",)), node
    )
    _, decoded = response_of(10, 6, encode_response(1, groups))
    (c,) = decoded.coordinators
    assert (c.key, c.node_id, c.host, c.port, c.error_code) == ("g", 0, "10.0.0.5", 9192, 0)
    txn = find_coordinator_response(
        6, request(10, 6, key_type=i8(1), coordinator_keys=("t",)), node
    )
    assert txn.coordinators[0].error_code == ErrorCode.invalid_request


def test_metadata_of_all_topics_lists_the_served_ones() -> None:
    body = request(
        3,
        12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    gateway = Cluster(Node(0, "h", 1), gateway=True)
    answer = metadata_response(12, body, {"b": 1, "a": 2}, gateway, TopicIds("x"), "x")
    _, decoded = response_of(3, 12, encode_response(1, answer))
    assert [(t.name, len(t.partitions)) for t in decoded.topics] == [("a", 2), ("b", 1)]


@pytest.mark.parametrize(
    "acks",
    [
        ((0, 10**15, 1),),  # would be 10**15 acknowledgements: bounded
        ((5, 4, 1),),  # reversed
        ((-3, 0, 1),),  # negative
        ((0, 0, 9),),  # unknown type
    ],
)
def test_invalid_acknowledgement_batches_are_invalid_requests(
    listener: Any, acks: tuple[tuple[int, int, int], ...]
) -> None:
    kl, sessions = listener
    answers = run(kl, exchange(kl.port, heartbeat(0), share_fetch(0), share_fetch(1, acks=acks)))
    assert response_of(78, 2, answers[2])[1].error_code == ErrorCode.invalid_request
    assert sessions[0].acked == []  # nothing applied


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_find_coordinator_of_one_key(version: int) -> None:
    fields: dict[str, Any] = {"key": "g"}
    if version >= 1:
        fields["key_type"] = i8(0)
    answer = find_coordinator_response(version, request(10, version, **fields), Node(0, "h", 7))
    _, decoded = response_of(10, version, encode_response(1, answer))
    assert (decoded.error_code, decoded.node_id, decoded.host, decoded.port) == (0, 0, "h", 7)


@pytest.mark.parametrize("version", [1, 2])
def test_share_acknowledge_of_each_version(listener: Any, version: int) -> None:
    kl, sessions = listener
    m = load_payload_module(79, version, EntityType.request)
    body = m.ShareAcknowledgeRequest(
        group_id="g",
        member_id="m1",
        share_session_epoch=i32(1),
        topics=(
            m.AcknowledgeTopic(
                topic_id=TopicIds("app").id_of(TOPIC),
                partitions=(
                    m.AcknowledgePartition(
                        partition_index=i32(0),
                        acknowledgement_batches=(
                            m.AcknowledgementBatch(
                                first_offset=i64(0), last_offset=i64(0), acknowledge_types=(i8(3),)
                            ),
                        ),
                    ),
                ),
            ),
        ),
    )
    answers = run(
        kl, exchange(kl.port, heartbeat(0), share_fetch(0), request_frame(79, version, body))
    )
    assert len(answers) == 3, "the listener closed the connection"
    acked = response_of(79, version, answers[2])[1]
    assert acked.error_code == ErrorCode.none
    assert acked.responses[0].partitions[0].error_code == ErrorCode.none
    assert sessions[0].acked == [(0, AcknowledgeType.REJECT)]


def test_a_batch_of_one_type_is_acknowledged_as_one_range(listener: Any) -> None:
    """A batch with one acknowledge type for its offsets (what clients mostly send) is one
    ``acknowledge_range`` call, not one call per offset; GAP counts as ACCEPT either way."""
    kl, sessions = listener
    m = load_payload_module(79, 2, EntityType.request)
    batches = ((0, 4, (1,)), (5, 7, (1, 0, 2)), (8, 9, (0,)))  # ACCEPT; per offset; GAP
    body = m.ShareAcknowledgeRequest(
        group_id="g",
        member_id="m1",
        share_session_epoch=i32(1),
        topics=(
            m.AcknowledgeTopic(
                topic_id=TopicIds("app").id_of(TOPIC),
                partitions=(
                    m.AcknowledgePartition(
                        partition_index=i32(0),
                        acknowledgement_batches=tuple(
                            m.AcknowledgementBatch(
                                first_offset=i64(first),
                                last_offset=i64(last),
                                acknowledge_types=tuple(i8(t) for t in types),
                            )
                            for first, last, types in batches
                        ),
                    ),
                ),
            ),
        ),
    )
    answers = run(kl, exchange(kl.port, heartbeat(0), share_fetch(0), request_frame(79, 2, body)))
    assert response_of(79, 2, answers[2])[1].error_code == ErrorCode.none
    accept, release = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE
    assert sessions[0].ranges == [(0, 4, accept), (8, 9, accept)]
    assert sessions[0].acked == [
        *((o, accept) for o in range(7)),
        (7, release),
        (8, accept),
        (9, accept),
    ]


def test_produce_and_fetch_are_listed_for_librdkafka_and_refused(listener: Any) -> None:
    # librdkafka sends its ShareFetch only to a broker listing Produce v3+ and Fetch v4+
    assert SERVED[0][0] <= 3 <= SERVED[0][1] and SERVED[1][0] <= 4 <= SERVED[1][1]
    kl, _ = listener
    m = load_payload_module(0, 3, EntityType.request)
    produce = request(
        0,
        3,
        transactional_id=None,
        acks=i16(1),
        timeout=datetime.timedelta(seconds=1),
        topic_data=(
            m.TopicProduceData(
                name=TOPIC, partition_data=(m.PartitionProduceData(index=i32(0), records=None),)
            ),
        ),
    )
    f = load_payload_module(1, 4, EntityType.request)
    fetch = request(
        1,
        4,
        max_wait=datetime.timedelta(milliseconds=10),
        min_bytes=i32(1),
        topics=(
            f.FetchTopic(
                topic=TOPIC,
                partitions=(
                    f.FetchPartition(
                        partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1024)
                    ),
                ),
            ),
        ),
    )
    produced, fetched = run(
        kl, exchange(kl.port, request_frame(0, 3, produce), request_frame(1, 4, fetch))
    )
    _, p = response_of(0, 3, produced)
    assert p.responses[0].partition_responses[0].error_code == ErrorCode.invalid_request
    _, r = response_of(1, 4, fetched)
    assert r.responses[0].partitions[0].error_code == ErrorCode.invalid_request
    assert r.responses[0].partitions[0].records is None


def test_a_session_reopened_on_another_connection_keeps_what_the_first_held(
    listener: Any,
) -> None:
    """A client that reconnects opens its share session again (epoch 0) on the new connection:
    the old connection's close releases nothing, the new one's releases what both held."""
    kl, sessions = listener

    async def scenario() -> None:
        async def answer(reader: asyncio.StreamReader) -> bytes:
            size = await asyncio.wait_for(reader.readexactly(4), 5)
            return size + await reader.readexactly(struct.unpack(">i", size)[0])

        first = await asyncio.open_connection("127.0.0.1", kl.port)
        first[1].write(heartbeat(0) + share_fetch(0))  # offset 0 held
        await answer(first[0])
        await answer(first[0])
        second = await asyncio.open_connection("127.0.0.1", kl.port)
        second[1].write(share_fetch(0))  # reopened here: offset 1
        assert response_of(78, 2, await answer(second[0]))[1].error_code == ErrorCode.none
        first[1].close()
        await first[1].wait_closed()
        await asyncio.wait_for(first[0].read(), 5)  # the listener saw it close
        assert sessions[0].released == []
        second[1].close()
        await second[1].wait_closed()
        await asyncio.wait_for(sessions[0].released_event.wait(), 5)

    run(kl, scenario())
    assert sessions[0].released == [0, 1]
