"""Wire messages (``queueflow.protocol.messages``): round trip, public shape, versioning and
malformed input."""

from __future__ import annotations

import json
from typing import Any, get_args

import msgspec
import pytest

from queueflow.errors import ErrorCode, InvalidRequestError
from queueflow.protocol import messages
from queueflow.protocol.messages import (
    PROTOCOL_VERSION,
    SUPPORTED_PROTOCOL_VERSIONS,
    Fence,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaderAnnouncement,
    MemberTicketRequest,
    Message,
    ReleaseMember,
    ShareFetchCancel,
    ShareFetchRequest,
    ShareFetchResponse,
    Tick,
    WireAck,
    WireAcquired,
    decode,
    encode,
)

MESSAGES: list[Message] = [
    ShareFetchRequest(
        group="g",
        topic="orders",
        partition=3,
        member_id="m-1",
        request_id=17,
        reply_partition=2,
        max_records=500,
        acks=[(0, 4, (1,)), (5, 7, (1, 2, 3)), (9, 9, (0,))],
        lock_duration_ms=15000,
        deadline_ms=1_700_000_000_000,
    ),
    ShareFetchRequest("g", "orders", 0, "m-2", 1, 0, 0),
    ShareFetchResponse(
        member_id="m-1",
        request_id=17,
        topic="orders",
        partition=3,
        acquired=[(10, 19, 1), (20, 20, 4)],
        error=ErrorCode.NOT_LEADER_OR_FOLLOWER.value,
        error_message="moved",
        ack_error=ErrorCode.INVALID_RECORD_STATE.value,
        ack_error_message="records 0..4 are not Acquired",
        ack_stale=[(0, 4), (8, 8)],
        lock_timeout_ms=30000,
    ),
    ShareFetchResponse("m-1", 1, "orders", 0),
    ReleaseMember("g", "orders", 1, "m-3", reason="session timeout"),
    Tick(sent_ms=123456),
    Tick(),
    Fence(leader_epoch=7, sent_ms=99),
    HeartbeatRequest(
        group="g",
        member_id="m-1",
        member_epoch=0,
        subscribed_topics=["orders", "payments"],
        reply_partition=5,
        request_id=99,
        client_id="client",
        host="/10.0.0.1",
    ),
    HeartbeatRequest("g", "m-1", -1, [], 0, 1),
    HeartbeatResponse(
        member_id="m-1",
        request_id=99,
        member_epoch=4,
        assignment={"orders": [0, 2], "payments": [1]},
        heartbeat_interval_ms=3000,
        error=ErrorCode.UNKNOWN_MEMBER_ID.value,
        error_message="rejoin",
    ),
    HeartbeatResponse("m-1", 1),
    MemberTicketRequest("g", "m-1", 3, 1 << 41, reply_key=b"k" * 32, requester="h:9192"),
    LeaderAnnouncement(
        "orders", [0, 2], 5, "h:1", kafka_listener="h:9192", coordinator_partitions=[(3, 7)]
    ),
]
IDS = [f"{type(m).__name__}{i}" for i, m in enumerate(MESSAGES)]


@pytest.mark.parametrize("message", MESSAGES, ids=IDS)
def test_round_trip(message: Message) -> None:
    data = encode(message)
    assert isinstance(data, bytes)
    back = decode(data)
    assert type(back) is type(message)
    assert back == message
    assert msgspec.structs.astuple(back) == msgspec.structs.astuple(message)


@pytest.mark.parametrize("message", MESSAGES, ids=IDS)
def test_decode_accepts_str_buffers_and_mappings(message: Message) -> None:
    data = encode(message)
    assert decode(data.decode()) == message
    assert decode(bytearray(data)) == message
    assert decode(memoryview(data)) == message
    assert decode(json.loads(data)) == message


def test_every_kind_is_covered_and_kind_reads_the_tag() -> None:
    kinds = {m.kind for m in MESSAGES}
    assert kinds == {
        "fetch",
        "fetch_response",
        "release_member",
        "tick",
        "fence",
        "heartbeat",
        "heartbeat_response",
        "member_ticket",
        "leader_announcement",
    }
    for m in MESSAGES:
        assert m.kind == type(m).__struct_config__.tag == json.loads(encode(m))["kind"]


