"""Encoding of durable share-partition state (:mod:`queueflow.engine.state` records).

KIP-932 "Managing durable share-partition state": snapshots (``ShareSnapshot``) and deltas
(``ShareUpdate``) written to the state table and its changelog. The encoding is compact JSON
(format version 1, :data:`STATE_FORMAT_VERSION`) read and written with msgspec; the layout is
the one queueflow has always written, so state already on disk restores unchanged. Decoding
validates everything; any problem is a :class:`~queueflow.errors.CorruptStateError` naming the
share-partition and saying what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Final, TypeVar

import msgspec

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
    "decode_state",
    "decode_update",
    "delta_key",
    "encode_snapshot",
    "encode_update",
    "parse_state_key",
    "snapshot_key",
]

#: Version of the JSON encoding written by :func:`encode_snapshot` / :func:`encode_update`.
STATE_FORMAT_VERSION: Final = 1

_ADVICE = (
    "refusing to serve this share-partition; inspect the changelog record (docs/operations.md, "
    '"Corrupt state", says how to repair or reset it)'
)

_INT64_MAX = 2**63 - 1
# Kafka's schema types these int32/int64; bounding them keeps arbitrary-precision ints out.
_Epoch = Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
_LeaderEpoch = Annotated[int, msgspec.Meta(ge=-1, le=_INT64_MAX)]
_Offset = Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
_UpdateOffset = Annotated[int, msgspec.Meta(ge=-1, le=_INT64_MAX)]  # -1: unchanged
# [first, last, state, count]; ranges, states and order are checked in _batches() for messages
# that name the batch.
_Batch = tuple[int, int, int, int]

# `v` and `t` are read untyped so that a wrong version gets its own message (it was probably
# written by a newer queueflow) rather than a type error.


class _SnapshotRecord(msgspec.Struct, kw_only=True):
    """``{"v":1,"t":"snapshot","snapshot_epoch":E,"state_epoch":S,"leader_epoch":L,
    "start_offset":O,"batches":[[first,last,state,count],...]}`` (field order is the layout)."""

    v: Any = msgspec.UNSET
    t: Any = msgspec.UNSET
    snapshot_epoch: _Epoch
    state_epoch: _Epoch
    leader_epoch: _LeaderEpoch
    start_offset: _Offset
    batches: list[_Batch]


class _UpdateRecord(msgspec.Struct, kw_only=True):
    """``{"v":1,"t":"update","snapshot_epoch":E,"state_epoch":S,"delta_index":D,
    "start_offset":O,"reset":false,"batches":[[first,last,state,count],...]}``."""

    v: Any = msgspec.UNSET
    t: Any = msgspec.UNSET
    snapshot_epoch: _Epoch
    state_epoch: _Epoch
    delta_index: _Epoch
    start_offset: _UpdateOffset
    reset: bool = False
    batches: list[_Batch]


_Record = TypeVar("_Record", _SnapshotRecord, _UpdateRecord)

_encoder: Final = msgspec.json.Encoder()
_snapshot_decoder: Final = msgspec.json.Decoder(_SnapshotRecord)
_update_decoder: Final = msgspec.json.Decoder(_UpdateRecord)

# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _batches_to_wire(batches: Sequence[StateBatch]) -> list[_Batch]:
    out: list[_Batch] = []
    for b in batches:
        if b.state not in PERSISTED_STATES:
            raise ValueError(
                f"cannot persist batch {b.first_offset}..{b.last_offset} in state {b.state!r}: "
                "only Available, Acknowledged and Archived are persisted (KIP-932)"
            )
        out.append((int(b.first_offset), int(b.last_offset), int(b.state), int(b.delivery_count)))
    return out


def encode_snapshot(s: ShareSnapshot) -> bytes:
    """Encode a :class:`ShareSnapshot` as compact JSON bytes (format version 1).

    Layout: ``{"v":1,"t":"snapshot","snapshot_epoch":E,"state_epoch":S,"leader_epoch":L,
    "start_offset":O,"batches":[[first,last,state,count],...]}``.

    Raises:
        ValueError: a batch is in the ``ACQUIRED`` state, which is never persisted.
    """
    return _encoder.encode(
        _SnapshotRecord(
            v=STATE_FORMAT_VERSION,
            t="snapshot",
            snapshot_epoch=int(s.snapshot_epoch),
            state_epoch=int(s.state_epoch),
            leader_epoch=int(s.leader_epoch),
            start_offset=int(s.start_offset),
            batches=_batches_to_wire(s.batches),
        )
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
    return _encoder.encode(
        _UpdateRecord(
            v=STATE_FORMAT_VERSION,
            t="update",
            snapshot_epoch=int(snapshot_epoch),
            state_epoch=int(state_epoch),
            delta_index=int(delta_index),
            start_offset=int(u.start_offset),
            reset=bool(u.reset),
            batches=_batches_to_wire(u.batches),
        )
    )


# --------------------------------------------------------------------------------------------
# Decoding (validates everything; any problem is a CorruptStateError naming `where`)
# --------------------------------------------------------------------------------------------


def _corrupt(where: str, problem: str) -> CorruptStateError:
    return CorruptStateError(f"corrupt share-partition state for {where}: {problem}; {_ADVICE}")


def _check_header(version: object, t: object, where: str, kind: str) -> None:
    if version is msgspec.UNSET:
        raise _corrupt(where, f"the {kind} record has no format version field 'v'")
    if version != STATE_FORMAT_VERSION or isinstance(version, bool):
        raise CorruptStateError(
            f"unknown share-partition state format version {version!r} for {where} "
            f"(this queueflow supports version {STATE_FORMAT_VERSION}); it was probably written "
            f"by a newer queueflow: upgrade queueflow, or {_ADVICE}"
        )
    if t != kind:
        found = None if t is msgspec.UNSET else t
        raise _corrupt(where, f"expected record type 't'={kind!r}, found {found!r}")


def _explain_failure(data: bytes, where: str, kind: str, reason: str) -> CorruptStateError:
    """The error for a record that failed typed decoding: a wrong version or record type if that
    is the cause (a newer layout fails typed decoding first), else ``reason``."""
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return _corrupt(where, f"the {kind} record is invalid: {reason}")
    if not isinstance(obj, dict):
        return _corrupt(where, f"the {kind} record is a JSON {type(obj).__name__}, not an object")
    try:
        _check_header(obj.get("v", msgspec.UNSET), obj.get("t", msgspec.UNSET), where, kind)
    except CorruptStateError as exc:
        return exc
    return _corrupt(where, f"the {kind} record is invalid: {reason}")


def _load(data: bytes, where: str, kind: str, decoder: msgspec.json.Decoder[_Record]) -> _Record:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _corrupt(where, f"expected bytes, got {type(data).__name__}")
    try:
        record = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _explain_failure(bytes(data), where, kind, str(exc)) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise _corrupt(where, f"the {kind} record is not valid UTF-8 JSON ({reason})") from None
    _check_header(record.v, record.t, where, kind)
    return record


def _batches(raw: list[_Batch], where: str) -> tuple[StateBatch, ...]:
    out: list[StateBatch] = []
    prev_last = -1
    for i, (first, last, state, count) in enumerate(raw):
        if first < 0 or first > last or last > _INT64_MAX:
            raise _corrupt(where, f"batch #{i} has an invalid range {first}..{last}")
        if state not in (0, 2, 4):
            raise _corrupt(
                where,
                f"batch #{i} ({first}..{last}) has state {state}; persisted states are "
                "0 (Available), 2 (Acknowledged) and 4 (Archived)",
            )
        if count < 0 or count > _INT64_MAX:
            raise _corrupt(where, f"batch #{i} ({first}..{last}) has delivery count {count}")
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

    Unknown fields are ignored.

    Args:
        data: the encoded record.
        where: names the share-partition for error messages, e.g. ``"group=G topic=T partition=P"``.

    Raises:
        CorruptStateError: the bytes are not valid JSON, are of an unknown format version, are
            not a snapshot, or hold invalid fields (a missing field, a field of the wrong type,
            negative offsets or counts, a state other than 0/2/4, ``first > last``, unordered or
            overlapping batches). The message names ``where``, the problem and what to do.
    """
    record = _load(data, where, "snapshot", _snapshot_decoder)
    return ShareSnapshot(
        snapshot_epoch=record.snapshot_epoch,
        state_epoch=record.state_epoch,
        leader_epoch=record.leader_epoch,
        start_offset=record.start_offset,
        batches=_batches(record.batches, where),
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
    record = _load(data, where, "update", _update_decoder)
    update = ShareUpdate(
        start_offset=record.start_offset,
        batches=_batches(record.batches, where),
        reset=record.reset,
    )
    return update, record.snapshot_epoch, record.state_epoch, record.delta_index


# --------------------------------------------------------------------------------------------
# Table keys, and a share-partition's snapshot with its deltas
# --------------------------------------------------------------------------------------------


def snapshot_key(group: str, partition: int) -> bytes:
    """Table key of a share-partition's snapshot: ``S/<group>/<partition>``."""
    return f"S/{group}/{partition}".encode()


def delta_key(
    group: str, partition: int, state_epoch: int, snapshot_epoch: int, index: int
) -> bytes:
    """Table key of one delta: unique per (state epoch, snapshot epoch, index), so compaction
    keeps it and two leaders (two state epochs) never write the same key."""
    return f"D/{group}/{partition}/{state_epoch:010d}/{snapshot_epoch:010d}/{index:06d}".encode()


def parse_state_key(key: bytes) -> tuple[str, str, int, tuple[int, int, int] | None]:
    """``(kind, group, partition, (state epoch, snapshot epoch, index) or None)`` of a table key
    written by :func:`snapshot_key` (kind ``"S"``) or :func:`delta_key` (kind ``"D"``).

    Raises:
        ValueError: the key is of neither form.
    """
    text = key.decode()
    if text.startswith("S/"):
        group, partition = text[2:].rsplit("/", 1)
        return "S", group, int(partition), None
    if text.startswith("D/"):
        group, partition, state_epoch, snapshot_epoch, index = text[2:].rsplit("/", 4)
        return "D", group, int(partition), (int(state_epoch), int(snapshot_epoch), int(index))
    raise ValueError(f"{key!r} is neither S/<group>/<partition> nor D/<group>/<partition>/...")


def decode_state(
    snapshot: bytes,
    delta: Callable[[int, int, int], bytes | None],
    *,
    where: str,
) -> tuple[ShareSnapshot, list[ShareUpdate]]:
    """A share-partition's snapshot and the deltas that follow it, as a leader restores them
    (KIP-932 "Managing durable share-partition state"): the deltas stored under the snapshot's
    (state epoch, snapshot epoch), index 0, 1, ... up to the first missing one. Deltas of other
    epochs (a fenced leader's late writes, superseded ones) are not read.

    Args:
        snapshot: the encoded snapshot.
        delta: ``delta(state_epoch, snapshot_epoch, index)`` returns the encoded delta stored
            under that key, or None.
        where: names the share-partition for error messages.

    Returns:
        ``(snapshot, updates)``, ready for :func:`queueflow.engine.state.replay`.

    Raises:
        CorruptStateError: a record is corrupt or of an unknown version, or a delta's own epochs
            differ from those of the key it is stored under.
    """
    decoded = decode_snapshot(snapshot, where=where)
    epochs = (decoded.state_epoch, decoded.snapshot_epoch)
    updates: list[ShareUpdate] = []
    index = 0
    while (raw := delta(*epochs, index)) is not None:
        update, snapshot_epoch, state_epoch, _index = decode_update(raw, where=where)
        if (state_epoch, snapshot_epoch) != epochs:
            raise CorruptStateError(
                f"corrupt share-partition state for {where}: the delta stored under state epoch "
                f"{epochs[0]}, snapshot epoch {epochs[1]}, index {index} says state epoch "
                f"{state_epoch}, snapshot epoch {snapshot_epoch}; {_ADVICE}"
            )
        updates.append(update)
        index += 1
    return decoded, updates
