"""Durable share-partition state records: the version 1 (JSON) codec, validation and replay
(notes §11). The version 2 (binary) codec is tested in test_state_codec_v2.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from queueflow.engine import (
    RecordState,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    replay,
)
from queueflow.errors import CorruptStateError, ErrorCode
from queueflow.protocol.state_codec import (
    STATE_FORMAT_JSON_VERSION,
    decode_snapshot,
    decode_update,
    encode_snapshot_v1,
    encode_update_v1,
)

AV = RecordState.AVAILABLE
AK = RecordState.ACKNOWLEDGED
AR = RecordState.ARCHIVED
WHERE = "group=G topic=T partition=3"

SNAP = ShareSnapshot(
    snapshot_epoch=2,
    state_epoch=1,
    leader_epoch=7,
    start_offset=100,
    batches=(StateBatch(100, 104, AV, 2), StateBatch(105, 105, AK, 1), StateBatch(107, 110, AR, 5)),
)
UPD = ShareUpdate(start_offset=105, batches=(StateBatch(106, 106, AV, 1),))


def snapshot_obj(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(encode_snapshot_v1(SNAP))
    obj.update(changes)
    return obj


def update_obj(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(
        encode_update_v1(UPD, snapshot_epoch=2, state_epoch=1, delta_index=4)
    )
    obj.update(changes)
    return obj


def raw(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# ------------------------------------------------------------------------------------------------
# Codec
# ------------------------------------------------------------------------------------------------


def test_snapshot_round_trip_and_layout() -> None:
    data = encode_snapshot_v1(SNAP)
    assert decode_snapshot(data, where=WHERE) == SNAP
    assert b" " not in data  # compact
    obj = json.loads(data)
    assert obj["v"] == STATE_FORMAT_JSON_VERSION == 1
    assert obj["t"] == "snapshot"
    assert obj["batches"] == [[100, 104, 0, 2], [105, 105, 2, 1], [107, 110, 4, 5]]
    decoded = decode_snapshot(data, where=WHERE)
    assert all(isinstance(b.state, RecordState) for b in decoded.batches)


def test_update_round_trip() -> None:
    for update in (
        UPD,
        ShareUpdate(0, (), reset=True),
        ShareUpdate(-1, (StateBatch(3, 3, AR, 1),)),
    ):
        data = encode_update_v1(update, snapshot_epoch=9, state_epoch=3, delta_index=499)
        assert decode_update(data, where=WHERE) == (update, 9, 3, 499)
        assert json.loads(data)["t"] == "update"


def test_encode_refuses_acquired() -> None:
    bad = ShareUpdate(0, (StateBatch(0, 0, RecordState.ACQUIRED, 1),))
    with pytest.raises(ValueError, match=r"Acquired|ACQUIRED"):
        encode_update_v1(bad, snapshot_epoch=0, state_epoch=0, delta_index=0)


def batch_list(*items: Any) -> dict[str, Any]:
    return {"batches": list(items)}


SNAPSHOT_CORRUPTIONS: list[tuple[str, bytes]] = [
    ("not JSON", b"{not json"),
    ("not UTF-8", b"\xff\xfe\x00"),
    ("JSON list", raw([1, 2])),
    ("no version", raw({k: v for k, v in snapshot_obj().items() if k != "v"})),
    ("wrong type tag", raw(snapshot_obj(t="update"))),
    ("missing field", raw({k: v for k, v in snapshot_obj().items() if k != "start_offset"})),
    ("string field", raw(snapshot_obj(start_offset="100"))),
    ("bool field", raw(snapshot_obj(state_epoch=True))),
    ("negative start", raw(snapshot_obj(start_offset=-1))),
    ("batches not a list", raw(snapshot_obj(batches={"a": 1}))),
    ("batch too short", raw(snapshot_obj(**batch_list([1, 2, 0])))),
    ("batch non-int", raw(snapshot_obj(**batch_list([1, 2, 0, "1"])))),
    ("batch float", raw(snapshot_obj(**batch_list([1, 2.0, 0, 1])))),
    ("state Acquired", raw(snapshot_obj(**batch_list([1, 2, 1, 1])))),
    ("state 3", raw(snapshot_obj(**batch_list([1, 2, 3, 1])))),
    ("first > last", raw(snapshot_obj(**batch_list([5, 4, 0, 1])))),
    ("negative first", raw(snapshot_obj(**batch_list([-2, 4, 0, 1])))),
    ("negative count", raw(snapshot_obj(**batch_list([1, 4, 0, -1])))),
    ("overlapping", raw(snapshot_obj(**batch_list([1, 4, 0, 1], [4, 6, 2, 1])))),
    ("unordered", raw(snapshot_obj(**batch_list([10, 14, 0, 1], [1, 6, 2, 1])))),
]


@pytest.mark.parametrize(
    ("what", "data"), SNAPSHOT_CORRUPTIONS, ids=[c[0] for c in SNAPSHOT_CORRUPTIONS]
)
def test_corrupt_snapshot_is_refused(what: str, data: bytes) -> None:
    with pytest.raises(CorruptStateError) as info:
        decode_snapshot(data, where=WHERE)
    message = str(info.value)
    assert WHERE in message
    assert "refusing to serve this share-partition" in message
    assert "docs/operations.md" in message
    assert info.value.code is ErrorCode.CORRUPT_STATE


UPDATE_CORRUPTIONS: list[tuple[str, bytes]] = [
    ("snapshot given as update", encode_snapshot_v1(SNAP)),
    ("reset not bool", raw(update_obj(reset=1))),
    ("start below -1", raw(update_obj(start_offset=-2))),
    ("negative delta index", raw(update_obj(delta_index=-1))),
    (
        "missing snapshot epoch",
        raw({k: v for k, v in update_obj().items() if k != "snapshot_epoch"}),
    ),
    ("overlapping", raw(update_obj(**batch_list([1, 4, 0, 1], [2, 3, 2, 1])))),
    ("state 1", raw(update_obj(**batch_list([1, 4, 1, 1])))),
]


@pytest.mark.parametrize(
    ("what", "data"), UPDATE_CORRUPTIONS, ids=[c[0] for c in UPDATE_CORRUPTIONS]
)
def test_corrupt_update_is_refused(what: str, data: bytes) -> None:
    with pytest.raises(CorruptStateError) as info:
        decode_update(data, where=WHERE)
    assert WHERE in str(info.value)


@pytest.mark.parametrize("version", [0, 2, 99, "1", None, True])
def test_unknown_version(version: object) -> None:
    for data, decode in (
        (raw(snapshot_obj(v=version)), decode_snapshot),
        (raw(update_obj(v=version)), decode_update),
    ):
        with pytest.raises(CorruptStateError) as info:
            decode(data, where=WHERE)
        message = str(info.value)
        assert WHERE in message
        assert f"version {version!r}" in message
        assert "supports version 1" in message


def test_unknown_fields_are_ignored() -> None:
    assert decode_snapshot(raw(snapshot_obj(extra=[1, 2])), where=WHERE) == SNAP
    update = raw(update_obj(extra={"nested": [None]}))
    assert decode_update(update, where=WHERE) == (UPD, 2, 1, 4)


def test_state_written_before_msgspec_restores_unchanged() -> None:
    """Bytes of the hand-written JSON encoder (same layout; key order and spacing are free)."""
    spaced = json.dumps(snapshot_obj()).encode()  # default separators: ", " and ": "
    assert b" " in spaced
    assert decode_snapshot(spaced, where=WHERE) == SNAP
    reordered = json.dumps(dict(reversed(list(update_obj().items())))).encode()
    assert decode_update(reordered, where=WHERE) == (UPD, 2, 1, 4)
    # `reset` was optional on read
    no_reset = raw({k: v for k, v in update_obj().items() if k != "reset"})
    assert decode_update(no_reset, where=WHERE) == (UPD, 2, 1, 4)


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (raw(snapshot_obj(state_epoch="1")), "$.state_epoch"),
        (raw(snapshot_obj(**batch_list([1, 2, 0, 1], [3, 4, 0, None]))), "$.batches[1][3]"),
        (raw(update_obj(reset="no")), "$.reset"),
        (raw(update_obj(start_offset=2**63)), "$.start_offset"),
    ],
)
def test_wrong_type_names_the_field(data: bytes, path: str) -> None:
    decode = decode_snapshot if json.loads(data)["t"] == "snapshot" else decode_update
    with pytest.raises(CorruptStateError) as info:
        decode(data, where=WHERE)
    assert f"`{path}`" in str(info.value)
    assert WHERE in str(info.value)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(raw(snapshot_obj(snapshot_epoch=2**64)), id="huge-epoch"),
        pytest.param(raw(snapshot_obj(**batch_list([1, 2**63, 0, 1]))), id="huge-offset"),
        pytest.param(raw(snapshot_obj(**batch_list([1, 2, 0, 2**63]))), id="huge-count"),
        pytest.param(raw(snapshot_obj(**batch_list([1, 2, 0, 2**80]))), id="bigint-count"),
        pytest.param(raw(snapshot_obj(leader_epoch=-2)), id="leader-epoch-below-minus-1"),
        pytest.param(b'{"v":1,"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}", id="deep"),
        pytest.param(encode_snapshot_v1(SNAP)[:-1], id="truncated"),
        pytest.param(b"", id="empty"),
        pytest.param(None, id="none"),
        pytest.param("{}", id="str"),
    ],
)
def test_more_corrupt_snapshots(data: Any) -> None:
    with pytest.raises(CorruptStateError) as info:
        decode_snapshot(data, where=WHERE)
    assert WHERE in str(info.value)


def test_unknown_version_with_a_different_layout() -> None:
    """A newer writer's record says so, even when its fields no longer fit version 1."""
    data = raw({"v": 2, "t": "snapshot", "spso": 5, "batches": {"ranges": []}})
    with pytest.raises(CorruptStateError, match=r"version 2 .*upgrade queueflow"):
        decode_snapshot(data, where=WHERE)