# The public shape the leader, coordinator and member client rely on: field names in positional
# order (``v`` is keyword-only, last).
SHAPES: dict[type[Any], tuple[str, ...]] = {
    ShareFetchRequest: (
        "group",
        "topic",
        "partition",
        "member_id",
        "request_id",
        "reply_partition",
        "max_records",
        "acks",
        "lock_duration_ms",
        "deadline_ms",
        "max_wait_ms",
        "ticket",
        "ack_delay_ms",
        "ack_undelivered",
        "ack_errors",
    ),
    ShareFetchResponse: (
        "member_id",
        "request_id",
        "topic",
        "partition",
        "acquired",
        "error",
        "error_message",
        "ack_error",
        "ack_error_message",
        "ack_stale",
        "lock_timeout_ms",
        "read_committed",
        "records",
        "records_end",
    ),
    ReleaseMember: (
        "group",
        "topic",
        "partition",
        "member_id",
        "reason",
        "member_epoch",
        "coordinator_epoch",
    ),
    Tick: ("sent_ms",),
    Fence: ("leader_epoch", "sent_ms"),
    HeartbeatRequest: (
        "group",
        "member_id",
        "member_epoch",
        "subscribed_topics",
        "reply_partition",
        "request_id",
        "client_id",
        "host",
        "protocol_version",
        "assignors",
        "rack_id",
        "reply_key",
        "principal",
    ),
    HeartbeatResponse: (
        "member_id",
        "request_id",
        "member_epoch",
        "assignment",
        "heartbeat_interval_ms",
        "error",
        "error_message",
        "leaders",
        "ticket",
        "coordinator_epoch",
    ),
    LeaderAnnouncement: (
        "topic",
        "partitions",
        "leader_epoch",
        "address",
        "sent_ms",
        "lag",
        "kafka_listener",
        "coordinator_partitions",
    ),
    MemberTicketRequest: (
        "group",
        "member_id",
        "reply_partition",
        "request_id",
        "reply_key",
        "requester",
    ),
    ShareFetchCancel: ("member_id", "request_id", "topic", "partition"),
}


@pytest.mark.parametrize("cls", list(SHAPES), ids=lambda c: c.__name__)
def test_public_shape(cls: type[Any]) -> None:
    assert cls.__struct_fields__ == (*SHAPES[cls], "v")
    # `v` is keyword-only: one positional argument more than the shape is refused.
    with pytest.raises(TypeError):
        cls(*range(len(SHAPES[cls]) + 1))


def test_positional_construction_and_defaults() -> None:
    req = ShareFetchRequest("g", "t", 1, "m", 2, 3, 4, [(1, 2, (1,))], 500, 9)
    assert (req.acks, req.lock_duration_ms, req.deadline_ms, req.v) == ([(1, 2, (1,))], 500, 9, 1)
    resp = ShareFetchResponse("m", 1, "t", 0)
    assert resp.acquired == [] and resp.ack_stale == []
    assert (resp.error, resp.ack_error, resp.lock_timeout_ms) == ("NONE", "NONE", 0)
    hb = HeartbeatRequest("g", "m", 0, ["t"], 1, 2, "c", "h")
    assert hb.protocol_version == PROTOCOL_VERSION
    assert HeartbeatResponse("m", 1).heartbeat_interval_ms == 5000
    assert Fence(3).sent_ms == 0 and Tick().sent_ms == 0
    # default containers are not shared between instances
    resp.acquired.append((1, 1, 1))
    assert ShareFetchResponse("m", 1, "t", 0).acquired == []


def test_messages_are_mutable() -> None:
    response = ShareFetchResponse("m", 1, "t", 0)
    response.error, response.error_message = ErrorCode.CORRUPT_STATE.value, "bad"
    response.acquired = [(5, 9, 1)]
    response.ack_stale = [(1, 2)]
    response.lock_timeout_ms = 30_000
    back = decode(encode(response))
    assert back == response


def test_type_aliases() -> None:
    ack: WireAck = (1, 2, (1, 2))
    acquired: WireAcquired = (1, 2, 3)
    assert get_args(WireAck) == (int, int, tuple[int, ...])
    assert get_args(WireAcquired) == (int, int, int)
    assert (ack, acquired) == ((1, 2, (1, 2)), (1, 2, 3))


def test_encoding_is_compact_json_with_kind_first() -> None:
    assert encode(Tick(sent_ms=5)) == b'{"kind":"tick","sent_ms":5}'
    assert encode(Tick()) == b'{"kind":"tick"}'


def test_decoded_acks_and_acquired_are_tuples_of_ints() -> None:
    req = decode(encode(MESSAGES[0]))
    assert isinstance(req, ShareFetchRequest)
    assert all(isinstance(a, tuple) and isinstance(a[2], tuple) for a in req.acks)
    assert all(type(x) is int for a in req.acks for x in (a[0], a[1], *a[2]))
    resp = decode(encode(MESSAGES[2]))
    assert isinstance(resp, ShareFetchResponse)
    assert all(isinstance(a, tuple) for a in resp.acquired)
    assert resp.ack_stale == [(0, 4), (8, 8)]
    assert all(isinstance(a, tuple) for a in resp.ack_stale)


