"""Encoding of durable share-group metadata (the coordinator's table of :class:`ShareGroup`).

KIP-932 "Share group membership": the group coordinator persists each group's epochs,
subscribed-topic partition counts and members with their assignments, so that a new coordinator
takes the group over after a failover. The encoding is compact JSON, format version 1, read and
written with msgspec:

``{"v":1,"group_epoch":G,"assignment_epoch":A,"dead":false,"partitions":{"topic":N,...},
"members":[[member_id,member_epoch,[topic,...],[[topic,partition],...],client_id,host],...],
"assignor":"simple","member_meta":{member_id:[[assignor,...],rack_id],...}}``

``assignor`` (the assignor of the current assignment) and ``member_meta`` (the assignors each
member advertises and its rack, for members that advertise any) were added later without a
version bump: groups stored before them decode with ``simple`` and no advertised assignors,
and a queueflow that predates them ignores them (unknown fields are skipped).
"configs":{"share.delivery.count.limit":"3",...},"config_version":N,"added_partitions":{"topic":N}}``

``heartbeats`` (member id -> its last heartbeat, wall ms, as of the write; refreshed every
third of a session while members heartbeat) and ``session_timeout_ms`` (the group's effective
``share.session.timeout.ms`` then) were added later the same way, written only while the group
has members with a heartbeat time.

``configs`` (the group configs set with the admin, docs/operations.md "Group configs"),
``config_version`` and
``added_partitions`` (topic -> first partition added at runtime) are written only when set, so
a group without them encodes as before, and groups stored before them decode with none.

This is the layout of :meth:`ShareGroup.to_dict`, so groups the coordinator stored as
``json.dumps(group.to_dict())`` decode unchanged (whitespace and field order do not matter).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final

import msgspec

from queueflow.engine.assignors import DEFAULT_ASSIGNOR
from queueflow.engine.group import Member, ShareGroup
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.structs import TopicPartition

__all__ = ["GROUP_FORMAT_VERSION", "decode_group", "encode_group"]

#: Version of the encoding written by :func:`encode_group`.
GROUP_FORMAT_VERSION: Final = 1

_NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# [member_id, member_epoch, subscribed topics, assignment [[topic, partition], ...], client, host]
# (Sequence so that the engine's list[TopicPartition] encodes as is; decoding gives lists.)
_MemberRow = tuple[str, _NonNegative, tuple[str, ...], Sequence[tuple[str, _NonNegative]], str, str]


class _GroupRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The stored form; field order is the layout. ``v`` is read untyped so that an unknown
    version gets its own message."""

    v: Any = msgspec.UNSET
    group_epoch: _NonNegative
    assignment_epoch: _NonNegative
    dead: bool
    partitions: dict[str, _NonNegative]
    members: list[_MemberRow]
    assignor: str = DEFAULT_ASSIGNOR
    member_meta: dict[str, tuple[tuple[str, ...], str]] = msgspec.field(default_factory=dict)
    configs: dict[str, str] = msgspec.field(default_factory=dict)
    config_version: _NonNegative = 0
    added_partitions: dict[str, _NonNegative] = msgspec.field(default_factory=dict)
    heartbeats: dict[str, _NonNegative] = msgspec.field(default_factory=dict)
    session_timeout_ms: _NonNegative = 0


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(_GroupRecord)

_ADVICE = 'see docs/operations.md, "Corrupt state", for how to inspect and repair it'


def encode_group(group: ShareGroup) -> bytes:
    """Encode a group's durable metadata as compact JSON bytes (format version 1).

    The group id is not included: it is the table key. Each member's last heartbeat (wall ms)
    is stored as of the write (``heartbeats``); :func:`decode_group` gives a coordinator every
    member a fresh session all the same, and the admin reads them (``stored_sessions``).
    """
    heartbeats = {
        m.member_id: m.last_heartbeat_ms for m in group.members.values() if m.last_heartbeat_ms > 0
    }
    return _encoder.encode(
        _GroupRecord(
            v=GROUP_FORMAT_VERSION,
            group_epoch=group.group_epoch,
            assignment_epoch=group.assignment_epoch,
            dead=group.dead,
            partitions=group.partitions,
            members=[
                (
                    m.member_id,
                    m.member_epoch,
                    m.subscribed_topics,
                    m.assignment,
                    m.client_id,
                    m.host,
                )
                for m in group.members.values()
            ],
            assignor=group.assignor,
            member_meta={
                m.member_id: (m.assignors, m.rack_id)
                for m in group.members.values()
                if m.assignors or m.rack_id
            },
            configs=group.configs,
            config_version=group.config_version,
            added_partitions=group.added_partitions,
            heartbeats=heartbeats,
            session_timeout_ms=group.session_timeout_ms if heartbeats else 0,
        )
    )


