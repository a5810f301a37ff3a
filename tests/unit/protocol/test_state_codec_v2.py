"""Durable share-partition state, format version 2 (binary): layout, round trips, compatibility
with version 1 (JSON) state written before the upgrade, and refusal of corrupt values.

The layout is documented under ``queueflow.protocol.state_codec.STATE_FORMAT_VERSION``;
:func:`forge` below builds values from that description with :mod:`struct` alone, so that the
tests check the codec against the document rather than against itself.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueflow.engine import SharePartition, SharePartitionConfig
from queueflow.engine.state import (
    PERSISTED_STATES,
    RecordState,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    replay,
)
from queueflow.errors import CorruptStateError, ErrorCode
from queueflow.protocol.state_codec import (
    STATE_FORMAT_JSON_VERSION,
    STATE_FORMAT_VERSION,
    decode_snapshot,
    decode_state,
    decode_update,
    delta_key,
    encode_snapshot,
    encode_snapshot_v1,
    encode_update,
    encode_update_v1,
    snapshot_key,
)
from queueflow.server.durable import DurableSharePartition

FAST = settings(
    max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
AV, AK, AR = RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED
WHERE = "group=G topic=T partition=3"
G, T, P = "G", "T", 3
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
CFG = SharePartitionConfig(max_in_flight_records=1000, delivery_count_limit=5)

SnapshotEncoder = Callable[[ShareSnapshot], bytes]
UpdateEncoder = Callable[..., bytes]

SNAP = ShareSnapshot(
    snapshot_epoch=2,
    state_epoch=1,
    leader_epoch=7,
    start_offset=100,
    batches=(StateBatch(100, 104, AV, 2), StateBatch(105, 105, AK, 1), StateBatch(107, 110, AR, 5)),
)
UPD = ShareUpdate(start_offset=105, batches=(StateBatch(106, 106, AV, 1),))

# ------------------------------------------------------------------------------------------------
# The documented layout, built independently of the codec
# ------------------------------------------------------------------------------------------------

HEADER = struct.Struct("<BBBBqqqqqI")
NARROW = struct.Struct("<IIBi")
WIDE = struct.Struct("<qqBi")


def forge(
    *,
    record_type: int = 0x53,
    flags: int = 0,
    fields: tuple[int, int, int, int] = (2, 1, 7, 100),
    base: int = 100,
    runs: Sequence[tuple[int, int, int, int]] = ((0, 4, 0, 2),),
    count: int | None = None,
    version: int = 2,
    magic: int = 0xF5,
) -> bytes:
    """A version 2 value with a valid CRC: ``runs`` are ``(first - base, last - first, state,
    delivery count)``; flag bit 1 selects wide runs."""
    run = WIDE if flags & 0x02 else NARROW
    body = HEADER.pack(
        magic, version, record_type, flags, *fields, base, len(runs) if count is None else count
    )
    body += b"".join(run.pack(*r) for r in runs)
    return body + struct.pack("<I", zlib.crc32(body))


def refused(decode: Callable[..., Any], data: Any) -> str:
    """The CorruptStateError message ``decode`` raises for ``data`` (it must raise exactly that)."""
    with pytest.raises(CorruptStateError) as info:
        decode(data, where=WHERE)
    assert type(info.value) is CorruptStateError
    assert info.value.code is ErrorCode.CORRUPT_STATE
    message = str(info.value)
    assert WHERE in message
    assert "refusing to serve this share-partition" in message
    return message


# ------------------------------------------------------------------------------------------------
# Strategies: valid records, offsets and epochs over the whole int64 range
# ------------------------------------------------------------------------------------------------


MEMBER_IDS = st.sampled_from(["m", "member-1", "ü-2"]) | st.text(
    st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40
)


@st.composite
def state_batches(
    draw: st.DrawFn, max_runs: int = 12, locks: bool = False
) -> tuple[StateBatch, ...]:
    """Ordered, non-overlapping persisted batches; offsets near 0, near 2**32 or near 2**63.
    With ``locks``, some are Acquired with a lock (format version 3)."""
    states = sorted(PERSISTED_STATES) + ([RecordState.ACQUIRED] if locks else [])
    out: list[StateBatch] = []
    offset = draw(st.sampled_from([0, 1_000, 2**32 - 50, 2**62]) | st.integers(0, 2**40))
    for _ in range(draw(st.integers(0, max_runs))):
        gap = draw(st.integers(0, 3) | st.integers(0, 2**33))
        first = offset + gap
        last = first + draw(st.integers(0, 10) | st.integers(0, 2**33))
        if last > INT64_MAX:
            break
        state = draw(st.sampled_from(states))
        count = draw(st.integers(0, 20) | st.integers(0, INT32_MAX))
        if state is RecordState.ACQUIRED:
            deadline = draw(st.integers(0, 2**45) | st.integers(0, INT64_MAX))
            out.append(StateBatch(first, last, state, count, draw(MEMBER_IDS), deadline))
        else:
            out.append(StateBatch(first, last, state, count))
        offset = last + 1
    return tuple(out)


epochs = st.integers(0, 20) | st.integers(0, INT64_MAX)
snapshots = st.builds(
    ShareSnapshot, epochs, epochs, st.integers(-1, 20) | epochs, epochs, state_batches()
)
updates = st.builds(ShareUpdate, st.integers(-1, 20) | epochs, state_batches(), st.booleans())
locked_snapshots = st.builds(
    ShareSnapshot, epochs, epochs, st.integers(-1, 20) | epochs, epochs, state_batches(locks=True)
)
locked_updates = st.builds(
    ShareUpdate, st.integers(-1, 20) | epochs, state_batches(locks=True), st.booleans()
)


# ------------------------------------------------------------------------------------------------
# Layout
# ------------------------------------------------------------------------------------------------

SNAP_BYTES = forge(runs=[(0, 4, 0, 2), (5, 0, 2, 1), (7, 3, 4, 5)])
UPD_BYTES = forge(record_type=0x55, fields=(2, 1, 4, 105), base=106, runs=[(0, 0, 0, 1)])


def test_golden_bytes() -> None:
    """The version 2 bytes of the records of test_wire_golden.py, pinned."""
    assert encode_snapshot(SNAP) == SNAP_BYTES
    assert SNAP_BYTES.hex() == (
        "f5025300"
        "0200000000000000"
        "0100000000000000"
        "0700000000000000"
        "6400000000000000"
        "6400000000000000"
        "03000000"
        "00000000"
        "04000000"
        "00"
        "02000000"
        "05000000"
        "00000000"
        "02"
        "01000000"
        "07000000"
        "03000000"
        "04"
        "05000000"
        "9a30d350"
    )
    assert encode_update(UPD, snapshot_epoch=2, state_epoch=1, delta_index=4) == UPD_BYTES
    assert decode_snapshot(SNAP_BYTES, where=WHERE) == SNAP
    assert decode_update(UPD_BYTES, where=WHERE) == (UPD, 2, 1, 4)
    reset = ShareUpdate(0, (), reset=True)
    assert encode_update(reset, snapshot_epoch=9, state_epoch=3, delta_index=0) == forge(
        record_type=0x55, flags=0x01, fields=(9, 3, 0, 0), base=0, runs=()
    )
    empty = ShareSnapshot(0, 0, -1, 0, ())
    assert encode_snapshot(empty) == forge(fields=(0, 0, -1, 0), base=0, runs=())


def test_header_and_sizes() -> None:
    assert STATE_FORMAT_VERSION == 2 and STATE_FORMAT_JSON_VERSION == 1
    data = encode_snapshot(SNAP)
    assert data[0] == 0xF5 and data[1] == STATE_FORMAT_VERSION and data[2:3] == b"S"
    assert len(data) == 52 + 13 * len(SNAP.batches)
    delta = encode_update(UPD, snapshot_epoch=0, state_epoch=0, delta_index=0)
    assert delta[2:3] == b"U" and len(delta) == 52 + 13
    # v1 cannot start with the magic byte: it is never part of UTF-8 text
    assert encode_snapshot_v1(SNAP)[:1] == b"{"


def test_wide_runs_when_offsets_are_far_apart() -> None:
    far = ShareSnapshot(
        0, 0, 0, 0, (StateBatch(0, 0, AV, 1), StateBatch(2**32, INT64_MAX, AR, INT32_MAX))
    )
    data = encode_snapshot(far)
    assert data[3] & 0x02 and len(data) == 52 + 21 * 2
    assert decode_snapshot(data, where=WHERE) == far
    near = ShareSnapshot(0, 0, 0, 2**62, (StateBatch(2**62, 2**62 + 2**32 - 1, AK, 0),))
    data = encode_snapshot(near)
    assert not data[3] & 0x02 and len(data) == 52 + 13
    assert decode_snapshot(data, where=WHERE) == near


@FAST
@given(locked_snapshots)
def test_snapshot_round_trip(snapshot: ShareSnapshot) -> None:
    data = encode_snapshot(snapshot)
    decoded = decode_snapshot(data, where=WHERE)
    assert decoded == snapshot
    assert all(type(b.state) is RecordState for b in decoded.batches)
    assert decode_snapshot(bytearray(data), where=WHERE) == snapshot
    assert decode_snapshot(memoryview(data), where=WHERE) == snapshot
    locked = [b for b in snapshot.batches if b.state is RecordState.ACQUIRED]
    # Version 2 unless a batch holds a lock; then version 3 with 10 bytes per lock plus the ids.
    assert data[1] == (3 if locked else 2)
    runs = len(data) - (len(lock_section(locked)) if locked else 0)
    assert runs in (52 + 13 * len(snapshot.batches), 52 + 21 * len(snapshot.batches))


def lock_section(locked: list[StateBatch]) -> bytes:
    """The version 3 lock section of ``locked`` (the Acquired batches), built independently."""
    ids = list(dict.fromkeys(b.member_id for b in locked if b.member_id))
    out = struct.pack("<H", len(ids))
    for member in ids:
        out += struct.pack("<H", len(member.encode())) + member.encode()
    for b in locked:
        out += struct.pack("<Hq", ids.index(b.member_id), b.lock_deadline_ms)
    return out


def test_locks_golden_bytes() -> None:
    """A version 3 value: the version 2 layout with version 3 and the lock section."""
    aq = RecordState.ACQUIRED
    snap = ShareSnapshot(
        1,
        0,
        3,
        10,
        (
            StateBatch(10, 11, aq, 1, "m1", 5000),
            StateBatch(12, 12, AV, 1),
            StateBatch(13, 13, aq, 2, "m1", 6000),
        ),
    )
    data = encode_snapshot(snap)
    header = struct.pack("<BBBBqqqqqI", 0xF5, 3, 0x53, 0, 1, 0, 3, 10, 10, 3)
    runs = struct.pack("<IIBi", 0, 1, 1, 1) + struct.pack("<IIBi", 2, 0, 0, 1)
    runs += struct.pack("<IIBi", 3, 0, 1, 2)
    locks = struct.pack("<HH", 1, 2) + b"m1" + struct.pack("<Hq", 0, 5000)
    locks += struct.pack("<Hq", 0, 6000)
    body = header + runs + locks
    assert data == body + struct.pack("<I", zlib.crc32(body))
    assert decode_snapshot(data, where=WHERE) == snap


def test_acquired_without_a_lock_is_not_encoded() -> None:
    for batch in (
        StateBatch(0, 1, RecordState.ACQUIRED, 1),
        StateBatch(0, 1, RecordState.ACQUIRED, 1, "m", None),
        StateBatch(0, 1, RecordState.ACQUIRED, 1, "", 5),
        StateBatch(0, 1, RecordState.ACQUIRED, 1, "m", -1),
    ):
        with pytest.raises(ValueError, match="Acquired only with its lock"):
            encode_snapshot(ShareSnapshot(0, 0, 0, 0, (batch,)))


@FAST
@given(locked_updates, epochs, epochs, epochs)
def test_update_round_trip(update: ShareUpdate, snap: int, state: int, index: int) -> None:
    data = encode_update(update, snapshot_epoch=snap, state_epoch=state, delta_index=index)
    decoded = decode_update(data, where=WHERE)
    assert decoded == (update, snap, state, index)
    assert all(type(b.state) is RecordState for b in decoded[0].batches)


@FAST
@given(snapshots, updates)
def test_v1_and_v2_decode_to_the_same_records(snapshot: ShareSnapshot, update: ShareUpdate) -> None:
    assert decode_snapshot(encode_snapshot_v1(snapshot), where=WHERE) == decode_snapshot(
        encode_snapshot(snapshot), where=WHERE
    )
    v1 = encode_update_v1(update, snapshot_epoch=1, state_epoch=2, delta_index=3)
    v2 = encode_update(update, snapshot_epoch=1, state_epoch=2, delta_index=3)
    assert decode_update(v1, where=WHERE) == decode_update(v2, where=WHERE)


def test_v2_is_smaller_than_v1() -> None:
    batches = tuple(
        StateBatch(10_000_000 + 3 * i, 10_000_000 + 3 * i + 1, (AV, AK, AR)[i % 3], i % 4)
        for i in range(90)
    )
    update = ShareUpdate(10_000_000, batches)
    v1 = encode_update_v1(update, snapshot_epoch=5, state_epoch=2, delta_index=17)
    v2 = encode_update(update, snapshot_epoch=5, state_epoch=2, delta_index=17)
    assert len(v2) < 0.6 * len(v1)


# ------------------------------------------------------------------------------------------------
# Encoding refusals
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batches", "match"),
    [
        ([StateBatch(0, 0, RecordState.ACQUIRED, 1)], r"ACQUIRED.*only Available"),
        (
            [StateBatch(2**40, 2**40, AV, 1), StateBatch(2**41, 2**41, RecordState.ACQUIRED, 1)],
            r"ACQUIRED.*only Available",
        ),
        ([StateBatch(0, 0, AV, 2**31)], r"delivery count 2147483648 is not an int32"),
        ([StateBatch(0, 0, AV, -(2**31) - 1)], r"is not an int32"),
        ([StateBatch(5, 2**63, AV, 1)], r"batch 5\.\.9223372036854775808: offsets are 0 to 2"),
        ([StateBatch(-5, 2**62, AV, 1)], r"batch -5\.\.4611686018427387904: offsets are 0 to 2"),
        (
            [StateBatch(0, 0, AV, 1), StateBatch(1, 2**64, AV, 1), StateBatch(5, 5, AV, 1)],
            r"do not fit int64",
        ),
    ],
)
def test_encode_refuses_what_it_cannot_represent(batches: list[StateBatch], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_snapshot(ShareSnapshot(0, 0, 0, 0, tuple(batches)))
    with pytest.raises(ValueError, match=match):
        encode_update(
            ShareUpdate(0, tuple(batches)), snapshot_epoch=0, state_epoch=0, delta_index=0
        )


def test_encode_refuses_header_fields_beyond_int64() -> None:
    with pytest.raises(ValueError, match=r"snapshot epoch 9223372036854775808 is not an int64"):
        encode_snapshot(ShareSnapshot(2**63, 0, 0, 0, ()))
    with pytest.raises(ValueError, match=r"start offset"):
        encode_update(ShareUpdate(2**63, ()), snapshot_epoch=0, state_epoch=0, delta_index=0)


# ------------------------------------------------------------------------------------------------
# Version 1 state restores unchanged; mixed v1 snapshot + v2 deltas replay
# ------------------------------------------------------------------------------------------------

# Written by queueflow before version 2 (the bytes of test_wire_golden.py, then two deltas).
V1_SNAPSHOT = (
    b'{"v":1,"t":"snapshot","snapshot_epoch":2,"state_epoch":1,"leader_epoch":7,'
    b'"start_offset":100,"batches":[[100,104,0,2],[105,105,2,1],[107,110,4,5]]}'
)
V1_DELTAS = [
    b'{"v":1,"t":"update","snapshot_epoch":2,"state_epoch":1,"delta_index":0,'
    b'"start_offset":100,"reset":false,"batches":[[102,103,2,2],[111,112,0,1]]}',
    b'{"v":1,"t":"update","snapshot_epoch":2,"state_epoch":1,"delta_index":1,'
    b'"start_offset":102,"reset":false,"batches":[[106,106,0,1]]}',
]
RESTORED = (
    102,
    (
        StateBatch(102, 103, AK, 2),
        StateBatch(104, 104, AV, 2),
        StateBatch(105, 105, AK, 1),
        StateBatch(106, 106, AV, 1),
        StateBatch(107, 110, AR, 5),
        StateBatch(111, 112, AV, 1),
    ),
)


def table_of(
    snapshot: bytes, deltas: Sequence[bytes], epochs: tuple[int, int] = (1, 2)
) -> dict[bytes, bytes]:
    table = {snapshot_key(G, P): snapshot}
    for index, data in enumerate(deltas):
        table[delta_key(G, P, *epochs, index)] = data
    return table


def restore(table: dict[bytes, bytes]) -> tuple[int, tuple[StateBatch, ...]]:
    snapshot, updates = decode_state(
        table[snapshot_key(G, P)],
        lambda state_epoch, snapshot_epoch, index: table.get(
            delta_key(G, P, state_epoch, snapshot_epoch, index)
        ),
        where=WHERE,
    )
    return replay(snapshot, updates, where=WHERE)


def test_v1_fixture_restores_to_the_same_engine_state() -> None:
    table = table_of(V1_SNAPSHOT, V1_DELTAS)
    assert restore(table) == RESTORED
    durable = DurableSharePartition.load(table, G, T, P, CFG, 500)
    assert durable is not None
    assert durable.engine.snapshot() == SharePartition.restore(CFG, *RESTORED).snapshot()
    # The leader that restored it writes its fresh snapshot as version 2.
    written = table[snapshot_key(G, P)]
    assert written[:2] == b"\xf5\x02"
    assert decode_snapshot(written, where=WHERE) == ShareSnapshot(
        3, 2, 0, *durable.engine.snapshot()
    )


def test_v1_snapshot_then_v2_deltas() -> None:
    """After an upgrade: the old leader's v1 snapshot and deltas, then v2 deltas (the same
    records re-encoded, so the result must not change)."""
    v2_deltas = []
    for index, data in enumerate(V1_DELTAS):
        update, snapshot_epoch, state_epoch, _ = decode_update(data, where=WHERE)
        v2_deltas.append(
            encode_update(
                update, snapshot_epoch=snapshot_epoch, state_epoch=state_epoch, delta_index=index
            )
        )
    assert restore(table_of(V1_SNAPSHOT, v2_deltas)) == RESTORED
    assert restore(table_of(V1_SNAPSHOT, [V1_DELTAS[0], v2_deltas[1]])) == RESTORED
    # Never written (a v2 leader writes only v2), but decoded per value all the same.
    assert restore(table_of(encode_snapshot(SNAP), [V1_DELTAS[0], v2_deltas[1]])) == RESTORED


def test_upgraded_leader_continues_v1_state() -> None:
    """A leader restores v1 state, serves (its deltas are v2), and its successor restores
    exactly the state it left."""
    table = table_of(V1_SNAPSHOT, V1_DELTAS)
    first = DurableSharePartition.load(table, G, T, P, CFG, 500)
    assert first is not None
    first.engine.acquire("m", 6, log_end_offset=130, now_ms=0)
    assert first.persist()
    assert first.persist() is False  # nothing changed
    first.engine.release_member("m", now_ms=1)
    first.engine.acquire("m", 3, log_end_offset=130, now_ms=2)
    assert first.persist()
    deltas = [v for k, v in table.items() if k.startswith(b"D/")]
    # Acquired records are persisted with their locks: format version 3.
    assert len(deltas) == 2 and all(v[:2] == b"\xf5\x03" for v in deltas)
    second = DurableSharePartition.load(table, G, T, P, CFG, 500)
    assert second is not None
    # Acquired records come back Acquired, with their owners, deadlines and delivery counts.
    expected = SharePartition.restore(CFG, *first.engine.snapshot()).snapshot()
    assert second.engine.acquired_count == first.engine.acquired_count == 3
    assert second.engine.snapshot() == expected


@FAST
@given(snapshots, st.lists(updates, max_size=4), st.lists(st.booleans(), min_size=5, max_size=5))
def test_any_mix_of_formats_replays_the_same(
    snapshot: ShareSnapshot, deltas: list[ShareUpdate], v1: list[bool]
) -> None:
    def table(snapshot_v1: bool, deltas_v1: Sequence[bool]) -> dict[bytes, bytes]:
        encode_s: SnapshotEncoder = encode_snapshot_v1 if snapshot_v1 else encode_snapshot
        encoded = []
        for index, (update, old) in enumerate(zip(deltas, deltas_v1, strict=False)):
            encode_u: UpdateEncoder = encode_update_v1 if old else encode_update
            encoded.append(
                encode_u(
                    update,
                    snapshot_epoch=snapshot.snapshot_epoch,
                    state_epoch=snapshot.state_epoch,
                    delta_index=index,
                )
            )
        return table_of(
            encode_s(snapshot), encoded, (snapshot.state_epoch, snapshot.snapshot_epoch)
        )

    expected = replay(snapshot, deltas, where=WHERE)
    assert restore(table(True, [True] * 4)) == expected
    assert restore(table(v1[0], v1[1:])) == expected


def test_decode_state_names_the_partition_for_a_corrupt_v2_delta() -> None:
    good = encode_update(UPD, snapshot_epoch=2, state_epoch=1, delta_index=0)
    table = table_of(V1_SNAPSHOT, [good[:-1]])
    message = refused(lambda data, where: restore(data), table)
    assert "truncated" in message


# ------------------------------------------------------------------------------------------------
# Corruption: truncation, flipped bytes, garbage, forged values with a valid checksum
# ------------------------------------------------------------------------------------------------

VALID: list[tuple[str, Callable[..., Any], bytes]] = [
    ("snapshot", decode_snapshot, encode_snapshot(SNAP)),
    ("update", decode_update, encode_update(UPD, snapshot_epoch=2, state_epoch=1, delta_index=4)),
    (
        "empty update",
        decode_update,
        encode_update(ShareUpdate(0, (), True), snapshot_epoch=0, state_epoch=0, delta_index=0),
    ),
    (
        "wide snapshot",
        decode_snapshot,
        encode_snapshot(
            ShareSnapshot(0, 0, 0, 0, (StateBatch(0, 0, AV, 1), StateBatch(2**40, 2**40, AK, 2)))
        ),
    ),
    (
        "locked update",
        decode_update,
        encode_update(
            ShareUpdate(
                5,
                (
                    StateBatch(5, 6, RecordState.ACQUIRED, 1, "m1", 9000),
                    StateBatch(7, 7, AK, 1),
                    StateBatch(8, 9, RecordState.ACQUIRED, 3, "m2", 9500),
                ),
            ),
            snapshot_epoch=1,
            state_epoch=0,
            delta_index=2,
        ),
    ),
]
VALID_IDS = [v[0] for v in VALID]


@pytest.mark.parametrize(("what", "decode", "data"), VALID, ids=VALID_IDS)
def test_every_truncation_is_refused(what: str, decode: Callable[..., Any], data: bytes) -> None:
    decode(data, where=WHERE)
    for cut in range(len(data)):
        refused(decode, data[:cut])
    assert "truncated" in refused(decode, data[:-1])
    assert "truncated" in refused(decode, data[:10])


@pytest.mark.parametrize(("what", "decode", "data"), VALID, ids=VALID_IDS)
def test_every_flipped_byte_is_refused(what: str, decode: Callable[..., Any], data: bytes) -> None:
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            changed = bytearray(data)
            changed[i] ^= mask
            refused(decode, bytes(changed))


@pytest.mark.parametrize("version", [v for v in range(256) if v not in (2, 3)])
def test_flipped_version_byte_is_an_unknown_version(version: int) -> None:
    for _what, decode, data in VALID[:2]:
        changed = bytearray(data)
        changed[1] = version
        message = refused(decode, bytes(changed))
        assert f"unknown share-partition state format version {version} (binary)" in message
        assert "upgrade queueflow" in message
        assert "supports version 1 as JSON and versions 2 and 3 as binary" in message
        # A newer version's header may be any length: the version is read from 2 bytes on.
        assert "(binary)" in refused(decode, bytes(changed[:2]))


def test_extra_bytes_are_refused() -> None:
    data = encode_snapshot(SNAP)
    assert "extra bytes" in refused(decode_snapshot, data + b"\x00")
    assert "extra bytes" in refused(decode_snapshot, data + data)


def test_checksum_mismatch_is_refused() -> None:
    data = bytearray(encode_snapshot(SNAP))
    data[60] ^= 0x04  # a state byte: 0 -> 4 would be a valid record without the checksum
    assert "CRC-32" in refused(decode_snapshot, bytes(data))


def test_record_of_the_other_kind_is_refused() -> None:
    snapshot = encode_snapshot(SNAP)
    update = encode_update(UPD, snapshot_epoch=2, state_epoch=1, delta_index=4)
    assert "expected a update record, found 'snapshot'" in refused(decode_update, snapshot)
    assert "expected a snapshot record, found 'update'" in refused(decode_snapshot, update)
    assert "unknown type 0x41" in refused(decode_snapshot, forge(record_type=0x41))


@pytest.mark.parametrize(
    "data", [None, "text", 42, b"", b"\xf5", b"\x00garbage", b"\xf5\x02" + b"\x00" * 100]
)
def test_garbage_is_refused(data: Any) -> None:
    refused(decode_snapshot, data)
    refused(decode_update, data)


@settings(FAST, max_examples=300)
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_after_the_header_start(tail: bytes, versioned: bool) -> None:
    data = (b"\xf5\x02" if versioned else b"\xf5") + tail
    for decode in (decode_snapshot, decode_update):
        try:
            decode(data, where=WHERE)
        except CorruptStateError as exc:
            assert WHERE in str(exc)


FORGED: list[tuple[str, Callable[..., Any], bytes, str]] = [
    ("snapshot with the reset flag", decode_snapshot, forge(flags=0x01), "unknown flags 0x01"),
    ("unknown flag bit", decode_update, forge(record_type=0x55, flags=0x04), "unknown flags"),
    (
        "negative snapshot epoch",
        decode_snapshot,
        forge(fields=(-1, 1, 7, 100)),
        "snapshot epoch -1",
    ),
    (
        "negative state epoch",
        decode_update,
        forge(record_type=0x55, fields=(1, -5, 0, 0)),
        "state epoch -5",
    ),
    ("leader epoch below -1", decode_snapshot, forge(fields=(1, 1, -2, 100)), "leader epoch -2"),
    (
        "negative delta index",
        decode_update,
        forge(record_type=0x55, fields=(1, 1, -1, 0)),
        "delta index -1",
    ),
    ("negative snapshot start", decode_snapshot, forge(fields=(1, 1, 7, -1)), "start offset -1"),
    (
        "update start below -1",
        decode_update,
        forge(record_type=0x55, fields=(1, 1, 0, -2)),
        "start offset -2",
    ),
    ("negative base", decode_snapshot, forge(base=-3), "base offset -3"),
    ("state Acquired", decode_snapshot, forge(runs=[(0, 1, 1, 1)]), "has state 1"),
    ("state 3", decode_update, forge(record_type=0x55, runs=[(0, 1, 3, 1)]), "has state 3"),
    ("negative count", decode_snapshot, forge(runs=[(0, 1, 0, -1)]), "delivery count -1"),
    ("overlapping", decode_snapshot, forge(runs=[(0, 4, 0, 1), (4, 2, 2, 1)]), "overlaps"),
    ("unordered", decode_snapshot, forge(runs=[(10, 4, 0, 1), (0, 2, 2, 1)]), "precedes"),
    (
        "wide first > last",
        decode_snapshot,
        forge(flags=0x02, runs=[(0, -1, 0, 1)]),
        "invalid range 100..99",
    ),
    (
        "wide below 0",
        decode_snapshot,
        forge(flags=0x02, base=0, runs=[(-5, 1, 0, 1)]),
        "invalid range -5..-4",
    ),
    (
        "beyond int64",
        decode_snapshot,
        forge(flags=0x02, base=2**62, runs=[(2**62, 0, 0, 1)]),
        "invalid range",
    ),
    ("run count too high", decode_snapshot, forge(count=2), "header says 2 narrow runs"),
    ("run count huge", decode_snapshot, forge(count=2**32 - 1), "truncated"),
    ("run count too low", decode_snapshot, forge(runs=[(0, 1, 0, 1)] * 2, count=1), "extra bytes"),
    (
        "wide flag, no runs",
        decode_snapshot,
        forge(flags=0x02, runs=[], count=1),
        "52 bytes long, but its header says 1 wide runs, 73 bytes: it is truncated",
    ),
]


@pytest.mark.parametrize(("what", "decode", "data", "problem"), FORGED, ids=[f[0] for f in FORGED])
def test_forged_values_with_a_valid_checksum_are_refused(
    what: str, decode: Callable[..., Any], data: bytes, problem: str
) -> None:
    assert problem in refused(decode, data)


def test_forge_matches_the_codec() -> None:
    """The forged values above differ from valid ones only where they say."""
    assert decode_snapshot(forge(), where=WHERE) == ShareSnapshot(
        2, 1, 7, 100, (StateBatch(100, 104, AV, 2),)
    )
    assert decode_update(forge(record_type=0x55, flags=0x03, base=0, runs=[]), where=WHERE) == (
        ShareUpdate(100, (), True),
        2,
        1,
        7,
    )
