"""Wire messages (``queueflow.protocol.messages``): encode/decode round trip and malformed input."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest

from queueflow.errors import ErrorCode, InvalidRequestError
from queueflow.protocol.messages import (
    Fence,
    HeartbeatRequest,
    HeartbeatResponse,
    ReleaseMember,
    ShareFetchRequest,
    ShareFetchResponse,
    Tick,
    decode,
    encode,
)

MESSAGES: list[Any] = [
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
]


def as_tuple(message: Any) -> tuple[Any, ...]:
    return tuple(getattr(message, f.name) for f in fields(message))


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: f"{type(m).__name__}")
def test_round_trip(message: Any) -> None:
    data = encode(message)
    assert isinstance(data, bytes)
    back = decode(data)
    assert type(back) is type(message)
    assert back == message
    assert as_tuple(back) == as_tuple(message)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: f"{type(m).__name__}")
def test_decode_accepts_str_and_dict(message: Any) -> None:
    data = encode(message)
    assert decode(data.decode()) == message
    assert decode(json.loads(data)) == message


def test_every_kind_is_covered() -> None:
    kinds = {m.kind for m in MESSAGES}
    assert kinds == {
        "fetch",
        "fetch_response",
        "release_member",
        "tick",
        "fence",
        "heartbeat",
        "heartbeat_response",
    }


def test_encoding_is_compact_json_with_kind() -> None:
    data = encode(Tick(sent_ms=5))
    assert data == b'{"sent_ms":5,"kind":"tick"}'


def test_decoded_acks_and_acquired_are_tuples() -> None:
    req = decode(encode(MESSAGES[0]))
    assert isinstance(req, ShareFetchRequest)
    assert all(isinstance(a, tuple) and isinstance(a[2], tuple) for a in req.acks)
    resp = decode(encode(MESSAGES[2]))
    assert isinstance(resp, ShareFetchResponse)
    assert all(isinstance(a, tuple) for a in resp.acquired)
    assert resp.ack_stale == [(0, 4), (8, 8)]
    assert all(isinstance(a, tuple) for a in resp.ack_stale)


def test_response_without_new_fields_decodes_with_defaults() -> None:
    body = json.loads(encode(MESSAGES[3]))
    del body["ack_stale"], body["lock_timeout_ms"]
    resp = decode(body)
    assert isinstance(resp, ShareFetchResponse)
    assert (resp.ack_stale, resp.lock_timeout_ms) == ([], 0)


def _fetch_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(encode(MESSAGES[0]))
    body.update(changes)
    return body


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"garbage", id="not-json"),
        pytest.param(b"", id="empty"),
        pytest.param(b"\xff\xfe\x00", id="not-utf8"),
        pytest.param(b"{", id="truncated"),
        pytest.param(b"[]", id="list"),
        pytest.param(b"null", id="null"),
        pytest.param(b"42", id="number"),
        pytest.param(b'"fetch"', id="string"),
        pytest.param(b"{}", id="no-kind"),
        pytest.param(b'{"kind":"nope"}', id="unknown-kind"),
        pytest.param(b'{"kind":["fetch"]}', id="unhashable-kind"),
        pytest.param(b'{"kind":"tick","sent_ms":1,"extra":2}', id="unknown-field"),
        pytest.param(b'{"kind":"release_member","group":"g"}', id="missing-fields"),
        pytest.param({"kind": "heartbeat"}, id="dict-missing-fields"),
        pytest.param("not json either", id="str"),
    ],
)
def test_decode_garbage_raises_invalid_request(data: Any) -> None:
    with pytest.raises(InvalidRequestError) as info:
        decode(data)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert "undecodable" in str(info.value)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_fetch_body(acks=[[1, 2]]), id="ack-too-short"),
        pytest.param(_fetch_body(acks=[["x", 2, [1]]]), id="ack-not-int"),
        pytest.param(_fetch_body(acks=5), id="acks-not-list"),
        pytest.param(
            {**json.loads(encode(MESSAGES[3])), "acquired": [[1, 2]]}, id="acquired-too-short"
        ),
    ],
)
def test_decode_malformed_acks_raises_invalid_request(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        decode(json.dumps(body).encode())