def _corrupt(group_id: str, problem: str) -> ShareGroupError:
    return ShareGroupError(
        ErrorCode.CORRUPT_STATE,
        f"share group {group_id!r}: durable group metadata is corrupt ({problem}); {_ADVICE}",
    )


def _check_version(group_id: str, version: object) -> None:
    if version is msgspec.UNSET:
        raise _corrupt(group_id, "no format version field 'v'")
    if version != GROUP_FORMAT_VERSION or isinstance(version, bool):
        raise ShareGroupError(
            ErrorCode.CORRUPT_STATE,
            f"share group {group_id!r}: unknown group metadata format version {version!r} (this "
            f"queueflow supports version {GROUP_FORMAT_VERSION}); it was probably written by a "
            f"newer queueflow: upgrade queueflow, or {_ADVICE}",
        )


def decode_group(
    group_id: str,
    data: bytes,
    session_timeout_ms: int,
    max_size: int,
    now_ms: int,
    *,
    stored_sessions: bool = False,
) -> ShareGroup:
    """Rebuild a group from :func:`encode_group` bytes (or the older ``json.dumps(to_dict())``).

    Args:
        group_id: the share group id (the table key).
        data: the stored bytes.
        session_timeout_ms: ``group.share.session.timeout.ms``, in ms.
        max_size: ``group.share.max.size``.
        now_ms: current wall-clock time in ms; every member gets a fresh session starting then
            (members could not heartbeat while no coordinator ran).
        stored_sessions: instead, give each member its stored last heartbeat (0 if the
            record has none): the admin's view, which tells lapsed sessions.

    Raises:
        ShareGroupError: ``CORRUPT_STATE`` naming the group when ``data`` is not JSON, of an
            unknown format version, or holds a missing field, a field of the wrong type or a
            negative epoch or partition; the message says what to do.
    """
    if not isinstance(data, (bytes, bytearray, memoryview, str)):
        raise _corrupt(group_id, f"expected bytes, got {type(data).__name__}")
    try:
        record = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        _explain_failure(group_id, data)
        raise _corrupt(group_id, str(exc)) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        # UnicodeDecodeError: a string with invalid UTF-8 inside otherwise valid JSON.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise _corrupt(group_id, f"not JSON: {reason}") from None
    _check_version(group_id, record.v)
    group = ShareGroup(group_id, session_timeout_ms, max_size)
    group.group_epoch = record.group_epoch
    group.assignment_epoch = record.assignment_epoch
    group.dead = record.dead
    group.partitions = record.partitions
    group.configs = record.configs
    group.config_version = record.config_version
    group.added_partitions = record.added_partitions
    for member_id, epoch, topics, assignment, client_id, host in record.members:
        tps = [TopicPartition(topic, partition) for topic, partition in assignment]
        seen = record.heartbeats.get(member_id, 0) if stored_sessions else now_ms
        group.members[member_id] = Member(member_id, epoch, topics, tps, seen, client_id, host)
    group.heartbeats_stored_ms = max(record.heartbeats.values(), default=0)
    if stored_sessions and record.session_timeout_ms:
        group.session_timeout_ms = record.session_timeout_ms
    group.assignor = record.assignor
    for member_id, (names, rack) in record.member_meta.items():
        member = group.members.get(member_id)
        if member is not None:
            member.assignors, member.rack_id = tuple(names), rack
    return group


def _explain_failure(group_id: str, data: bytes | bytearray | memoryview | str) -> None:
    """Raise the version error when an unknown version is why typed decoding failed."""
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return
    if isinstance(obj, dict):
        _check_version(group_id, obj.get("v", msgspec.UNSET))
