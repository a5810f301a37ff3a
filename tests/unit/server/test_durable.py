"""Durable share-partition state (``queueflow.server.durable``) over a plain dict as the table."""

from __future__ import annotations

import json

import pytest

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    RecordState,
    SharePartition,
    SharePartitionConfig,
    StateBatch,
)
from queueflow.errors import CorruptStateError, ErrorCode
from queueflow.protocol.state_codec import decode_snapshot, decode_update
from queueflow.server.durable import DurableSharePartition, delta_key, snapshot_key

AV = RecordState.AVAILABLE
AQ = RecordState.ACQUIRED
AK = RecordState.ACKNOWLEDGED
AR = RecordState.ARCHIVED
G, T, P = "G", "T", 3
WHERE = f"group={G} topic={T} partition={P}"
CFG = SharePartitionConfig(max_in_flight_records=1000, delivery_count_limit=3)
SKEY = snapshot_key(G, P)

Table = dict[bytes, bytes]


def create(table: Table, per_snapshot: int = 3, start: int = 0) -> DurableSharePartition:
    return DurableSharePartition.create(table, G, T, P, CFG, per_snapshot, start_offset=start)


def load(table: Table, per_snapshot: int = 3) -> DurableSharePartition | None:
    return DurableSharePartition.load(table, G, T, P, CFG, per_snapshot)


def must_load(table: Table, per_snapshot: int = 3) -> DurableSharePartition:
    d = load(table, per_snapshot)
    assert d is not None
    return d


def ack(
    sp: SharePartition, first: int, last: int, kind: AcknowledgeType, member: str = "m"
) -> None:
    sp.acknowledge(member, [AcknowledgementBatch(first, last, (kind,))], now_ms=0)


def delta_keys(table: Table) -> list[bytes]:
    return sorted(k for k in table if k.startswith(b"D/"))


def snapshot_in(table: Table):  # -> ShareSnapshot
    return decode_snapshot(table[SKEY], where=WHERE)


def view(sp: SharePartition, end: int) -> list[tuple[int, RecordState, int]]:
    return [(o, sp.record(o).state, sp.record(o).delivery_count) for o in range(end)]


def assert_restored(original: SharePartition, restored: SharePartition) -> None:
    """``restored`` has ``original``'s state, Acquired records included: the acquisition locks
    are persisted, so a new leader keeps each lock's owner and deadline."""
    assert restored.start_offset == original.start_offset
    assert restored.end_offset == original.end_offset
    assert restored.acquired_count == original.acquired_count
    assert restored.available_count == original.available_count
    for o in range(original.start_offset, original.end_offset):
        assert restored.record(o) == original.record(o), o
    assert restored.next_lock_deadline() == original.next_lock_deadline()


# ------------------------------------------------------------------------------------------------
# Keys
# ------------------------------------------------------------------------------------------------


def test_keys() -> None:
    assert snapshot_key("g", 7) == b"S/g/7"
    assert delta_key("g", 7, 1, 2, 5) == b"D/g/7/0000000001/0000000002/000005"
    # Zero-padded, so byte order is (state epoch, snapshot epoch, index) order.
    assert delta_key("g", 1, 0, 2, 10) > delta_key("g", 1, 0, 2, 9)
    assert delta_key("g", 1, 0, 10, 0) > delta_key("g", 1, 0, 9, 999)
    assert delta_key("g", 1, 2, 0, 0) > delta_key("g", 1, 1, 9, 999)


# ------------------------------------------------------------------------------------------------
# create / persist
# ------------------------------------------------------------------------------------------------


def test_create_writes_a_snapshot() -> None:
    table: Table = {}
    d = create(table, start=42)
    assert list(table) == [SKEY]
    snap = snapshot_in(table)
    assert (snap.snapshot_epoch, snap.state_epoch, snap.start_offset) == (0, 0, 42)
    assert snap.batches == ()
    assert d.snapshot_epoch == 0
    assert d.engine.start_offset == 42
    assert d.where == WHERE


def test_persist_without_changes_writes_nothing() -> None:
    table: Table = {}
    d = create(table)
    before = dict(table)
    assert d.persist() is False
    assert table == before
    assert d.writes == 0