def test_response_without_optional_fields_decodes_with_defaults() -> None:
    resp = decode(
        b'{"kind":"fetch_response","member_id":"m","request_id":1,"topic":"t","partition":0}'
    )
    assert isinstance(resp, ShareFetchResponse)
    assert (resp.acquired, resp.ack_stale, resp.lock_timeout_ms, resp.v) == ([], [], 0, 1)


# ------------------------------------------------------------------------------------------------
# Versioning
# ------------------------------------------------------------------------------------------------


def test_protocol_versions() -> None:
    assert PROTOCOL_VERSION == 1
    assert PROTOCOL_VERSION in SUPPORTED_PROTOCOL_VERSIONS
    assert 0 not in SUPPORTED_PROTOCOL_VERSIONS
    assert PROTOCOL_VERSION + 1 not in SUPPORTED_PROTOCOL_VERSIONS
    assert set(messages.__all__) >= {"PROTOCOL_VERSION", "SUPPORTED_PROTOCOL_VERSIONS"}


def test_unsupported_version_error_code() -> None:
    assert ErrorCode.UNSUPPORTED_VERSION.value == "UNSUPPORTED_VERSION"
    assert not ErrorCode.UNSUPPORTED_VERSION.retriable


@pytest.mark.parametrize("message", MESSAGES, ids=IDS)
def test_version_one_is_not_written(message: Message) -> None:
    """v1 bytes are the unversioned format, which queueflow before versioning can read."""
    body = json.loads(encode(message))
    assert "v" not in body
    assert "protocol_version" not in body
    assert message.v == 1


def test_later_versions_are_written_and_read() -> None:
    tick = Tick(sent_ms=1, v=2)
    assert encode(tick) == b'{"kind":"tick","sent_ms":1,"v":2}'
    assert decode(encode(tick)).v == 2
    hb = HeartbeatRequest("g", "m", 0, ["t"], 0, 1, protocol_version=2)
    data = encode(hb)
    assert json.loads(data)["protocol_version"] == 2
    back = decode(data)
    assert isinstance(back, HeartbeatRequest)
    assert back.protocol_version == 2
    assert back.protocol_version not in SUPPORTED_PROTOCOL_VERSIONS


def test_heartbeat_with_unsupported_protocol_version_still_decodes() -> None:
    """The coordinator must be able to answer UNSUPPORTED_VERSION rather than drop it."""
    for version in (0, -1, 99):
        body = {**json.loads(encode(MESSAGES[8])), "protocol_version": version}
        back = decode(json.dumps(body).encode())
        assert isinstance(back, HeartbeatRequest)
        assert back.protocol_version == version


def test_unknown_fields_from_a_newer_peer_are_ignored() -> None:
    body = {
        **json.loads(encode(MESSAGES[0])),
        "v": 3,
        "priority": 5,
        "trace": {"id": [1, 2, {"x": None}]},
    }
    back = decode(json.dumps(body).encode())
    assert isinstance(back, ShareFetchRequest)
    assert back.v == 3
    back.v = 1
    assert back == MESSAGES[0]


# ------------------------------------------------------------------------------------------------
# Malformed input
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"garbage", id="not-json"),
        pytest.param(b"", id="empty"),
        pytest.param(b"\xff\xfe\x00", id="not-utf8"),
        pytest.param(b"{", id="truncated"),
        pytest.param(b'{"kind":"tick","sent_ms":1', id="truncated-object"),
        pytest.param(b"[]", id="list"),
        pytest.param(b"null", id="null"),
        pytest.param(b"42", id="number"),
        pytest.param(b'"fetch"', id="string"),
        pytest.param(b"{}", id="no-kind"),
        pytest.param(b'{"kind":"nope"}', id="unknown-kind"),
        pytest.param(b'{"kind":["fetch"]}', id="unhashable-kind"),
        pytest.param(b'{"kind":"release_member","group":"g"}', id="missing-fields"),
        pytest.param(b'{"kind":"tick","v":0}', id="version-zero"),
        pytest.param(b'{"kind":"tick","v":"1"}', id="version-string"),
        pytest.param(b'{"kind":"tick"}{"kind":"tick"}', id="trailing-data"),
        pytest.param(b'{"kind":"tick","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="deep"),
        pytest.param({"kind": "heartbeat"}, id="dict-missing-fields"),
        pytest.param({"kind": "tick", "sent_ms": "1"}, id="dict-wrong-type"),
        pytest.param("not json either", id="str"),
        pytest.param(None, id="none"),
        pytest.param(42, id="int"),
    ],
)
def test_decode_garbage_raises_invalid_request(data: Any) -> None:
    with pytest.raises(InvalidRequestError) as info:
        decode(data)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert "undecodable" in str(info.value)
    assert "queueflow version" in str(info.value)


