"""Durable share-group metadata (``queueflow.protocol.group_codec``): round trip, compatibility
with ``ShareGroup.to_dict``/``from_dict`` and refusal of corrupt records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from queueflow.engine.group import GroupState, Member, ShareGroup
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol.group_codec import GROUP_FORMAT_VERSION, decode_group, encode_group

GID = "orders-group"


def members_of(group: ShareGroup) -> dict[str, tuple[Any, ...]]:
    return {
        # provisional / joined_ms are not durable (a restored member is confirmed).
        mid: tuple(
            getattr(m, name)
            for name in Member.__slots__
            if name not in ("provisional", "joined_ms")
        )
        for mid, m in group.members.items()
    }


def make_group() -> ShareGroup:
    group = ShareGroup(GID, 45_000, 200)
    group.heartbeat("m-1", 0, ["orders"], 1_000, {"orders": 4}, client_id="c1", host="h1")
    group.heartbeat("m-2", 0, ["orders", "payments"], 1_500, {"orders": 4, "payments": 2}, "c2")
    group.heartbeat("m-3", 0, ["payments"], 2_000, {"payments": 2}, host="h3")
    return group


def test_round_trip() -> None:
    group = make_group()
    data = encode_group(group)
    assert isinstance(data, bytes)
    assert b" " not in data  # compact
    back = decode_group(GID, data, 30_000, 7, now_ms=5_000)
    assert back.group_id == GID
    assert (back.session_timeout_ms, back.max_size) == (30_000, 7)
    assert back.to_dict() == group.to_dict()
    assert (back.group_epoch, back.assignment_epoch, back.dead) == (
        group.group_epoch,
        group.assignment_epoch,
        False,
    )
    assert back.partitions == {"orders": 4, "payments": 2}
    assert back.state is GroupState.STABLE
    # every member gets a fresh session: the new coordinator can't know the last heartbeat
    assert {m.last_heartbeat_ms for m in back.members.values()} == {5_000}
    for m in group.members.values():
        m.last_heartbeat_ms = 5_000
    assert members_of(back) == members_of(group)
    m2 = back.members["m-2"]
    assert isinstance(m2.subscribed_topics, tuple)
    assert all(isinstance(tp, tuple) for tp in m2.assignment)


def test_decoded_group_keeps_working() -> None:
    back = decode_group(GID, encode_group(make_group()), 45_000, 200, now_ms=10_000)
    result = back.heartbeat("m-4", 0, ["orders"], 10_001, {"orders": 4})
    assert result.member_epoch == back.group_epoch
    assert len(back.members) == 4
    assert back.expire(10_000 + 45_001)  # sessions restarted at now_ms


def test_empty_and_dead_groups() -> None:
    empty = ShareGroup(GID, 45_000, 200)
    assert encode_group(empty) == (
        b'{"v":1,"group_epoch":0,"assignment_epoch":0,"dead":false,"partitions":{},"members":[]}'
    )
    assert decode_group(GID, encode_group(empty), 45_000, 200, 0).state is GroupState.EMPTY
    empty.dead = True
    assert decode_group(GID, encode_group(empty), 45_000, 200, 0).state is GroupState.DEAD


def test_reads_what_the_coordinator_wrote_before() -> None:
    group = make_group()
    old = json.dumps(group.to_dict()).encode()
    assert decode_group(GID, old, 45_000, 200, 0).to_dict() == group.to_dict()


def test_written_bytes_are_readable_by_from_dict() -> None:
    """A coordinator not yet upgraded (``from_dict(json.loads(raw))``) reads the new bytes."""
    group = make_group()
    back = ShareGroup.from_dict(GID, json.loads(encode_group(group)), 45_000, 200, 0)
    assert back.to_dict() == group.to_dict()


def test_unknown_fields_are_ignored() -> None:
    obj = {**make_group().to_dict(), "generation": {"x": [1]}}
    back = decode_group(GID, json.dumps(obj).encode(), 45_000, 200, 0)
    assert back.to_dict() == make_group().to_dict()


def group_obj(**changes: Any) -> dict[str, Any]:
    obj = make_group().to_dict()
    obj.update(changes)
    return obj


def raw(obj: Any) -> bytes:
    return json.dumps(obj).encode()


CORRUPTIONS: list[tuple[str, Any]] = [
    ("empty", b""),
    ("not JSON", b"{nope"),
    ("truncated", encode_group(make_group())[:-1]),
    ("not UTF-8", b"\xff\xfe"),
    ("JSON list", raw([1])),
    ("null", b"null"),
    ("no version", raw({k: v for k, v in group_obj().items() if k != "v"})),
    ("missing field", raw({k: v for k, v in group_obj().items() if k != "members"})),
    ("string epoch", raw(group_obj(group_epoch="2"))),
    ("negative epoch", raw(group_obj(assignment_epoch=-1))),
    ("huge epoch", raw(group_obj(group_epoch=2**64))),
    ("dead not bool", raw(group_obj(dead=0))),
    ("partitions not object", raw(group_obj(partitions=[1, 2]))),
    ("partition count string", raw(group_obj(partitions={"orders": "4"}))),
    ("member too short", raw(group_obj(members=[["m", 1, [], [], "c"]]))),
    ("member not list", raw(group_obj(members=[{"id": "m"}]))),
    ("member id int", raw(group_obj(members=[[1, 1, [], [], "", ""]]))),
    ("topics not list", raw(group_obj(members=[["m", 1, "orders", [], "", ""]]))),
    ("assignment pair", raw(group_obj(members=[["m", 1, [], [["orders"]], "", ""]]))),
    ("negative partition", raw(group_obj(members=[["m", 1, [], [["orders", -1]], "", ""]]))),
    ("deep nesting", b'{"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    ("not bytes", None),
]


@pytest.mark.parametrize(("what", "data"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupt_group_is_refused(what: str, data: Any) -> None:
    with pytest.raises(ShareGroupError) as info:
        decode_group(GID, data, 45_000, 200, 0)
    assert type(info.value) is ShareGroupError
    assert info.value.code is ErrorCode.CORRUPT_STATE
    message = str(info.value)
    assert repr(GID) in message
    assert "docs/operations.md" in message


def test_wrong_type_names_the_field() -> None:
    with pytest.raises(ShareGroupError, match=r"\$\.members\[0\]\[1\]"):
        decode_group(GID, raw(group_obj(members=[["m", "1", [], [], "", ""]])), 45_000, 200, 0)


@pytest.mark.parametrize("version", [0, 2, "1", None, True])
def test_unknown_version(version: object) -> None:
    for obj in (group_obj(v=version), {"v": version, "layout": "different"}):
        with pytest.raises(ShareGroupError) as info:
            decode_group(GID, raw(obj), 45_000, 200, 0)
        assert info.value.code is ErrorCode.CORRUPT_STATE
        message = str(info.value)
        assert f"version {version!r}" in message
        assert f"supports version {GROUP_FORMAT_VERSION}" in message
        assert "upgrade queueflow" in message