def test_persist_writes_one_delta_per_call_with_changes() -> None:
    table: Table = {}
    d = create(table, per_snapshot=10)
    d.engine.acquire("m", 5, log_end_offset=5, now_ms=0)
    assert d.persist() is True
    assert delta_keys(table) == [delta_key(G, P, 0, 0, 0)]
    update, snapshot_epoch, state_epoch, index = decode_update(
        table[delta_key(G, P, 0, 0, 0)], where=WHERE
    )
    assert (snapshot_epoch, state_epoch, index) == (0, 0, 0)
    assert update.start_offset == 0
    # Acquired is persisted with its lock: owner and deadline (default lock 30 s from now_ms 0).
    assert update.batches == (StateBatch(0, 4, AQ, 1, "m", 30_000),)
    assert d.persist() is False
    ack(d.engine, 0, 1, AcknowledgeType.ACCEPT)
    ack(d.engine, 2, 2, AcknowledgeType.REJECT)
    assert d.persist() is True  # two changes, one delta
    assert delta_keys(table) == [delta_key(G, P, 0, 0, 0), delta_key(G, P, 0, 0, 1)]
    update, *_ = decode_update(table[delta_key(G, P, 0, 0, 1)], where=WHERE)
    assert update.start_offset == 3
    assert d.writes == 2
    assert snapshot_in(table).snapshot_epoch == 0


def test_snapshot_after_updates_per_snapshot_deltas() -> None:
    table: Table = {}
    d = create(table, per_snapshot=2)
    for i in range(2):
        d.engine.acquire("m", 1, log_end_offset=10, now_ms=0)
        assert d.persist()
        assert len(delta_keys(table)) == i + 1
    d.engine.acquire("m", 1, log_end_offset=10, now_ms=0)
    assert d.persist()
    # The third write is a snapshot with the next epoch; the superseded deltas are deleted.
    assert list(table) == [SKEY]
    snap = snapshot_in(table)
    assert snap.snapshot_epoch == 1
    assert snap.batches == (StateBatch(0, 2, AQ, 1, "m", 30_000),)
    assert d.snapshot_epoch == 1
    assert d.delta_index == 0
    # Deltas then continue under the new snapshot epoch.
    ack(d.engine, 0, 0, AcknowledgeType.ACCEPT)
    assert d.persist()
    assert delta_keys(table) == [delta_key(G, P, 0, 1, 0)]


def test_updates_per_snapshot_zero_snapshots_every_write() -> None:
    table: Table = {}
    d = create(table, per_snapshot=0)
    for epoch in range(1, 5):
        d.engine.acquire("m", 2, log_end_offset=100, now_ms=0)
        assert d.persist()
        assert list(table) == [SKEY]
        assert snapshot_in(table).snapshot_epoch == epoch
    assert d.persist() is False
    assert snapshot_in(table).snapshot_epoch == 4


def test_reset_is_written_as_a_snapshot() -> None:
    table: Table = {}
    d = create(table, per_snapshot=10)
    d.engine.acquire("m", 5, log_end_offset=5, now_ms=0)
    d.persist()
    d.engine.release_member("m", now_ms=0)
    d.persist()
    d.engine.reset_start_offset(500)
    assert d.persist()
    assert list(table) == [SKEY]
    snap = snapshot_in(table)
    assert (snap.snapshot_epoch, snap.start_offset, snap.batches) == (1, 500, ())


# ------------------------------------------------------------------------------------------------
# load
# ------------------------------------------------------------------------------------------------


def test_load_missing_state_is_none() -> None:
    assert load({}) is None
    other: Table = {}
    DurableSharePartition.create(other, G, T, P + 1, CFG, 3, start_offset=0)
    assert load(other) is None


def test_load_bumps_state_epoch_and_writes_fresh_snapshot() -> None:
    table: Table = {}
    d = create(table, per_snapshot=10, start=7)
    d.engine.acquire("m", 4, log_end_offset=20, now_ms=0)
    d.persist()
    ack(d.engine, 7, 8, AcknowledgeType.ACCEPT)
    d.persist()
    assert len(delta_keys(table)) == 2
    restored = DurableSharePartition.load(table, G, T, P, CFG, 10, leader_epoch=9)
    assert restored is not None
    assert restored.state_epoch == 1
    assert restored.leader_epoch == 9
    assert restored.snapshot_epoch == 1
    assert restored.delta_index == 0
    assert list(table) == [SKEY]
    snap = snapshot_in(table)
    assert (snap.snapshot_epoch, snap.state_epoch, snap.leader_epoch) == (1, 1, 9)
    assert snap.start_offset == 9
    assert_restored(d.engine, restored.engine)
    # A second restart bumps again.
    again = must_load(table, 10)
    assert (again.state_epoch, again.snapshot_epoch) == (2, 2)


