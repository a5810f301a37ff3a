"""Encoding of durable share-partition state (:mod:`queueflow.engine.state` records).

KIP-932 "Managing durable share-partition state": snapshots (``ShareSnapshot``) and deltas
(``ShareUpdate``) written to the state table and its changelog. Two formats, told apart by each
value's first byte, so a share-partition may hold values of both (a version 1 snapshot followed by
version 2 deltas after an upgrade):

* **version 2** (written by :func:`encode_snapshot` / :func:`encode_update`): compact binary,
  little-endian, packed with :mod:`struct`; the layout is under :data:`STATE_FORMAT_VERSION`.
* **version 3**: version 2 plus a lock section, written when a value holds Acquired batches
  (acquisition locks with their owner and deadline, see :data:`STATE_FORMAT_LOCKS_VERSION`).
  A value without locks is still written as version 2, so a queueflow that only reads version 2
  can read it.
* **version 1**: compact JSON read and written with msgspec, the layout queueflow wrote before
  version 2. It is still read, so state already on disk restores unchanged;
  :func:`encode_snapshot_v1` / :func:`encode_update_v1` write it for tests and tools only.

Decoding validates everything; any problem is a :class:`~queueflow.errors.CorruptStateError`
naming the share-partition, what was wrong, and what to do.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Final, TypeVar

import msgspec

from queueflow.engine.key_order import ParkedKey
from queueflow.engine.state import (
    PERSISTED_STATES,
    RecordState,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
)
from queueflow.errors import CorruptStateError

__all__ = [
    "STATE_FORMAT_JSON_VERSION",
    "STATE_FORMAT_LOCKS_VERSION",
    "STATE_FORMAT_VERSION",
    "ack_position_key",
    "decode_parked_keys",
    "decode_request_position",
    "decode_snapshot",
    "decode_state",
    "decode_update",
    "delta_key",
    "encode_parked_keys",
    "encode_request_position",
    "encode_snapshot",
    "encode_snapshot_v1",
    "encode_update",
    "encode_update_v1",
    "parked_keys_key",
    "parse_state_key",
    "request_position_key",
    "snapshot_key",
]

#: Version of the binary encoding written by :func:`encode_snapshot` / :func:`encode_update`.
#:
#: Layout (little-endian; every value is one snapshot or one delta)::
#:
#:     offset  size  field
#:          0     1  magic 0xF5 (never in UTF-8 text, so no version 1 JSON value starts with it)
#:          1     1  format version: 2
#:          2     1  record type: 0x53 "S" snapshot, 0x55 "U" update (delta)
#:          3     1  flags: bit 0 reset (updates only), bit 1 wide runs; other bits 0
#:          4     8  snapshot epoch                                   int64, >= 0
#:         12     8  state epoch                                      int64, >= 0
#:         20     8  snapshot: leader epoch (>= -1); update: delta index (>= 0)   int64
#:         28     8  start offset (SPSO; -1 = unchanged, updates only)  int64
#:         36     8  base: first offset of the first run, 0 if none   int64, >= 0
#:         44     4  run count n                                      uint32
#:         48     -  n runs, each: first - base, last - first, state, delivery count
#:                   narrow (13 bytes): uint32, uint32, uint8, int32
#:                   wide   (21 bytes): int64,  int64,  uint8, int32  (flag bit 1)
#:        end     4  CRC-32 (zlib.crc32) of every byte before it       uint32
#:
#: Runs are narrow unless an offset is 2**32 or more past the base. States are 0 Available,
#: 2 Acknowledged, 4 Archived (and 1 Acquired in version 3).
STATE_FORMAT_VERSION: Final = 2

#: Version of a binary value that holds Acquired batches: the version 2 layout with the version
#: byte 3 and, between the runs and the CRC, a lock section for the runs in state 1 (Acquired)::
#:
#:     size  field
#:        2  member count m                                          uint16
#:        -  m member ids, each: byte length (uint16), UTF-8 bytes
#:        -  one lock per Acquired run, in run order:
#:           member index (uint16, into the ids above), lock deadline (int64, wall-clock ms)
STATE_FORMAT_LOCKS_VERSION: Final = 3

#: Version of the JSON encoding queueflow wrote before version 2 (still read):
#: :func:`encode_snapshot_v1` / :func:`encode_update_v1`.
STATE_FORMAT_JSON_VERSION: Final = 1

_SUPPORTED = (
    f"this queueflow supports version {STATE_FORMAT_JSON_VERSION} as JSON and versions "
    f"{STATE_FORMAT_VERSION} and {STATE_FORMAT_LOCKS_VERSION} as binary"
)

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
_Buffer = bytes | bytearray | memoryview

_encoder: Final = msgspec.json.Encoder()
_snapshot_decoder: Final = msgspec.json.Decoder(_SnapshotRecord)
_update_decoder: Final = msgspec.json.Decoder(_UpdateRecord)

# --------------------------------------------------------------------------------------------
# Encoding, version 2 (binary; see STATE_FORMAT_VERSION for the layout)
# --------------------------------------------------------------------------------------------

_MAGIC: Final = 0xF5
_SNAPSHOT_TYPE: Final = 0x53  # "S"
_UPDATE_TYPE: Final = 0x55  # "U"
_TYPE_NAMES: Final = {_SNAPSHOT_TYPE: "snapshot", _UPDATE_TYPE: "update"}
_FLAG_RESET: Final = 0x01
_FLAG_WIDE: Final = 0x02
# magic, version, record type, flags, snapshot epoch, state epoch, leader epoch or delta index,
# start offset, base, run count
_HEADER: Final = struct.Struct("<BBBBqqqqqI")
# first - base, last - first, state, delivery count
_NARROW_RUN: Final = struct.Struct("<IIBi")
_WIDE_RUN: Final = struct.Struct("<qqBi")
_CRC: Final = struct.Struct("<I")
_U16: Final = struct.Struct("<H")
_LOCK: Final = struct.Struct("<Hq")  # member index, lock deadline (ms)
_ACQUIRED_VALUE: Final = int(RecordState.ACQUIRED)
_PERSISTED_VALUES: Final = frozenset(int(s) for s in PERSISTED_STATES)
_LOCKED_VALUES: Final = _PERSISTED_VALUES | {_ACQUIRED_VALUE}
_STATE_OF: Final = {int(s): RecordState(s) for s in PERSISTED_STATES}
_STATE_OF_LOCKED: Final = {**_STATE_OF, _ACQUIRED_VALUE: RecordState.ACQUIRED}
_INT32_MAX = 2**31 - 1
_INT64_MIN = -(2**63)


def _not_persisted(b: StateBatch) -> ValueError:
    return ValueError(
        f"cannot persist batch {b.first_offset}..{b.last_offset} in state {b.state!r}: "
        "only Available, Acknowledged and Archived are persisted as such (KIP-932), and "
        "Acquired only with its lock (a member id and a deadline >= 0)"
    )


def _lock_section(batches: Sequence[StateBatch]) -> bytes:
    """The version 3 lock section of ``batches`` (see :data:`STATE_FORMAT_LOCKS_VERSION`).

    Raises:
        ValueError: an Acquired batch without a lock, or more than 65,535 members.
    """
    members: dict[str, int] = {}
    locks = bytearray()
    for b in batches:
        if b.state is not RecordState.ACQUIRED:
            continue
        member, deadline = b.member_id, b.lock_deadline_ms
        if not member or deadline is None or not 0 <= deadline <= _INT64_MAX:
            raise _not_persisted(b)
        index = members.setdefault(member, len(members))
        if index > 0xFFFF:
            raise ValueError("cannot encode state: more than 65,535 members hold locks")
        locks += _LOCK.pack(index, deadline)
    names = bytearray(_U16.pack(len(members)))
    for member in members:
        raw = member.encode()
        if len(raw) > 0xFFFF:
            raise ValueError(f"cannot encode state: member id of {len(raw)} bytes (max 65,535)")
        names += _U16.pack(len(raw)) + raw
    return bytes(names + locks)


def _pack(
    run: struct.Struct,
    record_type: int,
    flags: int,
    fields: tuple[int, int, int, int],
    batches: Sequence[StateBatch],
) -> bytes:
    """One version 2 value with runs of layout ``run``; struct.error if a value does not fit."""
    n = len(batches)
    base = batches[0].first_offset if n else 0
    size = run.size
    header = _HEADER.size
    buf = bytearray(header + size * n + _CRC.size)
    _HEADER.pack_into(buf, 0, _MAGIC, STATE_FORMAT_VERSION, record_type, flags, *fields, base, n)
    pack_into = run.pack_into
    pos = header
    for b in batches:
        first = b.first_offset
        pack_into(buf, pos, first - base, b.last_offset - first, b.state, b.delivery_count)
        pos += size
    # The state bytes (each just before a run's int32 count), read back at C speed: cheaper
    # than a check per batch in the loop above.
    states = frozenset(buf[header + size - 5 : pos : size])
    if not _PERSISTED_VALUES.issuperset(states):
        if not _LOCKED_VALUES.issuperset(states):
            raise next(_not_persisted(b) for b in batches if b.state not in _STATE_OF_LOCKED)
        # Acquired batches: version 3, with their locks between the runs and the CRC.
        buf[1] = STATE_FORMAT_LOCKS_VERSION
        buf[pos:] = _lock_section(batches) + bytes(_CRC.size)
        pos = len(buf) - _CRC.size
    _CRC.pack_into(buf, pos, zlib.crc32(memoryview(buf)[:pos]))
    return bytes(buf)


def _unencodable(
    record_type: int,
    fields: tuple[int, int, int, int],
    batches: Sequence[StateBatch],
    exc: struct.error,
) -> ValueError:
    """Why a record does not fit version 2 (the message names the field or batch)."""
    third = "leader epoch" if record_type == _SNAPSHOT_TYPE else "delta index"
    names = ("snapshot epoch", "state epoch", third, "start offset")
    for name, value in zip(names, fields, strict=True):
        if not (isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX):
            return ValueError(f"cannot encode state: {name} {value!r} is not an int64")
    for b in batches:
        if b.state not in _STATE_OF_LOCKED.values():
            return _not_persisted(b)
        if not (
            isinstance(b.delivery_count, int) and -_INT32_MAX - 1 <= b.delivery_count <= _INT32_MAX
        ):
            return ValueError(
                f"cannot encode batch {b.first_offset}..{b.last_offset}: delivery count "
                f"{b.delivery_count!r} is not an int32"
            )
    return ValueError(
        f"cannot encode state: a batch's offsets do not fit int64 relative to the first batch "
        f"(batches must be ordered, with offsets from 0 to 2**63 - 1): {exc}"
    )


def _encode_v2(
    record_type: int, flags: int, fields: tuple[int, int, int, int], batches: Sequence[StateBatch]
) -> bytes:
    if batches and (batches[0].first_offset < 0 or batches[-1].last_offset > _INT64_MAX):
        b = batches[0] if batches[0].first_offset < 0 else batches[-1]
        raise ValueError(
            f"cannot encode batch {b.first_offset}..{b.last_offset}: offsets are 0 to 2**63 - 1"
        )
    try:
        return _pack(_NARROW_RUN, record_type, flags, fields, batches)
    except struct.error:
        pass  # an offset 2**32 or more past the base, or a value that fits nothing
    try:
        return _pack(_WIDE_RUN, record_type, flags | _FLAG_WIDE, fields, batches)
    except struct.error as exc:
        raise _unencodable(record_type, fields, batches, exc) from None


def encode_snapshot(s: ShareSnapshot) -> bytes:
    """Encode a :class:`ShareSnapshot` as format version 2 (binary, :data:`STATE_FORMAT_VERSION`).

    Args:
        s: the snapshot; its batches ordered and non-overlapping, offsets in ``0..2**63-1``.

    Returns:
        ``52 + 13 * len(s.batches)`` bytes (21 per batch if an offset is 2**32 or more past
        the first batch's first offset); with Acquired batches, version 3: plus the lock
        section (10 bytes per Acquired batch and each distinct member id once).

    Raises:
        ValueError: an ``ACQUIRED`` batch without a lock (member id and deadline); a delivery
            count does not fit an int32; an epoch or offset does not fit an int64.
    """
    return _encode_v2(
        _SNAPSHOT_TYPE,
        0,
        (s.snapshot_epoch, s.state_epoch, s.leader_epoch, s.start_offset),
        s.batches,
    )


def encode_update(
    u: ShareUpdate, *, snapshot_epoch: int, state_epoch: int, delta_index: int
) -> bytes:
    """Encode a :class:`ShareUpdate` (a delta) as format version 2 (binary,
    :data:`STATE_FORMAT_VERSION`).

    Args:
        u: the update, as returned by ``SharePartition.take_changes()``; its batches ordered and
            non-overlapping, offsets in ``0..2**63-1``; ``start_offset`` -1 means unchanged.
        snapshot_epoch: epoch of the snapshot this update follows.
        state_epoch: state epoch of the share-partition.
        delta_index: position of this update after its snapshot (0, 1, ...).

    Returns:
        ``52 + 13 * len(u.batches)`` bytes (21 per batch if an offset is 2**32 or more past
        the first batch's first offset), plus the lock section as for :func:`encode_snapshot`.

    Raises:
        ValueError: as for :func:`encode_snapshot`.
    """
    return _encode_v2(
        _UPDATE_TYPE,
        _FLAG_RESET if u.reset else 0,
        (snapshot_epoch, state_epoch, delta_index, u.start_offset),
        u.batches,
    )


# --------------------------------------------------------------------------------------------
# Encoding, version 1 (JSON; tests and tools only)
# --------------------------------------------------------------------------------------------


def _batches_to_wire(batches: Sequence[StateBatch]) -> list[_Batch]:
    out: list[_Batch] = []
    for b in batches:
        if b.state not in PERSISTED_STATES:
            raise _not_persisted(b)
        out.append((int(b.first_offset), int(b.last_offset), int(b.state), int(b.delivery_count)))
    return out


def encode_snapshot_v1(s: ShareSnapshot) -> bytes:
    """Encode a :class:`ShareSnapshot` as compact JSON bytes (format version 1).

    For tests and tools only: queueflow writes version 2 (:func:`encode_snapshot`), and reads
    both.

    Layout: ``{"v":1,"t":"snapshot","snapshot_epoch":E,"state_epoch":S,"leader_epoch":L,
    "start_offset":O,"batches":[[first,last,state,count],...]}``.

    Raises:
        ValueError: a batch is in the ``ACQUIRED`` state (version 1 has no locks).
    """
    return _encoder.encode(
        _SnapshotRecord(
            v=STATE_FORMAT_JSON_VERSION,
            t="snapshot",
            snapshot_epoch=int(s.snapshot_epoch),
            state_epoch=int(s.state_epoch),
            leader_epoch=int(s.leader_epoch),
            start_offset=int(s.start_offset),
            batches=_batches_to_wire(s.batches),
        )
    )


def encode_update_v1(
    u: ShareUpdate, *, snapshot_epoch: int, state_epoch: int, delta_index: int
) -> bytes:
    """Encode a :class:`ShareUpdate` as compact JSON bytes (format version 1).

    For tests and tools only: queueflow writes version 2 (:func:`encode_update`), and reads
    both.

    Args:
        u: the update, as returned by ``SharePartition.take_changes()``.
        snapshot_epoch: epoch of the snapshot this update follows.
        state_epoch: state epoch of the share-partition.
        delta_index: position of this update after its snapshot (0, 1, ...).

    Layout: ``{"v":1,"t":"update","snapshot_epoch":E,"state_epoch":S,"delta_index":D,
    "start_offset":O,"reset":false,"batches":[[first,last,state,count],...]}``.

    Raises:
        ValueError: a batch is in the ``ACQUIRED`` state (version 1 has no locks).
    """
    return _encoder.encode(
        _UpdateRecord(
            v=STATE_FORMAT_JSON_VERSION,
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


def _unknown_version(version: object, where: str, binary: bool = False) -> CorruptStateError:
    layout = " (binary)" if binary else ""
    return CorruptStateError(
        f"unknown share-partition state format version {version!r}{layout} for {where} "
        f"({_SUPPORTED}); it was probably written by a newer queueflow: upgrade queueflow, "
        f"or {_ADVICE}"
    )


def _batch_problem(
    i: int,
    first: int,
    last: int,
    state: int,
    count: int,
    prev_last: int,
    where: str,
    locked: bool = False,
) -> CorruptStateError | None:
    """What is wrong with batch #``i`` (after a batch ending at ``prev_last``), if anything."""
    if first < 0 or first > last or last > _INT64_MAX:
        return _corrupt(where, f"batch #{i} has an invalid range {first}..{last}")
    if state not in (_LOCKED_VALUES if locked else _PERSISTED_VALUES):
        return _corrupt(
            where,
            f"batch #{i} ({first}..{last}) has state {state}; persisted states are "
            "0 (Available), 2 (Acknowledged) and 4 (Archived), and 1 (Acquired) in format "
            f"version {STATE_FORMAT_LOCKS_VERSION}",
        )
    if count < 0 or count > _INT64_MAX:
        return _corrupt(where, f"batch #{i} ({first}..{last}) has delivery count {count}")
    if first <= prev_last:
        return _corrupt(
            where,
            f"batch #{i} ({first}..{last}) overlaps or precedes the previous batch "
            f"(which ends at {prev_last}); batches must be ordered and non-overlapping",
        )
    return None


def _check_header(version: object, t: object, where: str, kind: str) -> None:
    if version is msgspec.UNSET:
        raise _corrupt(where, f"the {kind} record has no format version field 'v'")
    if version != STATE_FORMAT_JSON_VERSION or isinstance(version, bool):
        raise _unknown_version(version, where)
    if t != kind:
        found = None if t is msgspec.UNSET else t
        raise _corrupt(where, f"expected record type 't'={kind!r}, found {found!r}")


def _explain_failure(data: bytes, where: str, kind: str, reason: str) -> CorruptStateError:
    """The error for a record that failed typed decoding: a wrong version or record type if that
    is the cause (a newer layout fails typed decoding first), else ``reason``."""
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return _corrupt(where, f"the {kind} record is invalid: {reason}")
    if not isinstance(obj, dict):
        return _corrupt(where, f"the {kind} record is a JSON {type(obj).__name__}, not an object")
    try:
        _check_header(obj.get("v", msgspec.UNSET), obj.get("t", msgspec.UNSET), where, kind)
    except CorruptStateError as exc:
        return exc
    return _corrupt(where, f"the {kind} record is invalid: {reason}")


def _load(data: _Buffer, where: str, kind: str, decoder: msgspec.json.Decoder[_Record]) -> _Record:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _corrupt(where, f"expected bytes, got {type(data).__name__}")
    try:
        record = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _explain_failure(bytes(data), where, kind, str(exc)) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise _corrupt(where, f"the {kind} record is not valid UTF-8 JSON ({reason})") from None
    _check_header(record.v, record.t, where, kind)
    return record


def _batches(raw: list[_Batch], where: str) -> tuple[StateBatch, ...]:
    out: list[StateBatch] = []
    prev_last = -1
    for i, (first, last, state, count) in enumerate(raw):
        problem = _batch_problem(i, first, last, state, count, prev_last, where)
        if problem is not None:
            raise problem
        prev_last = last
        out.append(StateBatch(first, last, _STATE_OF[state], count))
    return tuple(out)


def _is_v2(data: object) -> bool:
    """Whether ``data`` is a version 2 value (else it is read as version 1 JSON)."""
    return isinstance(data, (bytes, bytearray, memoryview)) and data[:1] == b"\xf5"


def _load_v2(
    data: _Buffer, where: str, kind: str
) -> tuple[int, int, int, int, tuple[StateBatch, ...], bool]:
    """Check a version 2 value and unpack it: ``(snapshot epoch, state epoch, leader epoch or
    delta index, start offset, batches, reset)``."""
    view = memoryview(data).cast("B")
    size = len(view)
    minimum = _HEADER.size + _CRC.size
    if size < minimum:
        if size >= 2 and view[1] not in (STATE_FORMAT_VERSION, STATE_FORMAT_LOCKS_VERSION):
            raise _unknown_version(view[1], where, binary=True)
        raise _corrupt(
            where,
            f"the {kind} record is truncated: {size} bytes, less than the {minimum} of an empty "
            f"format version {STATE_FORMAT_VERSION} record",
        )
    _magic, version, record_type, flags, a, b, c, start, base, n = _HEADER.unpack_from(view)
    locked = version == STATE_FORMAT_LOCKS_VERSION
    if version != STATE_FORMAT_VERSION and not locked:
        raise _unknown_version(version, where, binary=True)
    run = _WIDE_RUN if flags & _FLAG_WIDE else _NARROW_RUN
    end = _HEADER.size + run.size * n
    acquired = 0
    body_end = end  # where the CRC starts
    if locked and size >= end:
        acquired = bytes(view[_HEADER.size + run.size - 5 : end : run.size]).count(_ACQUIRED_VALUE)
        body_end = _locks_end(view, end, acquired)
    if size != body_end + _CRC.size:
        how = "truncated" if size < body_end + _CRC.size else "followed by extra bytes"
        raise _corrupt(
            where,
            f"the {kind} record is {size} bytes long, but its header says {n} "
            f"{'wide' if run is _WIDE_RUN else 'narrow'} runs, {end + _CRC.size} bytes: it is "
            f"{how} (or its header is damaged)",
        )
    (stored,) = _CRC.unpack_from(view, body_end)
    computed = zlib.crc32(view[:body_end])
    if stored != computed:
        raise _corrupt(
            where,
            f"the {kind} record fails its CRC-32 check (stored {stored:#010x}, computed "
            f"{computed:#010x}): its bytes were altered",
        )
    expected = _SNAPSHOT_TYPE if kind == "snapshot" else _UPDATE_TYPE
    if record_type != expected:
        found = _TYPE_NAMES.get(record_type, f"unknown type {record_type:#04x}")
        raise _corrupt(where, f"expected a {kind} record, found {found!r}")
    allowed = _FLAG_WIDE | (_FLAG_RESET if kind == "update" else 0)
    if flags & ~allowed:
        raise _corrupt(where, f"the {kind} record has unknown flags {flags:#04x}")
    third, third_min = ("leader epoch", -1) if kind == "snapshot" else ("delta index", 0)
    for name, value, lowest in (
        ("snapshot epoch", a, 0),
        ("state epoch", b, 0),
        (third, c, third_min),
        ("start offset", start, 0 if kind == "snapshot" else -1),
        ("base offset", base, 0),
    ):
        if value < lowest:
            raise _corrupt(where, f"the {kind} record has {name} {value} (below {lowest})")
    locks: list[tuple[str, int]] = []
    if locked:
        locks = _load_locks(view[end:body_end], acquired, where, kind)
    out: list[StateBatch] = []
    append = out.append
    state_of = (_STATE_OF_LOCKED if locked else _STATE_OF).get
    next_lock = iter(locks).__next__
    prev_last = -1
    for rel, length, state, count in run.iter_unpack(view[_HEADER.size : end]):
        first = base + rel
        last = first + length
        record_state = state_of(state)
        if (
            first <= prev_last
            or last < first
            or last > _INT64_MAX
            or record_state is None
            or count < 0
        ):
            raise _batch_problem(
                len(out), first, last, state, count, prev_last, where, locked
            ) or _corrupt(where, f"batch #{len(out)} is invalid")
        prev_last = last
        if state == _ACQUIRED_VALUE:
            member, deadline = next_lock()
            append(StateBatch(first, last, record_state, count, member, deadline))
        else:
            append(StateBatch(first, last, record_state, count))
    return a, b, c, start, tuple(out), bool(flags & _FLAG_RESET)


def _locks_end(view: memoryview, end: int, acquired: int) -> int:
    """Where a version 3 lock section starting at ``end`` ends, from its length fields (past
    the data if it is truncated)."""
    size = len(view)
    if end + _U16.size > size:
        return end + _U16.size
    (m,) = _U16.unpack_from(view, end)
    pos = end + _U16.size
    for _ in range(m):
        if pos + _U16.size > size:
            return pos + _U16.size
        pos += _U16.size + _U16.unpack_from(view, pos)[0]
    return pos + _LOCK.size * acquired


def _load_locks(section: memoryview, acquired: int, where: str, kind: str) -> list[tuple[str, int]]:
    """The ``(member id, deadline ms)`` of each of the ``acquired`` Acquired runs, in run order,
    from a version 3 lock section (already CRC-checked)."""

    def broken(problem: str) -> CorruptStateError:
        return _corrupt(where, f"the {kind} record's lock section {problem}")

    size = len(section)
    (m,) = _U16.unpack_from(section, 0)
    pos = _U16.size
    members: list[str] = []
    for i in range(m):
        if pos + _U16.size > size:
            raise broken(f"is truncated in member id #{i}")
        (length,) = _U16.unpack_from(section, pos)
        pos += _U16.size
        if length == 0 or pos + length > size:
            raise broken(f"has member id #{i} of {length} bytes (empty or past its end)")
        try:
            members.append(bytes(section[pos : pos + length]).decode())
        except UnicodeDecodeError:
            raise broken(f"has member id #{i} that is not UTF-8") from None
        pos += length
    locks: list[tuple[str, int]] = []
    for index, deadline in _LOCK.iter_unpack(section[pos:]):
        if index >= m or deadline < 0:
            raise broken(f"has a lock with member #{index} of {m} and deadline {deadline} ms")
        locks.append((members[index], deadline))
    return locks


def decode_snapshot(data: _Buffer, *, where: str) -> ShareSnapshot:
    """Decode and validate a snapshot of either format: version 2 (binary, written by
    :func:`encode_snapshot`) or version 1 (JSON, :func:`encode_snapshot_v1`), told apart by the
    first byte.

    Unknown fields of a version 1 record are ignored.

    Args:
        data: the encoded record (bytes, bytearray or memoryview).
        where: names the share-partition for error messages, e.g. ``"group=G topic=T partition=P"``.

    Returns:
        The snapshot; its batches' states are :class:`RecordState` members.

    Raises:
        CorruptStateError: the value is not bytes; it is of an unknown format version; it is not
            a snapshot; it is truncated or has extra bytes, fails its checksum (version 2) or is
            not valid JSON (version 1); or it holds invalid fields (a missing field, a field of
            the wrong type, negative epochs, offsets or counts, a state other than 0/2/4,
            ``first > last``, unordered or overlapping batches). The message names ``where``,
            the problem and what to do.
    """
    if _is_v2(data):
        snapshot_epoch, state_epoch, leader_epoch, start, batches, _ = _load_v2(
            data, where, "snapshot"
        )
        return ShareSnapshot(snapshot_epoch, state_epoch, leader_epoch, start, batches)
    record = _load(data, where, "snapshot", _snapshot_decoder)
    return ShareSnapshot(
        snapshot_epoch=record.snapshot_epoch,
        state_epoch=record.state_epoch,
        leader_epoch=record.leader_epoch,
        start_offset=record.start_offset,
        batches=_batches(record.batches, where),
    )


def decode_update(data: _Buffer, *, where: str) -> tuple[ShareUpdate, int, int, int]:
    """Decode and validate a delta of either format: version 2 (binary, written by
    :func:`encode_update`) or version 1 (JSON, :func:`encode_update_v1`), told apart by the
    first byte.

    Args:
        data: the encoded record (bytes, bytearray or memoryview).
        where: names the share-partition for error messages, e.g. ``"group=G topic=T partition=P"``.

    Returns:
        ``(update, snapshot_epoch, state_epoch, delta_index)``.

    Raises:
        CorruptStateError: as for :func:`decode_snapshot`; also a non-boolean ``reset`` or a
            ``start_offset`` below -1.
    """
    if _is_v2(data):
        snapshot_epoch, state_epoch, delta_index, start, batches, reset = _load_v2(
            data, where, "update"
        )
        return ShareUpdate(start, batches, reset), snapshot_epoch, state_epoch, delta_index
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


_POSITION: Final = struct.Struct("<q")


def request_position_key(partition: int) -> bytes:
    """Table key of the offset of the last request (in request partition ``partition`` of the
    request topic) whose changes the leader wrote: ``R/<partition>``. A new leader skips the
    requests at or before it, which its predecessor already applied (a takeover redelivers
    nothing: docs/architecture.md)."""
    return f"R/{partition}".encode()


def encode_request_position(offset: int) -> bytes:
    """The value under :func:`request_position_key`: the offset as an int64 (8 bytes, LE).

    Raises:
        ValueError: ``offset`` is negative or does not fit an int64.
    """
    if not 0 <= offset <= _INT64_MAX:
        raise ValueError(f"request offset {offset} is not in 0..2**63-1")
    return _POSITION.pack(offset)


def decode_request_position(data: _Buffer, *, where: str) -> int:
    """The offset stored by :func:`encode_request_position`.

    Raises:
        CorruptStateError: the value is not 8 bytes or holds a negative offset.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != _POSITION.size:
        raise CorruptStateError(
            f"corrupt request position for {where}: expected {_POSITION.size} bytes, got "
            f"{data!r:.60}; delete the key so the leader applies requests from Faust's committed "
            'offset (docs/operations.md, "Corrupt state")'
        )
    (offset,) = _POSITION.unpack(data)
    if offset < 0:
        raise CorruptStateError(f"corrupt request position for {where}: offset {offset} < 0")
    return int(offset)


def ack_position_key(partition: int) -> bytes:
    """Table key of the offset of the last message of partition ``partition`` of the ack topic
    (``queueflow.processing.guarantee=exactly_once``) whose acknowledgements the leader applied:
    ``A/<partition>``; its value is encoded like a request position
    (:func:`encode_request_position`). A new leader's ack reader resumes right after it, so a
    committed acknowledgement is applied once (docs/architecture.md "Exactly-once:
    transactional acknowledgements")."""
    return f"A/{partition}".encode()


def parked_keys_key(group: str, partition: int) -> bytes:
    """Table key of the parked keys of a key-ordered share-partition (``share.ordering=key``;
    docs/concepts.md "Key-ordered sharing"): ``K/<group>/<partition>``. Its value
    (:func:`encode_parked_keys`) is written in the same flush as the share-partition's delta,
    so a new leader restores the parked keys with the records."""
    return f"K/{group}/{partition}".encode()


class _ParkedKeys(msgspec.Struct, tag="parked_keys"):
    """The value under :func:`parked_keys_key`: version 1, and per parked key
    ``(hash as 16 hex digits, offset that parked it, reason, key as shown)``."""

    v: int
    keys: list[tuple[str, int, str, str]]


_PARKED_DECODER: Final = msgspec.json.Decoder(_ParkedKeys)


def encode_parked_keys(parked: Sequence[ParkedKey]) -> bytes:
    """Encode the parked keys of one share-partition (JSON, version 1)."""
    return msgspec.json.encode(
        _ParkedKeys(1, [(f"{p.key_hash:016x}", p.offset, p.reason, p.key) for p in parked])
    )


def decode_parked_keys(data: _Buffer, *, where: str) -> list[ParkedKey]:
    """The parked keys stored by :func:`encode_parked_keys`.

    Raises:
        CorruptStateError: not of that form or of another version; names ``where``.
    """
    try:
        record = _PARKED_DECODER.decode(data)
        if record.v != 1:
            raise _unknown_version(record.v, where)
        return [ParkedKey(int(h, 16), int(o), r, k) for h, o, r, k in record.keys]
    except (msgspec.DecodeError, ValueError) as exc:
        raise CorruptStateError(
            f"corrupt parked keys for {where}: {exc}; delete the key K/<group>/<partition> to "
            "free every parked key of the share-partition"
        ) from None


def parse_state_key(key: bytes) -> tuple[str, str, int, tuple[int, int, int] | None]:
    """``(kind, group, partition, (state epoch, snapshot epoch, index) or None)`` of a table key
    written by :func:`snapshot_key` (kind ``"S"``), :func:`delta_key` (kind ``"D"``) or
    :func:`request_position_key` (kind ``"R"``, group ``""``), :func:`ack_position_key`
    (kind ``"A"``, group ``""``) or :func:`parked_keys_key` (kind ``"K"``).

    Raises:
        ValueError: the key is of none of these forms.
    """
    text = key.decode()
    if text.startswith("R/") or text.startswith("A/"):
        return text[0], "", int(text[2:]), None
    if text.startswith("S/") or text.startswith("K/"):
        group, partition = text[2:].rsplit("/", 1)
        return text[0], group, int(partition), None
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

    Each value is decoded in its own format (:func:`decode_snapshot`, :func:`decode_update`),
    so a version 1 snapshot followed by version 2 deltas, as written across an upgrade, restores.

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
