"""Encoding of durable share-partition state (:mod:`queueflow.engine.state` records).

KIP-932 "Managing durable share-partition state": snapshots (``ShareSnapshot``) and deltas
(``ShareUpdate``) written to the state table and its changelog. Decoding validates everything;
any problem is a :class:`~queueflow.errors.CorruptStateError` naming the share-partition.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from queueflow.engine.state import (
    PERSISTED_STATES,
    RecordState,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
)
from queueflow.errors import CorruptStateError

__all__ = [
    "STATE_FORMAT_VERSION",
    "decode_snapshot",
    "decode_update",
    "encode_snapshot",
    "encode_update",
]

#: Version of the JSON encoding written by :func:`encode_snapshot` / :func:`encode_update`.
STATE_FORMAT_VERSION = 1

# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------

_ADVICE = (
    "refusing to serve this share-partition; inspect the changelog record (docs/operations.md, "
    '"Corrupt state", says how to repair or reset it)'
)


def _batches_to_json(batches: Sequence[StateBatch]) -> list[list[int]]:
    out: list[list[int]] = []
    for b in batches:
        if b.state not in PERSISTED_STATES:
            raise ValueError(
                f"cannot persist batch {b.first_offset}..{b.last_offset} in state {b.state!r}: "
                "only Available, Acknowledged and Archived are persisted (KIP-932)"
            )
        out.append([int(b.first_offset), int(b.last_offset), int(b.state), int(b.delivery_count)])
    return out


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def encode_snapshot(s: ShareSnapshot) -> bytes:
    """Encode a :class:`ShareSnapshot` as compact JSON bytes (format version 1).

    Layout: ``{"v":1,"t":"snapshot","snapshot_epoch":E,"state_epoch":S,"leader_epoch":L,
    "start_offset":O,"batches":[[first,last,state,count],...]}``.

    Raises:
        ValueError: a batch is in the ``ACQUIRED`` state, which is never persisted.
    """
    return _dumps(
        {
            "v": STATE_FORMAT_VERSION,
            "t": "snapshot",
            "snapshot_epoch": int(s.snapshot_epoch),
            "state_epoch": int(s.state_epoch),
            "leader_epoch": int(s.leader_epoch),
            "start_offset": int(s.start_offset),
            "batches": _batches_to_json(s.batches),
        }
    )


def encode_update(
    u: ShareUpdate, *, snapshot_epoch: int, state_epoch: int, delta_index: int
) -> bytes:
    """Encode a :class:`ShareUpdate` as compact JSON bytes (format version 1).

    Args:
        u: the update, as returned by ``SharePartition.take_changes()``.
        snapshot_epoch: epoch of the snapshot this update follows.
        state_epoch: state epoch of the share-partition.
        delta_index: position of this update after its snapshot (0, 1, ...).

    Layout: ``{"v":1,"t":"update","snapshot_epoch":E,"state_epoch":S,"delta_index":D,
    "start_offset":O,"reset":false,"batches":[[first,last,state,count],...]}``.

    Raises:
        ValueError: a batch is in the ``ACQUIRED`` state, which is never persisted.
    """
    return _dumps(
        {
            "v": STATE_FORMAT_VERSION,
            "t": "update",
            "snapshot_epoch": int(snapshot_epoch),
            "state_epoch": int(state_epoch),
            "delta_index": int(delta_index),
            "start_offset": int(u.start_offset),
            "reset": bool(u.reset),
            "batches": _batches_to_json(u.batches),
        }
    )


# --------------------------------------------------------------------------------------------
# Decoding (validates everything; any problem is a CorruptStateError naming `where`)
# --------------------------------------------------------------------------------------------


def _corrupt(where: str, problem: str) -> CorruptStateError:
    return CorruptStateError(f"corrupt share-partition state for {where}: {problem}; {_ADVICE}")


def _load(data: bytes, where: str, kind: str) -> dict[str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _corrupt(where, f"expected bytes, got {type(data).__name__}")
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _corrupt(where, f"the {kind} record is not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise _corrupt(where, f"the {kind} record is a JSON {type(obj).__name__}, not an object")
    if "v" not in obj:
        raise _corrupt(where, f"the {kind} record has no format version field 'v'")
    version = obj["v"]
    if version != STATE_FORMAT_VERSION or isinstance(version, bool):
        raise CorruptStateError(
            f"unknown share-partition state format version {version!r} for {where} "
            f"(this queueflow supports version {STATE_FORMAT_VERSION}); it was probably written "
            f"by a newer queueflow: upgrade queueflow, or {_ADVICE}"
        )
    if obj.get("t") != kind:
        raise _corrupt(where, f"expected record type 't'={kind!r}, found {obj.get('t')!r}")
    return obj


def _int_field(obj: dict[str, Any], name: str, where: str, minimum: int) -> int:
    if name not in obj:
        raise _corrupt(where, f"missing field {name!r}")
    value = obj[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise _corrupt(where, f"field {name!r} must be an integer, found {value!r}")
    if value < minimum:
        raise _corrupt(where, f"field {name!r} must be >= {minimum}, found {value}")
    return value


def _batches_field(obj: dict[str, Any], where: str) -> tuple[StateBatch, ...]:
    if "batches" not in obj:
        raise _corrupt(where, "missing field 'batches'")
    raw = obj["batches"]
    if not isinstance(raw, list):
        raise _corrupt(where, f"field 'batches' must be a list, found {type(raw).__name__}")
    out: list[StateBatch] = []
    prev_last = -1
    for i, item in enumerate(raw):
        if (
            not isinstance(item, list)
            or len(item) != 4
            or any(not isinstance(x, int) or isinstance(x, bool) for x in item)
        ):
            raise _corrupt(
                where,
                f"batch #{i} must be a list [first, last, state, count] of integers, "
                f"found {item!r}",
            )
        first, last, state, count = item
        if first < 0 or first > last:
            raise _corrupt(where, f"batch #{i} has an invalid range {first}..{last}")
        if state not in (0, 2, 4):
            raise _corrupt(
                where,
                f"batch #{i} ({first}..{last}) has state {state}; persisted states are "
                "0 (Available), 2 (Acknowledged) and 4 (Archived)",
            )
        if count < 0:
            raise _corrupt(where, f"batch #{i} ({first}..{last}) has delivery count {count} < 0")
        if first <= prev_last:
            raise _corrupt(
                where,
                f"batch #{i} ({first}..{last}) overlaps or precedes the previous batch "
                f"(which ends at {prev_last}); batches must be ordered and non-overlapping",
            )
        prev_last = last
        out.append(StateBatch(first, last, RecordState(state), count))
    return tuple(out)


def decode_snapshot(data: bytes, *, where: str) -> ShareSnapshot:
    """Decode and validate bytes written by :func:`encode_snapshot`.

    Args:
        data: the encoded record.
        where: names the share-partition for error messages, e.g. ``"group=G topic=T partition=P"``.

    Raises:
        CorruptStateError: the bytes are not valid JSON, are of an unknown format version, are
            not a snapshot, or hold invalid fields (negative offsets or counts, a state other than
            0/2/4, ``first > last``, unordered or overlapping batches). The message names
            ``where``, the problem and what to do.
    """
    obj = _load(data, where, "snapshot")
    return ShareSnapshot(
        snapshot_epoch=_int_field(obj, "snapshot_epoch", where, 0),
        state_epoch=_int_field(obj, "state_epoch", where, 0),
        leader_epoch=_int_field(obj, "leader_epoch", where, -1),
        start_offset=_int_field(obj, "start_offset", where, 0),
        batches=_batches_field(obj, where),
    )


def decode_update(data: bytes, *, where: str) -> tuple[ShareUpdate, int, int, int]:
    """Decode and validate bytes written by :func:`encode_update`.

    Args:
        data: the encoded record.
        where: names the share-partition for error messages, e.g. ``"group=G topic=T partition=P"``.

    Returns:
        ``(update, snapshot_epoch, state_epoch, delta_index)``.

    Raises:
        CorruptStateError: as for :func:`decode_snapshot`; also a non-boolean ``reset`` or a
            ``start_offset`` below -1.
    """
    obj = _load(data, where, "update")
    snapshot_epoch = _int_field(obj, "snapshot_epoch", where, 0)
    state_epoch = _int_field(obj, "state_epoch", where, 0)
    delta_index = _int_field(obj, "delta_index", where, 0)
    start_offset = _int_field(obj, "start_offset", where, -1)
    reset = obj.get("reset", False)
    if not isinstance(reset, bool):
        raise _corrupt(where, f"field 'reset' must be true or false, found {reset!r}")
    update = ShareUpdate(start_offset=start_offset, batches=_batches_field(obj, where), reset=reset)
    return update, snapshot_epoch, state_epoch, delta_index
