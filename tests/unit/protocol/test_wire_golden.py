"""Golden bytes of every version-1 wire message and durable record.

Each case is asserted both ways: ``encode(obj) == bytes`` and ``decode(bytes) == obj``. A change
to these bytes is a wire-format change: it needs a new version, not an edit of this file.

Also checked: bytes written by queueflow before messages were versioned (plain JSON dataclasses,
every field written, ``kind`` last) decode as version 1, and what this version writes is
readable by that older code (so old and new workers interoperate during a rolling upgrade).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from queueflow.engine.group import ShareGroup
from queueflow.engine.state import RecordState, ShareSnapshot, ShareUpdate, StateBatch
from queueflow.protocol.group_codec import decode_group, encode_group
from queueflow.protocol.messages import (
    Fence,
    HeartbeatRequest,
    HeartbeatResponse,
    Message,
    ReleaseMember,
    ShareFetchRequest,
    ShareFetchResponse,
    Tick,
    decode,
    encode,
)
from queueflow.protocol.state_codec import (
    decode_snapshot,
    decode_update,
    encode_snapshot_v1,
    encode_update_v1,
)

FULL_FETCH = ShareFetchRequest(
    "g",
    "orders",
    3,
    "m-1",
    17,
    2,
    500,
    acks=[(0, 4, (1,)), (5, 7, (1, 2, 3))],
    lock_duration_ms=15000,
    deadline_ms=1700000000000,
)
MIN_FETCH = ShareFetchRequest("g", "orders", 0, "m-2", 1, 0, 0)
FULL_RESPONSE = ShareFetchResponse(
    "m-1",
    17,
    "orders",
    3,
    acquired=[(10, 19, 1), (20, 20, 4)],
    error="NOT_LEADER_OR_FOLLOWER",
    error_message="moved",
    ack_error="INVALID_RECORD_STATE",
    ack_error_message="stale",
    ack_stale=[(0, 4)],
    lock_timeout_ms=30000,
)
MIN_RESPONSE = ShareFetchResponse("m-1", 1, "orders", 0)
RELEASE = ReleaseMember("g", "orders", 1, "m-3", reason="session timeout")
TICK = Tick(sent_ms=123456)
FENCE = Fence(7, sent_ms=99)
HEARTBEAT = HeartbeatRequest(
    "g", "m-1", 0, ["orders", "payments"], 5, 99, client_id="client", host="h1"
)
HEARTBEAT_RESPONSE = HeartbeatResponse(
    "m-1", 99, 4, {"orders": [0, 2], "payments": [1]}, 3000, "UNKNOWN_MEMBER_ID", "rejoin"
)

MESSAGE_GOLDEN: list[tuple[str, Message, bytes]] = [
    (
        "fetch",
        FULL_FETCH,
        b'{"kind":"fetch","group":"g","topic":"orders","partition":3,"member_id":"m-1",'
        b'"request_id":17,"reply_partition":2,"max_records":500,"acks":[[0,4,[1]],[5,7,[1,2,3]]],'
        b'"lock_duration_ms":15000,"deadline_ms":1700000000000}',
    ),
    (
        "fetch-minimal",
        MIN_FETCH,
        b'{"kind":"fetch","group":"g","topic":"orders","partition":0,"member_id":"m-2",'
        b'"request_id":1,"reply_partition":0,"max_records":0}',
    ),
    (
        "fetch_response",
        FULL_RESPONSE,
        b'{"kind":"fetch_response","member_id":"m-1","request_id":17,"topic":"orders",'
        b'"partition":3,"acquired":[[10,19,1],[20,20,4]],"error":"NOT_LEADER_OR_FOLLOWER",'
        b'"error_message":"moved","ack_error":"INVALID_RECORD_STATE","ack_error_message":"stale",'
        b'"ack_stale":[[0,4]],"lock_timeout_ms":30000}',
    ),
    (
        "fetch_response-minimal",
        MIN_RESPONSE,
        b'{"kind":"fetch_response","member_id":"m-1","request_id":1,"topic":"orders",'
        b'"partition":0}',
    ),
    (
        "release_member",
        RELEASE,
        b'{"kind":"release_member","group":"g","topic":"orders","partition":1,"member_id":"m-3",'
        b'"reason":"session timeout"}',
    ),
    ("tick", TICK, b'{"kind":"tick","sent_ms":123456}'),
    ("tick-minimal", Tick(), b'{"kind":"tick"}'),
    ("fence", FENCE, b'{"kind":"fence","leader_epoch":7,"sent_ms":99}'),
    (
        "heartbeat",
        HEARTBEAT,
        b'{"kind":"heartbeat","group":"g","member_id":"m-1","member_epoch":0,'
        b'"subscribed_topics":["orders","payments"],"reply_partition":5,"request_id":99,'
        b'"client_id":"client","host":"h1"}',
    ),
    (
        "heartbeat-leave",
        HeartbeatRequest("g", "m-1", -1, [], 0, 1),
        b'{"kind":"heartbeat","group":"g","member_id":"m-1","member_epoch":-1,'
        b'"subscribed_topics":[],"reply_partition":0,"request_id":1}',
    ),
    (
        "heartbeat_response",
        HEARTBEAT_RESPONSE,
        b'{"kind":"heartbeat_response","member_id":"m-1","request_id":99,"member_epoch":4,'
        b'"assignment":{"orders":[0,2],"payments":[1]},"heartbeat_interval_ms":3000,'
        b'"error":"UNKNOWN_MEMBER_ID","error_message":"rejoin"}',
    ),
    (
        "heartbeat_response-minimal",
        HeartbeatResponse("m-1", 1),
        b'{"kind":"heartbeat_response","member_id":"m-1","request_id":1}',
    ),
]

GOLDEN_IDS = [name for name, _, _ in MESSAGE_GOLDEN]


@pytest.mark.parametrize(("name", "message", "data"), MESSAGE_GOLDEN, ids=GOLDEN_IDS)
def test_message_golden_bytes(name: str, message: Message, data: bytes) -> None:
    assert encode(message) == data, name
    assert decode(data) == message, name


def test_every_kind_has_golden_bytes() -> None:
    assert {m.kind for _, m, _ in MESSAGE_GOLDEN} == {
        "fetch",
        "fetch_response",
        "release_member",
        "tick",
        "fence",
        "heartbeat",
        "heartbeat_response",
    }


# Exactly what the unversioned encoder (JSON of every dataclass field, ``kind`` last) wrote.
UNVERSIONED: list[tuple[bytes, Message]] = [
    (
        b'{"group":"g","topic":"orders","partition":3,"member_id":"m-1","request_id":17,'
        b'"reply_partition":2,"max_records":500,"acks":[[0,4,[1]],[5,7,[1,2,3]]],'
        b'"lock_duration_ms":15000,"deadline_ms":1700000000000,"kind":"fetch"}',
        FULL_FETCH,
    ),
    (
        b'{"group":"g","topic":"orders","partition":0,"member_id":"m-2","request_id":1,'
        b'"reply_partition":0,"max_records":0,"acks":[],"lock_duration_ms":null,"deadline_ms":0,'
        b'"kind":"fetch"}',
        MIN_FETCH,
    ),
    (
        b'{"member_id":"m-1","request_id":17,"topic":"orders","partition":3,'
        b'"acquired":[[10,19,1],[20,20,4]],"error":"NOT_LEADER_OR_FOLLOWER",'
        b'"error_message":"moved","ack_error":"INVALID_RECORD_STATE","ack_error_message":"stale",'
        b'"ack_stale":[[0,4]],"lock_timeout_ms":30000,"kind":"fetch_response"}',
        FULL_RESPONSE,
    ),
    (
        b'{"member_id":"m-1","request_id":1,"topic":"orders","partition":0,"acquired":[],'
        b'"error":"NONE","error_message":"","ack_error":"NONE","ack_error_message":"",'
        b'"ack_stale":[],"lock_timeout_ms":0,"kind":"fetch_response"}',
        MIN_RESPONSE,
    ),
    (
        b'{"group":"g","topic":"orders","partition":1,"member_id":"m-3",'
        b'"reason":"session timeout","kind":"release_member"}',
        RELEASE,
    ),
    (b'{"sent_ms":123456,"kind":"tick"}', TICK),
    (b'{"leader_epoch":7,"sent_ms":99,"kind":"fence"}', FENCE),
    (
        b'{"group":"g","member_id":"m-1","member_epoch":0,"subscribed_topics":["orders",'
        b'"payments"],"reply_partition":5,"request_id":99,"client_id":"client","host":"h1",'
        b'"kind":"heartbeat"}',
        HEARTBEAT,
    ),
    (
        b'{"member_id":"m-1","request_id":99,"member_epoch":4,"assignment":{"orders":[0,2],'
        b'"payments":[1]},"heartbeat_interval_ms":3000,"error":"UNKNOWN_MEMBER_ID",'
        b'"error_message":"rejoin","kind":"heartbeat_response"}',
        HEARTBEAT_RESPONSE,
    ),
    # An early response, before ack_stale and lock_timeout_ms existed.
    (
        b'{"member_id":"m-1","request_id":1,"topic":"orders","partition":0,"acquired":[],'
        b'"error":"NONE","error_message":"","ack_error":"NONE","ack_error_message":"",'
        b'"kind":"fetch_response"}',
        MIN_RESPONSE,
    ),
]


@pytest.mark.parametrize(
    ("data", "message"), UNVERSIONED, ids=[f"{m.kind}-{i}" for i, (_, m) in enumerate(UNVERSIONED)]
)
def test_unversioned_messages_decode_as_version_1(data: bytes, message: Message) -> None:
    back = decode(data)
    assert back == message
    assert back.v == 1
    if isinstance(back, HeartbeatRequest):
        assert back.protocol_version == 1


# The unversioned schema: kind -> (required fields, optional fields with their defaults). The
# old decoder did ``cls(**body)``: any other field was INVALID_REQUEST.
_OLD_SCHEMA: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "fetch": (
        (
            "group",
            "topic",
            "partition",
            "member_id",
            "request_id",
            "reply_partition",
            "max_records",
        ),
        {"acks": [], "lock_duration_ms": None, "deadline_ms": 0},
    ),
    "fetch_response": (
        ("member_id", "request_id", "topic", "partition"),
        {
            "acquired": [],
            "error": "NONE",
            "error_message": "",
            "ack_error": "NONE",
            "ack_error_message": "",
            "ack_stale": [],
            "lock_timeout_ms": 0,
        },
    ),
    "release_member": (("group", "topic", "partition", "member_id"), {"reason": ""}),
    "tick": ((), {"sent_ms": 0}),
    "fence": (("leader_epoch",), {"sent_ms": 0}),
    "heartbeat": (
        (
            "group",
            "member_id",
            "member_epoch",
            "subscribed_topics",
            "reply_partition",
            "request_id",
        ),
        {"client_id": "", "host": ""},
    ),
    "heartbeat_response": (
        ("member_id", "request_id"),
        {
            "member_epoch": 0,
            "assignment": {},
            "heartbeat_interval_ms": 5000,
            "error": "NONE",
            "error_message": "",
        },
    ),
}


def _old_decode(data: bytes) -> dict[str, Any]:
    """What the unversioned decoder accepted: ``kind`` plus only its own fields."""
    body: dict[str, Any] = json.loads(data)
    required, optional = _OLD_SCHEMA[body.pop("kind")]
    unknown = set(body) - set(required) - set(optional)
    assert not unknown, f"an unversioned peer would refuse the fields {unknown}"
    missing = set(required) - set(body)
    assert not missing, f"an unversioned peer would miss {missing}"
    return {**optional, **body}


@pytest.mark.parametrize(("name", "message", "data"), MESSAGE_GOLDEN, ids=GOLDEN_IDS)
def test_version_1_bytes_are_readable_by_unversioned_peers(
    name: str, message: Message, data: bytes
) -> None:
    old = _old_decode(data)
    for field in old:
        value = getattr(message, field)
        assert json.loads(json.dumps(value)) == old[field], (name, field)


# ------------------------------------------------------------------------------------------------
# Durable state records, version 1 (the JSON layout queueflow wrote before version 2; version 2
# golden bytes are in test_state_codec_v2.py)
# ------------------------------------------------------------------------------------------------

AV, AK, AR = RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED
WHERE = "group=G topic=T partition=3"

SNAPSHOT = ShareSnapshot(
    2,
    1,
    7,
    100,
    (StateBatch(100, 104, AV, 2), StateBatch(105, 105, AK, 1), StateBatch(107, 110, AR, 5)),
)
SNAPSHOT_BYTES = (
    b'{"v":1,"t":"snapshot","snapshot_epoch":2,"state_epoch":1,"leader_epoch":7,'
    b'"start_offset":100,"batches":[[100,104,0,2],[105,105,2,1],[107,110,4,5]]}'
)
EMPTY_SNAPSHOT_BYTES = (
    b'{"v":1,"t":"snapshot","snapshot_epoch":0,"state_epoch":0,"leader_epoch":-1,'
    b'"start_offset":0,"batches":[]}'
)
UPDATES: list[tuple[ShareUpdate, int, int, int, bytes]] = [
    (
        ShareUpdate(105, (StateBatch(106, 106, AV, 1),)),
        2,
        1,
        4,
        b'{"v":1,"t":"update","snapshot_epoch":2,"state_epoch":1,"delta_index":4,'
        b'"start_offset":105,"reset":false,"batches":[[106,106,0,1]]}',
    ),
    (
        ShareUpdate(0, (), reset=True),
        9,
        3,
        0,
        b'{"v":1,"t":"update","snapshot_epoch":9,"state_epoch":3,"delta_index":0,'
        b'"start_offset":0,"reset":true,"batches":[]}',
    ),
    (
        ShareUpdate(-1, (StateBatch(3, 3, AR, 1),)),
        0,
        0,
        499,
        b'{"v":1,"t":"update","snapshot_epoch":0,"state_epoch":0,"delta_index":499,'
        b'"start_offset":-1,"reset":false,"batches":[[3,3,4,1]]}',
    ),
]


def test_snapshot_golden_bytes() -> None:
    assert encode_snapshot_v1(SNAPSHOT) == SNAPSHOT_BYTES
    assert decode_snapshot(SNAPSHOT_BYTES, where=WHERE) == SNAPSHOT
    empty = ShareSnapshot(0, 0, -1, 0, ())
    assert encode_snapshot_v1(empty) == EMPTY_SNAPSHOT_BYTES
    assert decode_snapshot(EMPTY_SNAPSHOT_BYTES, where=WHERE) == empty


@pytest.mark.parametrize(("update", "snap", "state", "index", "data"), UPDATES)
def test_update_golden_bytes(
    update: ShareUpdate, snap: int, state: int, index: int, data: bytes
) -> None:
    assert (
        encode_update_v1(update, snapshot_epoch=snap, state_epoch=state, delta_index=index) == data
    )
    assert decode_update(data, where=WHERE) == (update, snap, state, index)


def test_update_without_reset_field_decodes() -> None:
    data = (
        b'{"v":1,"t":"update","snapshot_epoch":2,"state_epoch":1,"delta_index":4,'
        b'"start_offset":105,"batches":[]}'
    )
    assert decode_update(data, where=WHERE) == (ShareUpdate(105, ()), 2, 1, 4)


# ------------------------------------------------------------------------------------------------
# Group metadata
# ------------------------------------------------------------------------------------------------

# json.dumps(group.to_dict()) as the coordinator wrote it before group_codec (default separators).
OLD_GROUP_BYTES = (
    b'{"v": 1, "group_epoch": 2, "assignment_epoch": 2, "dead": false, "partitions": '
    b'{"orders": 3, "payments": 1}, "members": [["m-1", 2, ["orders"], [["orders", 0], '
    b'["orders", 1]], "c1", "h1"], ["m-2", 2, ["orders", "payments"], [["orders", 2], '
    b'["payments", 0]], "c2", "h2"]]}'
)
GROUP_BYTES = (
    b'{"v":1,"group_epoch":2,"assignment_epoch":2,"dead":false,"partitions":{"orders":3,'
    b'"payments":1},"members":[["m-1",2,["orders"],[["orders",0],["orders",1]],"c1","h1"],'
    b'["m-2",2,["orders","payments"],[["orders",2],["payments",0]],"c2","h2"]],'
    b'"heartbeats":{"m-1":1000,"m-2":1000},"session_timeout_ms":45000}'
)
#: The same group as written before ``heartbeats`` and ``session_timeout_ms`` (still decoded).
GROUP_BYTES_BEFORE_HEARTBEATS = GROUP_BYTES.split(b',"heartbeats"')[0] + b"}"


def _group() -> ShareGroup:
    group = ShareGroup("G", 45000, 200)
    group.heartbeat("m-1", 0, ["orders"], 1000, {"orders": 3}, client_id="c1", host="h1")
    group.heartbeat(
        "m-2", 0, ["orders", "payments"], 1000, {"orders": 3, "payments": 1}, "c2", "h2"
    )
    return group


def test_group_golden_bytes() -> None:
    group = _group()
    assert json.dumps(group.to_dict()).encode() == OLD_GROUP_BYTES  # what was written before
    assert encode_group(group) == GROUP_BYTES
    for data in (GROUP_BYTES, GROUP_BYTES_BEFORE_HEARTBEATS, OLD_GROUP_BYTES):
        back = decode_group("G", data, 45000, 200, now_ms=1000)
        assert back.to_dict() == group.to_dict()
        assert {m: vars_of(x) for m, x in back.members.items()} == {
            m: vars_of(x) for m, x in group.members.items()
        }


def vars_of(member: Any) -> tuple[Any, ...]:
    # provisional / joined_ms are not durable (a restored member is confirmed).
    return tuple(
        getattr(member, name)
        for name in member.__slots__
        if name not in ("provisional", "joined_ms")
    )