def test_load_keeps_acquired_records_locked_until_their_deadline() -> None:
    """A new leader keeps its predecessor's locks (issue #13: a takeover redelivers nothing):
    the owner can still acknowledge, nobody else acquires them, and when a lock elapses the
    records are released, or Archived at the delivery limit, exactly as on the old leader."""
    table: Table = {}
    d = create(table, per_snapshot=100)
    sp = d.engine
    sp.acquire("m", 10, log_end_offset=10, now_ms=0)  # 0..9 count 1
    ack(sp, 5, 9, AcknowledgeType.RELEASE)
    sp.acquire("m", 5, log_end_offset=10, now_ms=0)  # 5..9 count 2
    ack(sp, 5, 9, AcknowledgeType.RELEASE)
    sp.acquire("m", 3, log_end_offset=10, now_ms=1_000)  # 5..7 count 3 = limit
    d.persist()
    restored = must_load(table).engine
    assert_restored(sp, restored)
    assert view(restored, 10) == [(o, AQ, 1) for o in range(5)] + [
        (o, AQ, 3) for o in range(5, 8)
    ] + [(o, AV, 2) for o in range(8, 10)]
    assert restored.record(6).member_id == "m"
    assert restored.record(6).lock_deadline_ms == 31_000
    # Nobody else gets the locked records; the owner's acknowledgement is applied.
    got = restored.acquire("other", 10, log_end_offset=10, now_ms=2_000)
    assert [(a.first_offset, a.last_offset) for a in got] == [(8, 9)]
    ack(restored, 0, 1, AcknowledgeType.ACCEPT)
    # The locks elapse: 2..4 Available again, 5..7 at the limit Archived.
    assert restored.expire_locks(31_000) == 6
    assert view(restored, 10)[2:8] == [(o, AV, 1) for o in range(2, 5)] + [
        (o, AR, 3) for o in range(5, 8)
    ]


def test_load_ignores_deltas_of_superseded_snapshot_epochs() -> None:
    table: Table = {}
    d = create(table, per_snapshot=10)
    d.engine.acquire("m", 3, log_end_offset=3, now_ms=0)
    d.persist()
    stale = table[delta_key(G, P, 0, 0, 0)]
    restored = must_load(table)  # snapshot epoch 1 now
    table[delta_key(G, P, 0, 0, 0)] = stale  # e.g. a late write of the previous leader
    assert view(must_load(table).engine, 5) == view(restored.engine, 5)


@pytest.mark.parametrize(
    "value",
    [
        b"garbage",
        b"",
        b"\xff\xfe",
        b"[]",
        json.dumps({"v": 99, "t": "snapshot"}).encode(),
        json.dumps({"v": 1, "t": "update"}).encode(),
        json.dumps(
            {
                "v": 1,
                "t": "snapshot",
                "snapshot_epoch": 0,
                "state_epoch": 0,
                "leader_epoch": 0,
                "start_offset": 0,
                "batches": [[0, 4, 1, 1]],  # Acquired is never persisted
            }
        ).encode(),
    ],
)
def test_corrupt_snapshot_raises_naming_the_share_partition(value: bytes) -> None:
    table: Table = {}
    create(table)
    table[SKEY] = value
    with pytest.raises(CorruptStateError) as info:
        load(table)
    assert WHERE in str(info.value)
    assert info.value.code is ErrorCode.CORRUPT_STATE


@pytest.mark.parametrize(
    "value",
    [
        b"garbage",
        b"{not json",
        json.dumps({"v": 2, "t": "update"}).encode(),
        json.dumps({"v": 1, "t": "snapshot"}).encode(),
        json.dumps(
            {
                "v": 1,
                "t": "update",
                "snapshot_epoch": 0,
                "state_epoch": 0,
                "delta_index": 1,
                "start_offset": 0,
                "reset": "no",
                "batches": [],
            }
        ).encode(),
    ],
)
def test_corrupt_delta_raises_naming_the_share_partition(value: bytes) -> None:
    table: Table = {}
    d = create(table, per_snapshot=10)
    d.engine.acquire("m", 3, log_end_offset=3, now_ms=0)
    d.persist()
    d.engine.acquire("m", 3, log_end_offset=6, now_ms=0)
    d.persist()
    table[delta_key(G, P, 0, 0, 1)] = value
    before = dict(table)
    with pytest.raises(CorruptStateError) as info:
        load(table)
    assert WHERE in str(info.value)
    assert info.value.code is ErrorCode.CORRUPT_STATE
    assert table == before  # nothing was written


