"""Key-ordered sharing in the engine (queueflow.engine.key_order; docs/concepts.md
"Key-ordered sharing"): one record per key in flight, each key in offset order, parking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine.key_order import (
    NULL_KEY_HASH,
    KeyOrder,
    ParkedKey,
    consecutive,
    key_hash,
    parse_key_hash,
)
from queueflow.engine.partition import (
    AcknowledgementBatch,
    RecordState,
    SharePartition,
    SharePartitionConfig,
)
from queueflow.errors import CorruptStateError
from queueflow.protocol.state_codec import (
    decode_parked_keys,
    encode_parked_keys,
    parked_keys_key,
    parse_state_key,
)
from queueflow.structs import AcknowledgeType

CFG = SharePartitionConfig(
    max_in_flight_records=100, delivery_count_limit=3, member_max_acquisition_rate=0
)
ACCEPT, RELEASE, REJECT, GAP = (
    AcknowledgeType.ACCEPT,
    AcknowledgeType.RELEASE,
    AcknowledgeType.REJECT,
    AcknowledgeType.GAP,
)


def keyed(
    keys: list[bytes | None], start: int = 0, holes: frozenset[int] = frozenset()
) -> SharePartition:
    sp = SharePartition(CFG, start)
    order = KeyOrder(start)
    order.index(
        [(start + i, k) for i, k in enumerate(keys) if start + i not in holes], start + len(keys)
    )
    sp.order_by_key(order)
    return sp


def offsets(sp: SharePartition, member: str, n: int, end: int, now: int = 0) -> list[int]:
    return [
        o for a in sp.acquire(member, n, end, now) for o in range(a.first_offset, a.last_offset + 1)
    ]


def ack(sp: SharePartition, member: str, offset: int, kind: AcknowledgeType, now: int = 0) -> None:
    sp.acknowledge(member, [AcknowledgementBatch(offset, offset, (kind,))], now)


def test_one_record_per_key_in_flight_and_keys_in_offset_order() -> None:
    sp = keyed([b"a", b"b", b"a", b"c", b"b", b"a"])
    assert offsets(sp, "m1", 10, 6) == [0, 1, 3]  # the first of each key
    assert offsets(sp, "m2", 10, 6) == []  # every key is held
    ack(sp, "m1", 0, ACCEPT)
    assert offsets(sp, "m2", 10, 6) == [2]  # a's next record, at another member
    ack(sp, "m1", 1, RELEASE)  # b's record goes back: b's next is it again, not offset 4
    assert offsets(sp, "m2", 10, 6) == [1]
    assert sp.record(4).state is RecordState.AVAILABLE


def test_records_not_yet_indexed_are_not_acquired_and_holes_are_archived() -> None:
    sp = keyed([b"a", b"a", b"b"], holes=frozenset({1}))
    assert offsets(sp, "m", 10, 50) == [0, 2]  # offset 1 holds no record: no key
    assert sp.record(1).state is RecordState.ARCHIVED  # as a GAP: not counted, nothing parked
    assert sp.end_offset == 3  # offsets 3.. are in the log but not indexed
    assert sp.take_archived() == []


def test_holes_do_not_use_up_max_records_of_a_key_ordered_partition() -> None:
    # Records 0..3, a marker at 4, records 5..8, a marker at 9 (four keys).
    sp = keyed([b"a", b"b", b"c", b"d", b"", b"e", b"f", b"g", b"h", b""], holes=frozenset({4, 9}))
    assert offsets(sp, "m", 5, 10) == [0, 1, 2, 3, 5]
    assert offsets(sp, "m", 5, 10) == [6, 7, 8]
    for o in (0, 1, 2, 3, 5, 6, 7, 8):
        ack(sp, "m", o, ACCEPT)
    assert sp.start_offset == 10  # past the trailing marker


def test_null_keys_are_one_key() -> None:
    sp = keyed([None, b"x", None])
    assert offsets(sp, "m", 10, 3) == [0, 1]
    assert key_hash(None) == NULL_KEY_HASH != key_hash(b"")
    assert parse_key_hash("<null>") == NULL_KEY_HASH


def test_a_rejected_record_parks_its_key_until_released() -> None:
    sp = keyed([b"a", b"b", b"a", b"b", b"a"])
    order = sp.key_order
    assert order is not None
    assert offsets(sp, "m", 10, 5) == [0, 1]
    ack(sp, "m", 0, REJECT)
    ack(sp, "m", 1, ACCEPT)
    assert [p.offset for p in order.parked_keys()] == [0]
    assert order.parked["a"] == ParkedKey(key_hash(b"a"), 0, "rejected", "a")
    assert offsets(sp, "m", 10, 5) == [3]  # b goes on, a waits
    assert order.release(key_hash(b"a")) is not None
    assert order.release(key_hash(b"a")) is None
    assert offsets(sp, "m", 10, 5) == [2]


def test_the_delivery_limit_parks_and_a_gap_does_not() -> None:
    sp = keyed([b"a", b"a", b"b", b"b"])
    order = sp.key_order
    assert order is not None
    for now in (0, 1, 2):
        assert offsets(sp, "m", 1, 4, now) == [0]
        ack(sp, "m", 0, RELEASE, now)
    assert sp.record(0).state is RecordState.ARCHIVED
    assert order.parked["a"].reason == "delivery_limit"
    assert offsets(sp, "m", 10, 4) == [2]
    ack(sp, "m", 2, GAP)
    assert "b" not in order.parked
    assert offsets(sp, "m", 10, 4) == [3]


def test_an_expired_lock_at_the_limit_parks() -> None:
    sp = keyed([b"a", b"a"])
    for now in (0, 100_000, 200_000):
        assert offsets(sp, "m", 1, 2, now) == [0]
        sp.expire_locks(now + 90_000)
    order = sp.key_order
    assert order is not None and order.is_parked(key_hash(b"a"))
    assert offsets(sp, "m", 5, 2, 300_000) == []


def test_waiting_records_of_a_key_and_a_reset_clears_parking() -> None:
    sp = keyed([b"a", b"a", b"b", b"a"])
    order = sp.key_order
    assert order is not None
    assert offsets(sp, "m", 10, 4) == [0, 2]
    ack(sp, "m", 0, REJECT)
    runs = [(r.first_offset, r.last_offset, r.state) for r in sp.in_flight()]
    assert order.waiting(key_hash(b"a"), runs, sp.end_offset, 100) == [1, 3]
    assert order.waiting(key_hash(b"a"), runs, sp.end_offset, 3) == [1]  # the in-flight limit
    assert sp.archive_available([1, 3]) == 2 and sp.end_offset == 4
    ack(sp, "m", 2, ACCEPT)
    assert sp.start_offset == 4
    sp.reset_start_offset(2)
    assert order.parked_keys() == [] and order.indexed_end == 2


def test_consecutive_and_parse() -> None:
    assert list(consecutive([0, 1, 2, 5, 7, 8])) == [(0, 2), (5, 5), (7, 8)]
    assert list(consecutive([])) == []
    assert parse_key_hash("hash:00000000000000ff") == 255
    assert parse_key_hash("acct-1") == key_hash(b"acct-1")


# -- properties -------------------------------------------------------------------------------

_op = st.one_of(
    st.tuples(st.just("acquire"), st.integers(0, 3), st.integers(1, 6)),
    st.tuples(st.just("ack"), st.integers(0, 3), st.sampled_from([ACCEPT, RELEASE, REJECT])),
    st.tuples(st.just("expire"), st.integers(0, 3), st.integers(0, 0)),
    st.tuples(st.just("release_key"), st.integers(0, 4), st.integers(0, 0)),
)


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    ops=st.lists(_op, max_size=80),
    holes=st.frozensets(st.integers(0, 39), max_size=8),
)
def test_same_key_never_in_flight_twice_and_always_in_offset_order(
    keys: list[int], ops: list[tuple[str, int, object]], holes: frozenset[int]
) -> None:
    sp = keyed([str(k).encode() for k in keys], holes=holes)
    order = sp.key_order
    assert order is not None
    # Offsets without a record have a key of their own here: never acquired (asserted below).
    key_at = {
        o: key_hash(str(k if o not in holes else f"hole{o}").encode()) for o, k in enumerate(keys)
    }
    held: dict[str, list[int]] = {f"m{i}": [] for i in range(4)}
    now = 0
    for kind, who, arg in ops:
        member = f"m{who}"
        now += 1_000
        if kind == "acquire":
            assert isinstance(arg, int)
            got = offsets(sp, member, arg, len(keys), now)
            assert not holes & set(got)
            for o in got:
                k = key_at[o]
                assert not order.is_parked(k)
                # every earlier record of its key is done
                for earlier in range(sp.start_offset, o):
                    if key_at[earlier] == k:
                        assert sp.record(earlier).state in (
                            RecordState.ACKNOWLEDGED,
                            RecordState.ARCHIVED,
                        ), (o, earlier)
            held[member].extend(got)
        elif kind == "ack" and held[member]:
            o = held[member].pop(0)
            if sp.record(o).member_id == member:
                assert isinstance(arg, AcknowledgeType)
                ack(sp, member, o, arg, now)
        elif kind == "expire":
            sp.expire_locks(now + 60_000)
            for h in held.values():
                h.clear()
        elif kind == "release_key":
            order.release(key_hash(str(who).encode()))
        # invariant: at most one Acquired record per key
        acquired = [
            key_at[o]
            for r in sp.in_flight()
            if r.state is RecordState.ACQUIRED
            for o in range(r.first_offset, r.last_offset + 1)
        ]
        assert len(acquired) == len(set(acquired))
    # liveness: once every key is free and nothing is held, something Available is acquired
    sp.expire_locks(now + 10**9)
    for p in order.parked_keys():
        order.release(p.key_hash)
    waiting = [
        o
        for r in sp.in_flight()
        if r.state is RecordState.AVAILABLE
        for o in range(r.first_offset, r.last_offset + 1)
    ]
    if set(waiting + list(range(sp.end_offset, len(keys)))) - holes:
        assert offsets(sp, "late", 100, len(keys), now + 10**9 + 1)


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**62),
            st.sampled_from(["rejected", "delivery_limit"]),
            st.text(max_size=100),
        ),
        max_size=20,
    )
)
def test_parked_keys_round_trip_through_their_state_table_value(
    rows: list[tuple[int, int, str, str]],
) -> None:
    parked = [ParkedKey(*row) for row in rows]
    assert decode_parked_keys(encode_parked_keys(parked), where="t") == parked
    assert parked_keys_key("g/x", 3) == b"K/g/x/3"
    assert parse_state_key(b"K/g/x/3") == ("K", "g/x", 3, None)


def test_corrupt_parked_keys_are_refused_naming_the_share_partition() -> None:
    with pytest.raises(CorruptStateError, match="corrupt parked keys for here"):
        decode_parked_keys(b"{not json", where="here")
    with pytest.raises(CorruptStateError, match="unknown share-partition state format version 9"):
        decode_parked_keys(b'{"type":"parked_keys","v":9,"keys":[]}', where="here")