def _fetch_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(encode(MESSAGES[0]))
    body.update(changes)
    return body


def _response_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(encode(MESSAGES[2]))
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("body", "path", "expected"),
    [
        pytest.param(_fetch_body(acks=[[1, 2]]), "$.acks[0]", "length 3", id="ack-too-short"),
        pytest.param(_fetch_body(acks=[["x", 2, [1]]]), "$.acks[0][0]", "int", id="ack-not-int"),
        pytest.param(_fetch_body(acks=[[1, 2, [1.5]]]), "$.acks[0][2][0]", "int", id="ack-type"),
        pytest.param(_fetch_body(acks=5), "$.acks", "array", id="acks-not-list"),
        pytest.param(_fetch_body(partition=True), "$.partition", "int", id="bool-for-int"),
        pytest.param(_fetch_body(partition=1.0), "$.partition", "int", id="float-for-int"),
        pytest.param(_fetch_body(partition=2**63), "$.partition", "<=", id="huge-int"),
        pytest.param(_fetch_body(deadline_ms=-(2**70)), "$.deadline_ms", ">=", id="huge-neg"),
        pytest.param(_fetch_body(group=7), "$.group", "str", id="int-for-str"),
        pytest.param(_fetch_body(lock_duration_ms="1"), "$.lock_duration_ms", "int", id="opt"),
        pytest.param(
            _response_body(acquired=[[1, 2]]), "$.acquired[0]", "length 3", id="acquired-short"
        ),
        pytest.param(
            _response_body(ack_stale=[[1, 2, 3]]), "$.ack_stale[0]", "length 2", id="stale-long"
        ),
        pytest.param(
            {**json.loads(encode(MESSAGES[10])), "assignment": {"t": ["0"]}},
            "$.assignment[...][0]",
            "int",
            id="assignment",
        ),
    ],
)
def test_mistyped_field_names_kind_path_and_expectation(
    body: dict[str, Any], path: str, expected: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        decode(json.dumps(body).encode())
    message = str(info.value)
    assert f"kind {body['kind']!r}" in message
    assert f"`{path}`" in message
    assert expected in message


@pytest.mark.parametrize(
    "data",
    [b'{"kind":"tick","sent_ms":"\xff"}', b'{"kind":"\xff"}', b'{"kind":"fence","v":"\xff"}'],
)
def test_invalid_utf8_inside_json_is_an_invalid_request(data: bytes) -> None:
    with pytest.raises(InvalidRequestError):
        decode(data)


def test_binary_form_round_trips_every_message_and_is_compact() -> None:
    from queueflow.protocol.messages import LeaderAnnouncement, decode_binary, encode_binary

    acks = [(o, o + 8, (1,)) for o in range(0, 900, 10)] + [(905, 907, (1, 2, 1))]
    messages: list[Message] = [
        ShareFetchRequest("g", "t", 3, "m", 7, 1, 500, acks=acks, max_wait_ms=500),
        ShareFetchResponse("m", 7, "t", 3, acquired=[(0, 499, 1)], lock_timeout_ms=30000),
        HeartbeatResponse("m", 1, 2, {"t": [0, 1]}, leaders=[("t", 0, "h:1")]),
        LeaderAnnouncement(topic="t", partitions=[0, 1], leader_epoch=4, address="h:1"),
        Fence(3),
        Tick(),
        ShareFetchCancel("m", 7, "t", 3),
    ]
    for message in messages:
        assert decode_binary(encode_binary(message)) == message
    request = messages[0]
    assert len(encode_binary(request)) < 0.75 * len(encode(request))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "empty binary"),
        (b"\x02\x80", "format version 2; this queueflow reads version 1"),
        (b"\x01\xc1", "not a binary message"),
        (b"\x01\x81\xa4kind\xa4nope", "Invalid value 'nope'"),
    ],
)
def test_bad_binary_messages_are_invalid_requests(data: bytes, match: str) -> None:
    from queueflow.protocol.messages import decode_binary

    with pytest.raises(InvalidRequestError, match=match):
        decode_binary(data)