def test_empty_delta_value_is_corrupt() -> None:
    table: Table = {}
    d = create(table, per_snapshot=10)
    for _ in range(2):
        d.engine.acquire("m", 3, log_end_offset=100, now_ms=0)
        d.persist()
    table[delta_key(G, P, 0, 0, 0)] = b""
    with pytest.raises(CorruptStateError):
        load(table)


def test_load_twice_gives_the_same_state() -> None:
    table: Table = {}
    d = create(table, per_snapshot=5)
    d.engine.acquire("m", 20, log_end_offset=20, now_ms=0)
    d.persist()
    ack(d.engine, 0, 4, AcknowledgeType.ACCEPT)
    ack(d.engine, 10, 14, AcknowledgeType.REJECT)
    d.persist()
    copy = dict(table)
    first = must_load(table).engine
    second = must_load(table).engine
    from_copy = must_load(copy).engine
    for sp in (second, from_copy):
        assert view(sp, 25) == view(first, 25)
        assert (sp.start_offset, sp.end_offset) == (first.start_offset, first.end_offset)


def test_replaying_deltas_twice_is_idempotent() -> None:
    table: Table = {}
    d = create(table, per_snapshot=10)
    sp = d.engine
    sp.acquire("m", 10, log_end_offset=10, now_ms=0)
    d.persist()
    ack(sp, 0, 2, AcknowledgeType.ACCEPT)
    ack(sp, 5, 6, AcknowledgeType.RELEASE)
    d.persist()
    sp.acquire("m", 2, log_end_offset=10, now_ms=0)
    ack(sp, 7, 9, AcknowledgeType.REJECT)
    d.persist()
    deltas = [table[k] for k in delta_keys(table)]
    assert len(deltas) == 3
    once = must_load(dict(table), 10).engine
    # Every delta written twice in a row (an at-least-once changelog replay) ...
    doubled = {SKEY: table[SKEY]}
    for i, value in enumerate(v for v in deltas for _ in range(2)):
        doubled[delta_key(G, P, 0, 0, i)] = value
    # ... or the whole sequence twice.
    repeated = {SKEY: table[SKEY]}
    for i, value in enumerate(deltas + deltas):
        repeated[delta_key(G, P, 0, 0, i)] = value
    for t in (doubled, repeated):
        again = must_load(t, 10).engine
        assert view(again, 12) == view(once, 12)
        assert (again.start_offset, again.end_offset) == (once.start_offset, once.end_offset)
    assert_restored(sp, once)


# ------------------------------------------------------------------------------------------------
# A realistic flow with a crash
# ------------------------------------------------------------------------------------------------