# ------------------------------------------------------------------------------------------------
# Replay
# ------------------------------------------------------------------------------------------------


def test_replay_without_anything() -> None:
    assert replay(None, []) == (0, ())
    assert replay(SNAP, []) == (100, SNAP.batches)


def test_replay_overwrites_covered_ranges_and_sets_start() -> None:
    updates = [
        ShareUpdate(100, (StateBatch(102, 103, AK, 2), StateBatch(111, 112, AV, 1))),
        ShareUpdate(100, (StateBatch(106, 106, AV, 1),)),
    ]
    assert replay(SNAP, updates) == (
        100,
        (
            StateBatch(100, 101, AV, 2),
            StateBatch(102, 103, AK, 2),
            StateBatch(104, 104, AV, 2),
            StateBatch(105, 105, AK, 1),
            StateBatch(106, 106, AV, 1),
            StateBatch(107, 110, AR, 5),
            StateBatch(111, 112, AV, 1),
        ),
    )


def test_replay_drops_batches_below_start_and_merges() -> None:
    updates = [
        ShareUpdate(103, (StateBatch(105, 105, AR, 5),)),  # 105 now equals its right neighbour
        ShareUpdate(-1, (StateBatch(106, 106, AR, 5),)),  # -1: start unchanged
    ]
    assert replay(SNAP, updates) == (
        103,
        (StateBatch(103, 104, AV, 2), StateBatch(105, 110, AR, 5)),
    )


