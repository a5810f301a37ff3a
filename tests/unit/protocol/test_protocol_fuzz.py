"""Property tests of every decoder: anything a peer, a disk or a bug can hand them either decodes
into a valid value or is refused with the one error type the caller handles.

* ``messages.decode`` → a message, or exactly :class:`InvalidRequestError`;
* ``decode_snapshot`` / ``decode_update`` → valid state, or exactly :class:`CorruptStateError`;
* ``decode_group`` → a group, or exactly ``ShareGroupError(CORRUPT_STATE)``.

Never any other exception: the leader and coordinator catch only these, so anything else would
stop a Faust agent on one bad record. Inputs: random bytes, truncated valid encodings, valid JSON
with fields replaced by junk of any type, unknown extra fields, huge ints and nested junk.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from queueflow.engine.group import ShareGroup
from queueflow.engine.state import (
    PERSISTED_STATES,
    RecordState,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
)
from queueflow.errors import CorruptStateError, ErrorCode, InvalidRequestError, ShareGroupError
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
    encode_snapshot,
    encode_snapshot_v1,
    encode_update,
    encode_update_v1,
)

FAST = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
# Random bytes are cheap to generate: more examples for the same time.
MANY = settings(FAST, max_examples=300)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
WHERE = "group=G topic=T partition=0"
T = TypeVar("T")

# ------------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------------

i64 = st.integers(INT64_MIN, INT64_MAX)
small = st.integers(-5, 1_000)
text = st.text(max_size=12)
versions = st.integers(1, 3)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: huge ints too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=10,
)

acks = st.lists(st.tuples(i64, i64, st.lists(small, max_size=3).map(tuple)), max_size=4)
ranges3 = st.lists(st.tuples(i64, i64, small), max_size=4)

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(
        ShareFetchRequest,
        text,
        text,
        small,
        text,
        i64,
        small,
        small,
        acks,
        st.none() | i64,
        i64,
        i64,
        st.binary(max_size=64),
        v=versions,
    ),
    st.builds(
        ShareFetchResponse,
        text,
        i64,
        text,
        small,
        ranges3,
        text,
        text,
        text,
        text,
        st.lists(st.tuples(i64, i64), max_size=3),
        i64,
        v=versions,
    ),
    st.builds(ReleaseMember, text, text, small, text, text, i64, v=versions),
    st.builds(Tick, i64, v=versions),
    st.builds(Fence, i64, i64, v=versions),
    st.builds(
        HeartbeatRequest,
        text,
        text,
        small,
        st.lists(text, max_size=3),
        small,
        i64,
        text,
        text,
        small,
        v=versions,
    ),
    st.builds(
        HeartbeatResponse,
        text,
        i64,
        small,
        st.dictionaries(text, st.lists(small, max_size=3), max_size=3),
        i64,
        text,
        text,
        st.lists(st.tuples(text, small, text), max_size=2),
        st.binary(max_size=64),
        v=versions,
    ),
)


@st.composite
def state_batches(draw: st.DrawFn) -> tuple[StateBatch, ...]:
    """Ordered, non-overlapping persisted batches."""
    out: list[StateBatch] = []
    offset = draw(st.integers(0, 1_000))
    for _ in range(draw(st.integers(0, 5))):
        first = offset + draw(st.integers(0, 3))
        last = first + draw(st.integers(0, 10))
        state = draw(st.sampled_from(sorted(PERSISTED_STATES)))
        out.append(StateBatch(first, last, state, draw(st.integers(0, 20))))
        offset = last + 1
    return tuple(out)


snapshots = st.builds(
    ShareSnapshot,
    st.integers(0, 2**40),
    st.integers(0, 2**40),
    st.integers(-1, 2**31),
    st.integers(0, 1_000),
    state_batches(),
)
updates = st.builds(ShareUpdate, st.integers(-1, 2**40), state_batches(), st.booleans())


@st.composite
def groups(draw: st.DrawFn) -> ShareGroup:
    group = ShareGroup("G", 45_000, 50)
    topics = ["orders", "payments", "audit"]
    partitions = {t: draw(st.integers(1, 4)) for t in topics}
    for i in range(draw(st.integers(0, 5))):
        subscribed = draw(st.lists(st.sampled_from(topics), min_size=1, max_size=3, unique=True))
        group.heartbeat(f"m-{i}", 0, subscribed, 1_000, partitions, draw(text), draw(text))
    if draw(st.booleans()):
        group.leave("m-0")
    group.dead = draw(st.booleans())
    return group


# ------------------------------------------------------------------------------------------------
# Oracles
# ------------------------------------------------------------------------------------------------


def decode_message_or_refuse(data: Any) -> Message | None:
    """Decode; the only acceptable failure is InvalidRequestError. A decoded message is valid:
    it encodes, and decodes back to itself."""
    try:
        message = decode(data)
    except InvalidRequestError as exc:
        assert type(exc) is InvalidRequestError
        assert exc.code is ErrorCode.INVALID_REQUEST
        return None
    assert isinstance(
        message,
        ShareFetchRequest
        | ShareFetchResponse
        | ReleaseMember
        | Tick
        | Fence
        | HeartbeatRequest
        | HeartbeatResponse,
    )
    assert decode(encode(message)) == message
    return message


def check_batches(batches: tuple[StateBatch, ...]) -> None:
    prev = -1
    for b in batches:
        assert type(b.state) is RecordState and b.state in PERSISTED_STATES
        assert prev < b.first_offset <= b.last_offset <= INT64_MAX
        assert 0 <= b.delivery_count <= INT64_MAX
        prev = b.last_offset


def decode_state_or_refuse(fn: Callable[[bytes], T], data: Any) -> T | None:
    try:
        value = fn(data)
    except CorruptStateError as exc:
        assert type(exc) is CorruptStateError
        assert WHERE in str(exc)
        return None
    # Re-encode in the format read: version 1 holds values version 2 refuses (int64 counts).
    binary = bytes(data[:1]) == b"\xf5"  # the version 2 magic byte
    snapshot_encoder = encode_snapshot if binary else encode_snapshot_v1
    update_encoder = encode_update if binary else encode_update_v1
    if isinstance(value, ShareSnapshot):
        check_batches(value.batches)
        assert value.start_offset >= 0 and value.snapshot_epoch >= 0
        assert decode_snapshot(snapshot_encoder(value), where=WHERE) == value
    else:
        assert isinstance(value, tuple)
        update, snap, state, index = value
        assert isinstance(update, ShareUpdate)
        check_batches(update.batches)
        assert update.start_offset >= -1 and min(snap, state, index) >= 0
        again = update_encoder(update, snapshot_epoch=snap, state_epoch=state, delta_index=index)
        assert decode_update(again, where=WHERE) == value
    return value


def _snapshot(data: bytes) -> ShareSnapshot:
    return decode_snapshot(data, where=WHERE)


def _update(data: bytes) -> tuple[ShareUpdate, int, int, int]:
    return decode_update(data, where=WHERE)


STATE_DECODERS = (_snapshot, _update)


def decode_group_or_refuse(data: Any) -> ShareGroup | None:
    try:
        group = decode_group("G", data, 45_000, 50, 7)
    except ShareGroupError as exc:
        assert type(exc) is ShareGroupError
        assert exc.code is ErrorCode.CORRUPT_STATE
        assert "'G'" in str(exc)
        return None
    assert isinstance(group, ShareGroup)
    assert decode_group("G", encode_group(group), 45_000, 50, 7).to_dict() == group.to_dict()
    return group


def replace_field(body: dict[str, Any], data: st.DataObject, value: Any) -> dict[str, Any]:
    names = sorted(k for k in body if k != "kind")
    if names:
        body[data.draw(st.sampled_from(names))] = value
    return body


# ------------------------------------------------------------------------------------------------
# Wire messages
# ------------------------------------------------------------------------------------------------


@FAST
@given(messages)
def test_valid_messages_round_trip(message: Message) -> None:
    data = encode(message)
    assert decode(data) == message
    assert decode(json.loads(data)) == message


@MANY
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    decode_message_or_refuse(data)


@FAST
@given(messages, st.data())
def test_truncated_messages_are_refused(message: Message, data: st.DataObject) -> None:
    encoded = encode(message)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    assert decode_message_or_refuse(encoded[:cut]) is None


@FAST
@given(messages, json_values, st.data())
def test_mistyped_fields(message: Message, junk: Any, data: st.DataObject) -> None:
    body = replace_field(json.loads(encode(message)), data, junk)
    decode_message_or_refuse(json.dumps(body).encode())
    decode_message_or_refuse(body)  # the mapping path too


@FAST
@given(messages, st.integers(-(2**200), 2**200), st.data())
def test_huge_ints(message: Message, number: int, data: st.DataObject) -> None:
    body = replace_field(json.loads(encode(message)), data, number)
    decode_message_or_refuse(json.dumps(body).encode())


@FAST
@given(messages, st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_unknown_fields_are_ignored(message: Message, extra: dict[str, Any]) -> None:
    known = {*type(message).__struct_fields__, "kind"}
    body = {**json.loads(encode(message)), **{k: v for k, v in extra.items() if k not in known}}
    assert decode(json.dumps(body).encode()) == message


@FAST
@given(json_values)
def test_any_json(value: Any) -> None:
    decode_message_or_refuse(json.dumps(value).encode())


@FAST
@given(
    st.sampled_from(
        [
            "fetch",
            "fetch_response",
            "release_member",
            "tick",
            "fence",
            "heartbeat",
            "heartbeat_response",
            "",
        ]
    ),
    st.dictionaries(st.text(max_size=12), json_values, max_size=6),
)
def test_junk_objects_of_every_kind(kind: str, body: dict[str, Any]) -> None:
    decode_message_or_refuse(json.dumps({**body, "kind": kind}).encode())


def nested(depth: int, shape: str) -> bytes:
    """JSON nested ``depth`` levels deep (built as bytes: json.dumps would recurse)."""
    if shape == "list":
        return b"[" * depth + b"null" + b"]" * depth
    if shape == "dict":
        return b'{"k":' * depth + b"null" + b"}" * depth
    return b'[{"k":' * (depth // 2) + b"null" + b"}]" * (depth // 2)


@FAST
@given(messages, st.integers(1, 5_000), st.sampled_from(["list", "dict", "mixed"]), st.data())
def test_nested_junk(message: Message, depth: int, shape: str, data: st.DataObject) -> None:
    encoded = encode(message)
    junk = nested(depth, shape)
    # as an unknown field, and in place of a known one
    decode_message_or_refuse(encoded[:-1] + b',"junk":' + junk + b"}")
    names = [k for k in json.loads(encoded) if k != "kind"]
    if names:
        name = data.draw(st.sampled_from(names))
        decode_message_or_refuse(
            b'{"kind":"%s","%s":%s}' % (message.kind.encode(), name.encode(), junk)
        )


# ------------------------------------------------------------------------------------------------
# Durable state
# ------------------------------------------------------------------------------------------------


@FAST
@given(snapshots, updates, st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 10**6))
def test_valid_state_round_trips(
    snapshot: ShareSnapshot, update: ShareUpdate, snap: int, state: int, index: int
) -> None:
    for encode_s, encode_u in (
        (encode_snapshot, encode_update),
        (encode_snapshot_v1, encode_update_v1),
    ):
        assert decode_snapshot(encode_s(snapshot), where=WHERE) == snapshot
        data = encode_u(update, snapshot_epoch=snap, state_epoch=state, delta_index=index)
        assert decode_update(data, where=WHERE) == (update, snap, state, index)


@MANY
@given(st.binary(max_size=200))
@example(b'"\x80"')  # a JSON string that is not UTF-8: refused as corrupt, not UnicodeDecodeError
def test_state_random_bytes(data: bytes) -> None:
    for fn in STATE_DECODERS:
        decode_state_or_refuse(fn, data)


@FAST
@given(snapshots, updates, st.data())
def test_state_truncated(snapshot: ShareSnapshot, update: ShareUpdate, data: st.DataObject) -> None:
    for fn, encoded in (
        (_snapshot, encode_snapshot(snapshot)),
        (_update, encode_update(update, snapshot_epoch=1, state_epoch=1, delta_index=1)),
        (_snapshot, encode_snapshot_v1(snapshot)),
        (_update, encode_update_v1(update, snapshot_epoch=1, state_epoch=1, delta_index=1)),
    ):
        cut = data.draw(st.integers(0, len(encoded) - 1))
        assert decode_state_or_refuse(fn, encoded[:cut]) is None


@FAST
@given(snapshots, updates, json_values | st.integers(-(2**70), 2**70), st.data())
def test_state_mistyped_fields(
    snapshot: ShareSnapshot, update: ShareUpdate, junk: Any, data: st.DataObject
) -> None:
    for fn, encoded in (
        (_snapshot, encode_snapshot_v1(snapshot)),
        (_update, encode_update_v1(update, snapshot_epoch=1, state_epoch=1, delta_index=1)),
    ):
        body = replace_field(json.loads(encoded), data, junk)
        decode_state_or_refuse(fn, json.dumps(body).encode())


batch_junk = st.lists(
    st.lists(st.integers(-3, 30) | st.integers(-(2**70), 2**70) | json_scalars, max_size=5)
    | json_values,
    max_size=5,
)


@FAST
@given(snapshots, batch_junk)
def test_state_junk_batches(snapshot: ShareSnapshot, batches: Any) -> None:
    body = {**json.loads(encode_snapshot_v1(snapshot)), "batches": batches}
    decode_state_or_refuse(_snapshot, json.dumps(body).encode())
    body = {
        **json.loads(
            encode_update_v1(ShareUpdate(0, ()), snapshot_epoch=1, state_epoch=1, delta_index=1)
        ),
        "batches": batches,
    }
    decode_state_or_refuse(_update, json.dumps(body).encode())


@FAST
@given(snapshots, st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_state_unknown_fields_are_ignored(snapshot: ShareSnapshot, extra: dict[str, Any]) -> None:
    encoded = json.loads(encode_snapshot_v1(snapshot))
    body = {**{k: v for k, v in extra.items() if k not in encoded}, **encoded}
    assert decode_snapshot(json.dumps(body).encode(), where=WHERE) == snapshot


@FAST
@given(st.dictionaries(st.text(max_size=14), json_values, max_size=6), st.sampled_from([1, 2]))
def test_state_junk_objects(body: dict[str, Any], version: int) -> None:
    for fn, t in ((_snapshot, "snapshot"), (_update, "update")):
        decode_state_or_refuse(fn, json.dumps({**body, "v": version, "t": t}).encode())


# ------------------------------------------------------------------------------------------------
# Group metadata
# ------------------------------------------------------------------------------------------------


@FAST
@given(groups())
def test_valid_groups_round_trip(group: ShareGroup) -> None:
    back = decode_group("G", encode_group(group), 45_000, 50, 7)
    assert back.to_dict() == group.to_dict()


@MANY
@given(st.binary(max_size=200))
def test_group_random_bytes(data: bytes) -> None:
    decode_group_or_refuse(data)


@FAST
@given(groups(), st.data())
def test_group_truncated(group: ShareGroup, data: st.DataObject) -> None:
    encoded = encode_group(group)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    assert decode_group_or_refuse(encoded[:cut]) is None


@FAST
@given(groups(), json_values | st.integers(-(2**70), 2**70), st.data())
def test_group_mistyped_fields(group: ShareGroup, junk: Any, data: st.DataObject) -> None:
    body = replace_field(json.loads(encode_group(group)), data, junk)
    decode_group_or_refuse(json.dumps(body).encode())
    body = json.loads(encode_group(group))
    if body["members"]:
        body["members"][data.draw(st.integers(0, len(body["members"]) - 1))] = junk
        decode_group_or_refuse(json.dumps(body).encode())


#: Text that is valid Unicode: a lone surrogate (category Cs) makes ``json.dumps`` write a
#: ``\\ud800`` escape that no UTF-8 JSON decoder accepts, so the bytes are corrupt, not "unknown".
unicode_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
unicode_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | unicode_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(unicode_text, children, max_size=4)
    ),
    max_leaves=10,
)


@FAST
@given(groups(), st.dictionaries(unicode_text, unicode_json_values, max_size=4))
def test_group_unknown_fields_are_ignored(group: ShareGroup, extra: dict[str, Any]) -> None:
    encoded = json.loads(encode_group(group))
    body = {**{k: v for k, v in extra.items() if k not in encoded}, **encoded}
    assert decode_group("G", json.dumps(body).encode(), 45_000, 50, 7).to_dict() == (
        group.to_dict()
    )


@FAST
@given(st.dictionaries(st.text(max_size=16), json_values, max_size=6))
def test_group_junk_objects(body: dict[str, Any]) -> None:
    decode_group_or_refuse(json.dumps({**body, "v": 1}).encode())
    decode_group_or_refuse(json.dumps(body).encode())