def test_flow_acquire_ack_in_steps_crash_and_load() -> None:
    table: Table = {}
    d = create(table, per_snapshot=3)
    sp = d.engine
    got = sp.acquire("m1", 100, log_end_offset=100, now_ms=0)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in got] == [(0, 99, 1)]
    assert d.persist()

    ack(sp, 0, 19, AcknowledgeType.ACCEPT, "m1")
    ack(sp, 20, 29, AcknowledgeType.REJECT, "m1")
    assert d.persist()
    sp.acknowledge(
        "m1",
        [
            AcknowledgementBatch(30, 39, (AcknowledgeType.RELEASE,)),
            AcknowledgementBatch(40, 44, (AcknowledgeType.ACCEPT,) * 5),
            AcknowledgementBatch(
                45,
                48,
                (
                    AcknowledgeType.REJECT,
                    AcknowledgeType.RELEASE,
                    AcknowledgeType.ACCEPT,
                    AcknowledgeType.RELEASE,
                ),
            ),
        ],
        now_ms=0,
    )
    assert d.persist()
    # 30..39 delivered again (count 2) and released again, then a third time (count 3 = limit).
    assert sp.acquire("m2", 10, log_end_offset=100, now_ms=0)[0].first_offset == 30
    assert d.persist()  # the fourth write: a snapshot with epoch 1
    assert d.snapshot_epoch == 1
    ack(sp, 30, 39, AcknowledgeType.RELEASE, "m2")
    acquired = sp.acquire("m2", 12, log_end_offset=100, now_ms=0)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in acquired] == [
        (30, 39, 3),
        (46, 46, 2),
        (48, 48, 2),
    ]
    ack(sp, 90, 99, AcknowledgeType.ACCEPT, "m1")
    assert d.persist()
    assert d.persist() is False
    expected = {o: (sp.record(o).state, sp.record(o).delivery_count) for o in range(100)}
    assert sp.start_offset == 30

    del d  # crash: only the table survives
    restored_d = must_load(table)
    restored = restored_d.engine
    assert_restored(sp, restored)
    # The members never come back: their locks (30 s from now_ms 0) elapse.
    assert restored.expire_locks(30_000) == 10 + 2 + 41
    # Spelled out: 30..39 were Acquired at the delivery limit -> Archived, so the SPSO moves past
    # them and the finished 40..45; 46 and 48 are Available again after their second delivery.
    assert restored.start_offset == 46
    assert restored.end_offset == 100
    for o in range(46, 100):
        state, count = expected[o]
        r = restored.record(o)
        if o in (46, 48):
            assert (state, count) == (AQ, 2)
            assert (r.state, r.delivery_count) == (AV, 2)
        elif o == 47 or o >= 90:
            assert (r.state, r.delivery_count) == (AK, 1)
        else:
            assert (state, count) == (AQ, 1)
            assert (r.state, r.delivery_count) == (AV, 1)
    assert restored_d.state_epoch == 1
    assert list(table) == [SKEY]

    # The restored leader delivers the released records again and keeps persisting.
    again = restored.acquire("m3", 100, log_end_offset=100, now_ms=0)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in again] == [
        (46, 46, 3),
        (48, 48, 3),
        (49, 89, 2),
    ]
    assert restored_d.persist()
    assert delta_keys(table) == [
        delta_key(G, P, restored_d.state_epoch, restored_d.snapshot_epoch, 0)
    ]
    update, _, state_epoch, _ = decode_update(table[delta_keys(table)[0]], where=WHERE)
    assert state_epoch == 1
    assert update.start_offset == 46


def holding_ten(table: Table) -> DurableSharePartition:
    """A share-partition whose records 0..9 are Acquired by member "m", persisted."""
    d = create(table, per_snapshot=100)
    d.engine.acquire("m", 10, log_end_offset=10, now_ms=0)
    d.persist()
    return d


def test_resume_keeps_acquired_records_when_nobody_wrote_since() -> None:
    table: Table = {}
    d = holding_ten(table)
    d.fence("its partition was revoked by a Faust rebalance")
    assert d.resume(leader_epoch=7)
    assert (d.fenced, d.leader_epoch) == (None, 7)
    assert d.engine.acquired_count == 10  # not reloaded: the members still hold them
    ack(d.engine, 0, 9, AcknowledgeType.ACCEPT)
    assert d.persist()  # writes again
    assert must_load(table).engine.start_offset == 10


def test_resume_refuses_when_another_leader_loaded_the_state() -> None:
    table: Table = {}
    d = holding_ten(table)
    d.fence("taken over")
    successor = must_load(table)  # bumps the state epoch, writes a snapshot
    assert not d.resume(leader_epoch=7)
    assert d.fenced == "taken over"
    assert successor.engine.acquired_count == 10  # the successor holds the same locks


def test_resume_refuses_when_a_delta_was_written_after_its_own() -> None:
    table: Table = {}
    d = holding_ten(table)
    twin = DurableSharePartition(
        G,
        T,
        P,
        SharePartition(CFG, 0),
        table,
        100,
        snapshot_epoch=d.snapshot_epoch,
        state_epoch=d.state_epoch,
        delta_index=d.delta_index,
    )
    twin.engine.acquire("x", 1, log_end_offset=10, now_ms=0)
    twin.persist()
    d.fence("revoked")
    assert not d.resume(leader_epoch=7)


def test_resume_refuses_when_the_state_is_gone_or_corrupt() -> None:
    table: Table = {}
    d = create(table, per_snapshot=100)
    d.fence("revoked")
    table[SKEY] = b"garbage"
    assert not d.resume(leader_epoch=7)
    del table[SKEY]
    assert not d.resume(leader_epoch=7)