def test_replay_is_idempotent() -> None:
    u1 = ShareUpdate(100, (StateBatch(100, 101, AK, 2), StateBatch(106, 108, AV, 1)))
    u2 = ShareUpdate(102, (StateBatch(104, 107, AR, 3),))
    u3 = ShareUpdate(102, (StateBatch(103, 103, AV, 4),))
    once = replay(SNAP, [u1, u2, u3])
    assert replay(SNAP, [u1, u1, u2, u2, u3, u3]) == once
    assert replay(SNAP, [u1, u2, u3, u1, u2, u3]) == once
    # Replaying the result as a snapshot with the same updates again changes nothing either.
    start, batches = once
    assert replay(ShareSnapshot(3, 1, 7, start, batches), [u1, u2, u3]) == once


def test_replay_reset_replaces_everything() -> None:
    updates = [
        ShareUpdate(105, (StateBatch(106, 106, AV, 1),)),
        ShareUpdate(50, (StateBatch(50, 52, AV, 1),), reset=True),
        ShareUpdate(50, (StateBatch(53, 53, AK, 1),)),
    ]
    expected = (50, (StateBatch(50, 52, AV, 1), StateBatch(53, 53, AK, 1)))
    assert replay(SNAP, updates) == expected
    assert replay(SNAP, [*updates[:2], *updates[1:]]) == expected  # reset applied twice
    assert replay(None, [ShareUpdate(9, (), reset=True)]) == (9, ())


def test_replay_refuses_malformed_batches() -> None:
    bad = ShareUpdate(0, (StateBatch(5, 9, AV, 1), StateBatch(7, 8, AK, 1)))
    with pytest.raises(CorruptStateError, match=WHERE):
        replay(None, [bad], where=WHERE)
    with pytest.raises(CorruptStateError):
        replay(None, [ShareUpdate(0, (StateBatch(5, 9, RecordState.ACQUIRED, 1),))])
