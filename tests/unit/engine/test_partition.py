"""Targeted tests of every KIP-932 rule the share-partition engine implements."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    AcquiredRecords,
    RecordState,
    RecordView,
    RunView,
    SharePartition,
    SharePartitionConfig,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    replay,
)
from queueflow.errors import (
    ConfigurationError,
    CorruptStateError,
    ErrorCode,
    InvalidRecordStateError,
    InvalidRequestError,
)

AV = RecordState.AVAILABLE
AQ = RecordState.ACQUIRED
AK = RecordState.ACKNOWLEDGED
AR = RecordState.ARCHIVED
A = AcknowledgeType

CFG = SharePartitionConfig()


def batch(first: int, last: int, *types: AcknowledgeType) -> AcknowledgementBatch:
    return AcknowledgementBatch(first, last, tuple(types))


def states(sp: SharePartition, first: int, last: int) -> list[tuple[RecordState, int]]:
    return [(sp.record(o).state, sp.record(o).delivery_count) for o in range(first, last + 1)]


def full_state(sp: SharePartition) -> tuple[object, ...]:
    """Everything observable about a share-partition, to check that nothing changed."""
    return (
        sp.start_offset,
        sp.end_offset,
        tuple(sp.in_flight()),
        sp.acquired_count,
        sp.available_count,
        sp.next_lock_deadline(),
        sp.snapshot(),
    )


# ------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------


def test_config_defaults_are_kafkas() -> None:
    assert CFG.max_in_flight_records == 2000
    assert CFG.delivery_count_limit == 5
    assert CFG.record_lock_duration_ms == 30000
    assert CFG.max_record_lock_duration_ms == 60000


@pytest.mark.parametrize(
    ("kwargs", "name", "value", "allowed"),
    [
        ({"max_in_flight_records": 99}, "group.share.partition.max.record.locks", 99, "100..10000"),
        (
            {"max_in_flight_records": 10001},
            "group.share.partition.max.record.locks",
            10001,
            "100..10000",
        ),
        # A group's share.delivery.count.limit may reach group.share.max.delivery.count.limit's
        # maximum (KIP-1240), so the engine accepts up to 25.
        ({"delivery_count_limit": 1}, "group.share.delivery.count.limit", 1, "2..25"),
        ({"delivery_count_limit": 26}, "group.share.delivery.count.limit", 26, "2..25"),
        ({"record_lock_duration_ms": 999}, "group.share.record.lock.duration.ms", 999, "1000.."),
        (
            {"max_record_lock_duration_ms": 29999},
            "group.share.max.record.lock.duration.ms",
            29999,
            "30000..3600000",
        ),
        (
            {"max_record_lock_duration_ms": 3600001},
            "group.share.max.record.lock.duration.ms",
            3600001,
            "30000..3600000",
        ),
        (
            {"record_lock_duration_ms": 70000},
            "group.share.record.lock.duration.ms",
            70000,
            "1000..60000",
        ),
    ],
)
def test_config_validation_names_setting_value_and_range(
    kwargs: dict[str, int], name: str, value: int, allowed: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        SharePartitionConfig(**kwargs)
    message = str(info.value)
    assert name in message
    assert str(value) in message
    assert allowed in message


def test_config_rejects_non_integers() -> None:
    with pytest.raises(ConfigurationError, match=r"group\.share\.delivery\.count\.limit"):
        SharePartitionConfig(delivery_count_limit="5")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"group\.share\.partition\.max\.record\.locks"):
        SharePartitionConfig(max_in_flight_records=True)


def test_config_accepts_range_edges() -> None:
    SharePartitionConfig(100, 2, 1000, 30000).validate()
    SharePartitionConfig(10000, 10, 3600000, 3600000).validate()


# ------------------------------------------------------------------------------------------------
# Acquire
# ------------------------------------------------------------------------------------------------


def test_new_partition_is_empty() -> None:
    sp = SharePartition(CFG, 42)
    assert (sp.start_offset, sp.end_offset, sp.in_flight_count) == (42, 42, 0)
    assert list(sp.in_flight()) == []
    assert sp.next_lock_deadline() is None
    assert sp.record(41) == RecordView(AR, 0, None, None)
    assert sp.record(42) == RecordView(AV, 0, None, None)
    with pytest.raises(InvalidRequestError):
        SharePartition(CFG, -1)


def test_acquire_locks_records_for_the_member() -> None:
    sp = SharePartition(CFG, 0)
    assert sp.acquire("m1", 5, log_end_offset=100, now_ms=1000) == [AcquiredRecords(0, 4, 1)]
    assert sp.end_offset == 5
    assert sp.record(3) == RecordView(AQ, 1, "m1", 31000)
    assert list(sp.in_flight()) == [RunView(0, 4, AQ, 1, "m1", 31000)]
    assert sp.acquired_count == 5 and sp.available_count == 0
    assert sp.next_lock_deadline() == 31000
    # Acquired records are never acquired again, by anyone.
    assert sp.acquire("m2", 3, 100, 2000) == [AcquiredRecords(5, 7, 1)]
    assert sp.record(6).member_id == "m2"


def test_acquire_stops_at_log_end_and_treats_low_log_end_as_speo() -> None:
    sp = SharePartition(CFG, 10)
    assert sp.acquire("m", 500, log_end_offset=10, now_ms=0) == []
    assert sp.acquire("m", 500, log_end_offset=13, now_ms=0) == [AcquiredRecords(10, 12, 1)]
    # A stale log end below the SPEO means "no new records"; the SPEO never moves back.
    assert sp.acquire("m", 500, log_end_offset=5, now_ms=0) == []
    assert sp.end_offset == 13


def test_acquire_validates_arguments() -> None:
    sp = SharePartition(CFG, 0)
    with pytest.raises(InvalidRequestError) as info:
        sp.acquire("m", 0, 10, 0)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(InvalidRequestError):
        sp.acquire("", 1, 10, 0)
    assert sp.end_offset == 0


def test_consumer_lock_duration_bounds() -> None:
    cfg = SharePartitionConfig(max_record_lock_duration_ms=45000)
    sp = SharePartition(cfg, 0)
    for bad in (999, 45001, 0, -5):
        with pytest.raises(InvalidRequestError, match="lock duration"):
            sp.acquire("m", 1, 10, 0, lock_duration_ms=bad)
    assert sp.end_offset == 0
    sp.acquire("m", 1, 10, 100, lock_duration_ms=1000)
    sp.acquire("m", 1, 10, 100, lock_duration_ms=45000)
    sp.acquire("m", 1, 10, 100)
    assert [sp.record(o).lock_deadline_ms for o in range(3)] == [1100, 45100, 30100]


def test_acquire_prefers_released_records_then_new_ones_in_offset_order() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m1", 10, 10, 0)
    sp.acknowledge("m1", [batch(2, 3, A.RELEASE), batch(6, 6, A.RELEASE)], 1)
    sp.acknowledge("m1", [batch(0, 0, A.ACCEPT)], 1)
    got = sp.acquire("m2", 5, log_end_offset=20, now_ms=2)
    # Released 2-3 and 6 come back with delivery count 2, then new 10-11 with count 1.
    assert got == [
        AcquiredRecords(2, 3, 2),
        AcquiredRecords(6, 6, 2),
        AcquiredRecords(10, 11, 1),
    ]
    assert sp.available_count == 0


def test_acquire_partial_available_run() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m1", 10, 10, 0)
    sp.acknowledge("m1", [batch(0, 9, A.RELEASE)], 1)
    assert sp.acquire("m2", 4, 10, 2) == [AcquiredRecords(0, 3, 2)]
    assert states(sp, 3, 4) == [(AQ, 2), (AV, 1)]
    assert sp.available_count == 6
    assert sp.acquire("m3", 100, 10, 3) == [AcquiredRecords(4, 9, 2)]


def test_in_flight_limit() -> None:
    cfg = SharePartitionConfig(max_in_flight_records=100)
    sp = SharePartition(cfg, 0)
    assert sp.acquire("m", 150, 1000, 0) == [AcquiredRecords(0, 99, 1)]
    assert sp.in_flight_count == 100
    # At the limit: no new records ...
    assert sp.acquire("m", 10, 1000, 0) == []
    # ... but released records inside the window can still be acquired.
    sp.acknowledge("m", [batch(50, 54, A.RELEASE)], 1)
    assert sp.acquire("m2", 10, 1000, 2) == [AcquiredRecords(50, 54, 2)]
    # Acknowledging the head moves the SPSO, which makes room for exactly that many more.
    sp.acknowledge("m", [batch(0, 9, A.ACCEPT)], 3)
    assert sp.start_offset == 10
    assert sp.acquire("m", 500, 1000, 4) == [AcquiredRecords(100, 109, 1)]
    assert sp.end_offset - sp.start_offset == 100
    # Acknowledging records in the middle does not move the SPSO, so there is still no room.
    sp.acknowledge("m", [batch(60, 69, A.ACCEPT)], 5)
    assert sp.acquire("m", 500, 1000, 6) == []


# ------------------------------------------------------------------------------------------------
# Acknowledge
# ------------------------------------------------------------------------------------------------


def test_accept_advances_spso_past_acknowledged_prefix() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m", 10, 10, 0)
    sp.acknowledge("m", [batch(3, 5, A.ACCEPT)], 1)
    assert sp.start_offset == 0
    assert states(sp, 2, 6) == [(AQ, 1), (AK, 1), (AK, 1), (AK, 1), (AQ, 1)]
    assert sp.record(4).member_id is None and sp.record(4).lock_deadline_ms is None
    sp.acknowledge("m", [batch(0, 2, A.ACCEPT)], 2)
    assert sp.start_offset == 6
    # Offsets below the SPSO are reported Archived, count 0 (no longer tracked).
    assert sp.record(4) == RecordView(AR, 0, None, None)
    sp.acknowledge("m", [batch(6, 9, A.ACCEPT)], 3)
    assert (sp.start_offset, sp.end_offset, sp.run_count) == (10, 10, 0)


def test_reject_and_gap_archive() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m", 6, 6, 0)
    sp.acknowledge("m", [batch(1, 1, A.REJECT), batch(3, 4, A.GAP)], 1)
    assert states(sp, 0, 5) == [(AQ, 1), (AR, 1), (AQ, 1), (AR, 1), (AR, 1), (AQ, 1)]
    assert sp.available_count == 0 and sp.acquired_count == 3
    # Archived records are never acquired again.
    sp.acknowledge("m", [batch(0, 0, A.RELEASE), batch(2, 2, A.RELEASE)], 2)
    assert sp.acquire("m", 10, 6, 3) == [AcquiredRecords(0, 0, 2), AcquiredRecords(2, 2, 2)]
    sp.acknowledge("m", [batch(0, 0, A.ACCEPT), batch(2, 2, A.REJECT), batch(5, 5, A.GAP)], 4)
    assert (sp.start_offset, sp.end_offset) == (6, 6)


def test_per_offset_acknowledge_types() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m", 5, 5, 0)
    sp.acknowledge("m", [batch(0, 4, A.RELEASE, A.ACCEPT, A.REJECT, A.GAP, A.RELEASE)], 1)
    assert states(sp, 0, 4) == [(AV, 1), (AK, 1), (AR, 1), (AR, 1), (AV, 1)]
    assert sp.available_count == 2
    assert sp.next_lock_deadline() is None


def test_release_archives_at_delivery_count_limit() -> None:
    sp = SharePartition(SharePartitionConfig(delivery_count_limit=3), 0)
    sp.acquire("m", 1, 2, 0)  # offset 0, delivery 1
    sp.acquire("m", 1, 2, 0)  # offset 1 keeps the SPSO at 0
    for attempt in (1, 2):
        sp.acknowledge("m", [batch(0, 0, A.RELEASE)], attempt)
        assert sp.record(0) == RecordView(AV, attempt, None, None)
        assert sp.acquire("m", 1, 2, attempt) == [AcquiredRecords(0, 0, attempt + 1)]
    # Third delivery failed: delivery count == limit -> Archived, never delivered again.
    sp.acknowledge("m", [batch(0, 0, A.RELEASE)], 3)
    assert sp.start_offset == 1
    assert sp.record(0) == RecordView(AR, 0, None, None)
    assert sp.acquire("m", 10, 2, 4) == []


def test_lock_expiry_archives_at_delivery_count_limit() -> None:
    sp = SharePartition(SharePartitionConfig(delivery_count_limit=2), 0)
    sp.acquire("m", 2, 2, now_ms=0, lock_duration_ms=1000)
    sp.acknowledge("m", [batch(1, 1, A.ACCEPT)], 1)
    assert sp.expire_locks(999) == 0
    assert sp.expire_locks(1000) == 1
    assert sp.record(0) == RecordView(AV, 1, None, None)
    assert sp.acquire("m2", 5, 2, 2000) == [AcquiredRecords(0, 0, 2)]
    assert sp.expire_locks(2000 + 30000) == 1
    # Second attempt timed out at the limit of 2 -> Archived, so the SPSO moves past 0 and 1.
    assert (sp.start_offset, sp.end_offset) == (2, 2)


def test_atomic_rejection_of_request_with_one_bad_part() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m", 10, 10, 0)
    sp.acquire("other", 5, 15, 0)
    sp.acknowledge("m", [batch(5, 5, A.ACCEPT)], 0)  # m holds 0-4 and 6-9; "other" holds 10-14
    sp.take_changes()
    before = full_state(sp)
    bad_requests: list[tuple[type[Exception], list[AcknowledgementBatch]]] = [
        # Good first batch, second names another member's record.
        (InvalidRecordStateError, [batch(0, 3, A.ACCEPT), batch(10, 10, A.ACCEPT)]),
        # Good first batch, second names an already acknowledged record.
        (InvalidRecordStateError, [batch(0, 3, A.REJECT), batch(4, 5, A.ACCEPT)]),
        # Overlapping batches.
        (InvalidRequestError, [batch(0, 3, A.ACCEPT), batch(3, 4, A.ACCEPT)]),
        # Unordered batches.
        (InvalidRequestError, [batch(6, 7, A.ACCEPT), batch(0, 3, A.ACCEPT)]),
        # first > last.
        (InvalidRequestError, [batch(0, 3, A.ACCEPT), batch(8, 7, A.ACCEPT)]),
        # Wrong number of acknowledge types (neither 1 nor one per offset).
        (InvalidRequestError, [batch(0, 3, A.ACCEPT), batch(6, 8, A.ACCEPT, A.ACCEPT)]),
        (InvalidRequestError, [batch(0, 3)]),
        # Unknown acknowledge type.
        (
            InvalidRequestError,
            [AcknowledgementBatch(0, 1, (7,))],  # type: ignore[arg-type]
        ),
        # Out of range: at/after the SPEO, and a structural error wins over a state error.
        (InvalidRequestError, [batch(10, 10, A.ACCEPT), batch(15, 15, A.ACCEPT)]),
    ]
    for error, request in bad_requests:
        with pytest.raises(error):
            sp.acknowledge("m", request, 1)
        assert full_state(sp) == before, request
        assert sp.take_changes() is None


def test_stale_acknowledgements_name_every_offset_the_member_cannot_acknowledge() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m", 10, 10, 0)  # m holds 0-9
    sp.acknowledge("m", [batch(0, 1, A.ACCEPT)], 0)  # SPSO -> 2
    sp.acquire("other", 5, 15, 0)  # other holds 10-14
    sp.acknowledge("m", [batch(4, 4, A.ACCEPT), batch(6, 6, A.RELEASE)], 0)
    request = [
        batch(0, 3, A.ACCEPT),
        batch(4, 9, A.ACCEPT),
        batch(10, 11, A.ACCEPT),
        batch(15, 16, A.ACCEPT),
    ]
    with pytest.raises(InvalidRequestError):  # 0..1 is below the SPSO
        sp.acknowledge("m", request, 1)
    # below the SPSO, acknowledged, Available, another member's, at/after the SPEO
    assert sp.stale_acknowledgements("m", request) == [(0, 1), (4, 4), (6, 6), (10, 11), (15, 16)]
    assert sp.stale_acknowledgements("m", [batch(2, 3, A.ACCEPT)]) == []
    assert sp.stale_acknowledgements("nobody", [batch(2, 3, A.ACCEPT)]) == [(2, 3)]
    # what is left once the stale offsets are taken out is accepted
    sp.acknowledge("m", [batch(2, 3, A.ACCEPT), batch(5, 5, A.ACCEPT), batch(7, 9, A.ACCEPT)], 1)
    assert sp.start_offset == 6


@given(
    st.lists(st.tuples(st.sampled_from(["m", "x"]), st.integers(1, 6)), max_size=6),
    st.sets(st.integers(0, 40), max_size=30),
    st.sets(st.integers(0, 40), max_size=30),
)
@settings(max_examples=200, deadline=None)
def test_property_acknowledging_all_but_the_stale_offsets_succeeds(
    acquisitions: list[tuple[str, int]], accepted: set[int], requested: set[int]
) -> None:
    sp = SharePartition(CFG, 0)
    for member, count in acquisitions:
        sp.acquire(member, count, 30, 0)
    held = {o for o in range(sp.start_offset, sp.end_offset) if sp.record(o).member_id == "m"}
    if accepted & held:
        sp.acknowledge("m", [batch(o, o, A.ACCEPT) for o in sorted(accepted & held)], 0)
    request = [batch(o, o, A.ACCEPT) for o in sorted(requested)]
    stale = {o for lo, hi in sp.stale_acknowledgements("m", request) for o in range(lo, hi + 1)}
    valid = {o for o in requested if o not in stale}
    assert stale <= requested
    in_window = range(sp.start_offset, sp.end_offset)
    mine = {o for o in in_window if sp.record(o).state is AQ and sp.record(o).member_id == "m"}
    assert valid == requested & mine
    before = full_state(sp)
    if stale:
        with pytest.raises((InvalidRecordStateError, InvalidRequestError)):
            sp.acknowledge("m", request, 0)
        assert full_state(sp) == before
    if valid:
        sp.acknowledge("m", [batch(o, o, A.ACCEPT) for o in sorted(valid)], 0)


def test_acknowledging_someone_elses_or_unacquired_records() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("alice", 3, 3, 0)
    with pytest.raises(InvalidRecordStateError) as info:
        sp.acknowledge("bob", [batch(0, 0, A.ACCEPT)], 1)
    assert info.value.code is ErrorCode.INVALID_RECORD_STATE
    assert "bob" in str(info.value)
    sp.acknowledge("alice", [batch(0, 0, A.RELEASE)], 1)
    with pytest.raises(InvalidRecordStateError, match="AVAILABLE"):
        sp.acknowledge("alice", [batch(0, 0, A.ACCEPT)], 1)
    sp.acknowledge("alice", [batch(2, 2, A.ACCEPT)], 1)
    with pytest.raises(InvalidRecordStateError, match="ACKNOWLEDGED"):
        sp.acknowledge("alice", [batch(2, 2, A.ACCEPT)], 1)
    # After its lock expired, the old owner can no longer acknowledge.
    sp.expire_locks(10**9)
    with pytest.raises(InvalidRecordStateError):
        sp.acknowledge("alice", [batch(1, 1, A.ACCEPT)], 1)


def test_acknowledge_out_of_range() -> None:
    sp = SharePartition(CFG, 100)
    sp.acquire("m", 10, 110, 0)
    sp.acknowledge("m", [batch(100, 101, A.ACCEPT)], 0)
    for first, last in ((99, 99), (101, 102), (110, 110), (105, 110), (-1, 0)):
        with pytest.raises(InvalidRequestError, match="outside the in-flight records"):
            sp.acknowledge("m", [batch(first, last, A.ACCEPT)], 1)
    assert sp.acquired_count == 8


def test_empty_acknowledgement_is_a_no_op() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m", 3, 3, 0)
    before = full_state(sp)
    sp.acknowledge("m", [], 1)
    assert full_state(sp) == before


# ------------------------------------------------------------------------------------------------
# Releases and lock expiry
# ------------------------------------------------------------------------------------------------


def test_release_member() -> None:
    sp = SharePartition(SharePartitionConfig(delivery_count_limit=2), 0)
    sp.acquire("a", 3, 10, 0)  # 0-2
    sp.acquire("b", 2, 10, 0)  # 3-4
    sp.acquire("a", 2, 10, 0)  # 5-6
    sp.acknowledge("a", [batch(1, 1, A.ACCEPT)], 1)
    assert sp.release_member("a", 2) == 4  # 0, 2, 5, 6
    assert states(sp, 0, 6) == [(AV, 1), (AK, 1), (AV, 1), (AQ, 1), (AQ, 1), (AV, 1), (AV, 1)]
    assert sp.release_member("a", 3) == 0
    assert sp.release_member("nobody", 3) == 0
    # At the delivery limit a released record is Archived; the SPSO moves past it.
    assert sp.acquire("c", 1, 10, 4) == [AcquiredRecords(0, 0, 2)]
    assert sp.release_member("c", 5) == 1
    assert sp.start_offset == 2
    assert sp.acquired_count == 2  # b's records are untouched


def test_expire_locks_releases_only_elapsed_locks() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("a", 2, 10, now_ms=0, lock_duration_ms=1000)  # 0-1, deadline 1000
    sp.acquire("b", 2, 10, now_ms=0, lock_duration_ms=2000)  # 2-3, deadline 2000
    sp.acquire("c", 2, 10, now_ms=500, lock_duration_ms=1000)  # 4-5, deadline 1500
    assert sp.next_lock_deadline() == 1000
    assert sp.expire_locks(999) == 0
    assert sp.expire_locks(1500) == 4  # deadline <= now: 0-1 and 4-5
    assert states(sp, 0, 5) == [(AV, 1), (AV, 1), (AQ, 1), (AQ, 1), (AV, 1), (AV, 1)]
    assert sp.next_lock_deadline() == 2000
    sp.acknowledge("b", [batch(2, 3, A.ACCEPT)], 1600)
    assert sp.next_lock_deadline() is None
    assert sp.expire_locks(10**12) == 0


def test_expire_after_partial_acknowledgement_and_reacquisition() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("a", 10, 10, now_ms=0, lock_duration_ms=1000)
    sp.acknowledge("a", [batch(2, 3, A.RELEASE), batch(5, 5, A.ACCEPT)], 1)
    # 2-3 re-acquired with a later deadline; only 0-1, 4, 6-9 keep deadline 1000.
    sp.acquire("b", 10, 10, now_ms=10, lock_duration_ms=5000)
    assert sp.expire_locks(1000) == 7
    assert sp.record(2) == RecordView(AQ, 2, "b", 5010)
    assert sp.next_lock_deadline() == 5010
    assert sp.expire_locks(5010) == 2
    assert sp.acquired_count == 0 and sp.available_count == 9


def test_lock_deadline_reused_after_settlement() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("a", 1, 10, now_ms=0, lock_duration_ms=1000)
    sp.acknowledge("a", [batch(0, 0, A.ACCEPT)], 0)
    assert sp.next_lock_deadline() is None
    sp.acquire("a", 1, 10, now_ms=0, lock_duration_ms=1000)  # same deadline value again
    assert sp.next_lock_deadline() == 1000
    assert sp.expire_locks(1000) == 1
    assert sp.next_lock_deadline() is None


# ------------------------------------------------------------------------------------------------
# Admin reset
# ------------------------------------------------------------------------------------------------


def test_reset_start_offset() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m", 10, 10, 0)
    sp.take_changes()
    with pytest.raises(InvalidRequestError, match="must be empty"):
        sp.reset_start_offset(0)
    assert sp.acquired_count == 10
    sp.release_member("m", 1)
    with pytest.raises(InvalidRequestError):
        sp.reset_start_offset(-1)
    sp.reset_start_offset(5)
    assert (sp.start_offset, sp.end_offset, sp.in_flight_count) == (5, 5, 0)
    # All in-flight state and delivery counts are discarded.
    assert sp.record(7) == RecordView(AV, 0, None, None)
    assert sp.record(4) == RecordView(AR, 0, None, None)
    assert sp.snapshot() == (5, ())
    assert sp.take_changes() == ShareUpdate(5, (), reset=True)
    assert sp.take_changes() is None
    assert sp.acquire("m", 3, 10, 2) == [AcquiredRecords(5, 7, 1)]
    # Resetting backwards (to an earlier offset) is allowed too, once the group is empty.
    sp.release_member("m", 3)
    sp.acquire("m", 1, 10, 4)  # 5 again, count 2
    sp.acknowledge("m", [batch(5, 5, A.ACCEPT)], 5)
    sp.reset_start_offset(0)
    assert sp.acquire("m", 2, 10, 6) == [AcquiredRecords(0, 1, 1)]
    update = sp.take_changes()
    assert update == ShareUpdate(0, (StateBatch(0, 1, AQ, 1, "m", 30_006),), reset=True)


# ------------------------------------------------------------------------------------------------
# Memory: runs
# ------------------------------------------------------------------------------------------------


def test_batch_of_500_costs_one_run() -> None:
    sp = SharePartition(CFG, 1000)
    assert sp.acquire("a", 500, 5000, 0) == [AcquiredRecords(1000, 1499, 1)]
    assert sp.run_count == 1 and len(list(sp.in_flight())) == 1
    assert sp.acquire("b", 500, 5000, 0) == [AcquiredRecords(1500, 1999, 1)]
    assert sp.run_count == 2
    sp.acknowledge("a", [batch(1000, 1499, A.ACCEPT)], 1)
    assert sp.run_count == 1
    sp.acknowledge("b", [batch(1500, 1999, A.ACCEPT)], 1)
    assert sp.run_count == 0
    assert (sp.start_offset, sp.end_offset) == (2000, 2000)


def test_runs_split_and_merge_back() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("a", 100, 100, 0)
    sp.acknowledge("a", [batch(10, 10, A.RELEASE), batch(20, 29, A.RELEASE)], 1)
    assert sp.run_count == 5
    # Re-acquired together by the same member at the same time: still separate runs, because
    # their delivery count (2) differs from their neighbours' (1).
    sp.acquire("a", 11, 100, 0)
    assert sp.run_count == 5
    sp.acknowledge("a", [batch(0, 99, A.ACCEPT)], 2)
    assert sp.run_count == 0
    # Adjacent runs that become equal merge.
    sp.acquire("a", 10, 200, 5)
    sp.acknowledge("a", [batch(102, 102, A.RELEASE)], 6)
    assert sp.run_count == 3
    sp.release_member("a", 7)
    assert list(sp.in_flight()) == [RunView(100, 109, AV, 1, None, None)]


# ------------------------------------------------------------------------------------------------
# Durability
# ------------------------------------------------------------------------------------------------


def test_take_changes_content() -> None:
    sp = SharePartition(CFG, 0)
    assert sp.take_changes() is None
    sp.acquire("m", 10, 10, 0)
    # The delivery count is persisted at acquisition, with the lock: owner and deadline.
    assert sp.take_changes() == ShareUpdate(0, (StateBatch(0, 9, AQ, 1, "m", 30_000),))
    assert sp.take_changes() is None
    sp.acknowledge("m", [batch(3, 4, A.ACCEPT), batch(7, 7, A.REJECT)], 1)
    assert sp.take_changes() == ShareUpdate(0, (StateBatch(3, 4, AK, 1), StateBatch(7, 7, AR, 1)))
    # Releasing: Available, count 1.
    sp.acknowledge("m", [batch(8, 8, A.RELEASE)], 2)
    assert sp.take_changes() == ShareUpdate(0, (StateBatch(8, 8, AV, 1),))
    # Moving the SPSO is a change; batches below it are not reported.
    sp.acknowledge("m", [batch(0, 2, A.ACCEPT)], 3)
    assert sp.take_changes() == ShareUpdate(5, ())
    # A failed request is not a change.
    with pytest.raises(InvalidRecordStateError):
        sp.acknowledge("m", [batch(8, 8, A.ACCEPT)], 4)
    assert sp.take_changes() is None
    # An acquire spanning released and new records; several mutations coalesce.
    sp.acquire("n", 3, 12, 5)  # 8 (count 2), 10, 11
    sp.acknowledge("m", [batch(5, 6, A.ACCEPT)], 6)
    assert sp.take_changes() == ShareUpdate(
        8, (StateBatch(8, 8, AQ, 2, "n", 30_005), StateBatch(10, 11, AQ, 1, "n", 30_005))
    )


def test_changes_replay_to_snapshot() -> None:
    sp = SharePartition(SharePartitionConfig(delivery_count_limit=2), 0)
    updates: list[ShareUpdate] = []
    start = ShareSnapshot(0, 0, 0, 0, ())
    ops = [
        lambda: sp.acquire("a", 20, 50, 0, lock_duration_ms=1000),
        lambda: sp.acknowledge("a", [batch(5, 9, A.RELEASE), batch(12, 12, A.REJECT)], 1),
        lambda: sp.acquire("b", 8, 50, 10),
        lambda: sp.expire_locks(1000),
        lambda: sp.acquire("c", 30, 50, 1100),
        lambda: sp.release_member("c", 1200),
        lambda: sp.acknowledge("b", [batch(5, 9, A.ACCEPT)], 1300),
    ]
    for op in ops:
        op()
        update = sp.take_changes()
        if update is not None:
            updates.append(update)
        assert replay(start, updates) == sp.snapshot()


def test_snapshot_and_restore_round_trip() -> None:
    sp = SharePartition(CFG, 10)
    sp.acquire("a", 10, 30, 0)  # 10-19
    sp.acknowledge("a", [batch(12, 13, A.ACCEPT), batch(15, 15, A.RELEASE)], 1)
    sp.acknowledge("a", [batch(17, 17, A.REJECT)], 1)
    sp.acquire("b", 1, 30, 2)  # 15 again (count 2)
    spso, batches = sp.snapshot()
    assert spso == 10
    assert batches == (
        StateBatch(10, 11, AQ, 1, "a", 30_000),
        StateBatch(12, 13, AK, 1),
        StateBatch(14, 14, AQ, 1, "a", 30_000),
        StateBatch(15, 15, AQ, 2, "b", 30_002),
        StateBatch(16, 16, AQ, 1, "a", 30_000),
        StateBatch(17, 17, AR, 1),
        StateBatch(18, 19, AQ, 1, "a", 30_000),
    )
    restored = SharePartition.restore(CFG, spso, batches)
    assert (restored.start_offset, restored.end_offset) == (10, 20)
    for o in range(8, 22):
        assert restored.record(o) == sp.record(o)
    assert restored.snapshot() == sp.snapshot()
    assert restored.acquired_count == 7 and restored.available_count == 0
    assert restored.next_lock_deadline() == 30_000
    assert restored.take_changes() is None
    # The locks hold: nothing to acquire until they elapse.
    assert restored.acquire("c", 3, 20, 1) == []
    assert restored.expire_locks(30_000) == 6
    # Then the released records are delivered again, with their count bumped.
    assert restored.acquire("c", 3, 20, 30_001) == [
        AcquiredRecords(10, 11, 2),
        AcquiredRecords(14, 14, 2),
    ]


def test_restore_fills_gaps_drops_old_batches_and_advances() -> None:
    restored = SharePartition.restore(
        CFG,
        100,
        [
            StateBatch(90, 97, AV, 3),  # wholly below the SPSO: ignored
            StateBatch(98, 101, AK, 1),  # clipped to 100-101; Acknowledged prefix
            StateBatch(105, 105, AV, 2),
        ],
    )
    # The SPSO moves past the Acknowledged prefix; 102-104 are Available, never delivered.
    assert (restored.start_offset, restored.end_offset) == (102, 106)
    assert restored.record(103) == RecordView(AV, 0, None, None)
    assert restored.record(105) == RecordView(AV, 2, None, None)
    assert restored.take_changes() == ShareUpdate(102, ())
    empty = SharePartition.restore(CFG, 7, [])
    assert (empty.start_offset, empty.end_offset) == (7, 7)


@pytest.mark.parametrize(
    "batches",
    [
        [StateBatch(5, 4, AV, 1)],
        [StateBatch(0, 5, AV, 1), StateBatch(5, 6, AK, 1)],
        [StateBatch(6, 7, AV, 1), StateBatch(0, 5, AK, 1)],
        [StateBatch(0, 5, AQ, 1)],  # Acquired without a lock
        [StateBatch(0, 5, AQ, 1, "m", None)],
        [StateBatch(0, 5, AQ, 1, "", 5)],
        [StateBatch(0, 5, AV, 1, "m", 5)],  # a lock on a record that isn't Acquired
        [StateBatch(0, 5, AV, -1)],
    ],
)
def test_restore_rejects_malformed_state(batches: list[StateBatch]) -> None:
    with pytest.raises(CorruptStateError):
        SharePartition.restore(CFG, 0, batches)


def test_restore_archives_records_acquired_at_the_delivery_limit() -> None:
    """A record whose last delivery attempt (at the limit) was cut short by a leader crash is
    Archived when its restored lock elapses, instead of being delivered again. State written
    before locks were persisted (Acquired as Available at the limit) is Archived on restore."""
    config = SharePartitionConfig(delivery_count_limit=2)
    sp = SharePartition(config, 0)
    sp.acquire("m", 2, log_end_offset=2, now_ms=0)
    sp.acknowledge("m", [AcknowledgementBatch(0, 1, (AcknowledgeType.RELEASE,))], now_ms=1)
    sp.acquire("m", 2, log_end_offset=2, now_ms=2)  # second delivery: count 2 == limit
    start, batches = sp.snapshot()  # the leader crashes here
    restored = SharePartition.restore(config, start, batches)
    assert restored.record(0) == RecordView(AQ, 2, "m", 30_002)
    assert restored.expire_locks(30_002) == 2
    assert restored.start_offset == 2
    assert restored.record(0).state is RecordState.ARCHIVED
    assert restored.acquire("m2", 10, log_end_offset=2, now_ms=30_003) == []
    # The format without locks wrote the same records Available at the limit.
    old = SharePartition.restore(config, 0, [StateBatch(0, 1, AV, 2)])
    assert old.start_offset == 2
    assert old.record(0).state is RecordState.ARCHIVED


# --------------------------------------------------------------------------------------------
# RENEW (KIP-1222): the owner extends its acquisition lock
# --------------------------------------------------------------------------------------------


def test_renew_extends_the_lock_and_keeps_the_record_acquired() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m1", 4, 4, now_ms=0)  # locked until 30000
    sp.take_changes()
    sp.acknowledge("m1", [batch(1, 2, A.RENEW)], now_ms=20_000)
    assert sp.record(1) == RecordView(AQ, 1, "m1", 50_000)
    assert sp.record(0).lock_deadline_ms == 30_000
    # The new deadline is durable: a new leader keeps the renewed lock.
    assert sp.take_changes() == ShareUpdate(0, (StateBatch(1, 2, AQ, 1, "m1", 50_000),))
    assert sp.expire_locks(30_000) == 2  # 0 and 3 elapse at the old deadline
    assert states(sp, 0, 3) == [(AV, 1), (AQ, 1), (AQ, 1), (AV, 1)]
    assert sp.expire_locks(50_000) == 2
    assert states(sp, 1, 2) == [(AV, 1), (AV, 1)]


def test_renew_to_the_same_deadline_keeps_the_lock() -> None:
    """Found by the model check: a RENEW at the acquisition instant gives the deadline the
    records already have; their lock group must survive it, and the lock still expires."""
    sp = SharePartition(CFG, 0)
    sp.acquire("m3", 1, 1, now_ms=0)  # locked until 30000
    sp.acknowledge("m3", [batch(0, 0, A.RENEW)], now_ms=0)
    assert sp.record(0) == RecordView(AQ, 1, "m3", 30_000)
    assert sp.next_lock_deadline() == 30_000
    assert sp.expire_locks(30_000) == 1
    assert states(sp, 0, 0) == [(AV, 1)]


def test_renew_with_the_members_own_lock_duration_and_then_accept() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m1", 2, 2, now_ms=0, lock_duration_ms=5_000)
    sp.acknowledge("m1", [batch(0, 1, A.RENEW)], now_ms=4_000, lock_duration_ms=5_000)
    assert sp.next_lock_deadline() == 9_000
    sp.expire_locks(8_999)
    sp.acknowledge("m1", [batch(0, 1, A.ACCEPT)], now_ms=8_999)
    assert sp.start_offset == 2 and sp.acquired_count == 0


def test_renew_of_records_not_held_or_with_a_bad_duration_changes_nothing() -> None:
    sp = SharePartition(CFG, 0)
    sp.acquire("m1", 2, 2, now_ms=0)
    before = full_state(sp)
    with pytest.raises(InvalidRecordStateError):
        sp.acknowledge("m2", [batch(0, 1, A.RENEW)], now_ms=1)
    with pytest.raises(InvalidRequestError, match="lock duration 999 ms is out of range"):
        sp.acknowledge("m1", [batch(0, 0, A.RENEW), batch(1, 1, A.ACCEPT)], 1, 999)
    assert full_state(sp) == before
    sp.expire_locks(30_000)
    with pytest.raises(InvalidRecordStateError):  # the lock elapsed first: too late to renew
        sp.acknowledge("m1", [batch(0, 1, A.RENEW)], now_ms=30_001)


def test_renew_is_refused_when_the_group_disables_it() -> None:
    """share.renew.acknowledge.enable=false: a RENEW is refused and the request changes
    nothing (acknowledgements are atomic)."""
    sp = SharePartition(SharePartitionConfig(renew_enabled=False), 0)
    sp.acquire("m1", 4, 4, now_ms=0)
    with pytest.raises(InvalidRequestError, match=r"share\.renew\.acknowledge\.enable=false"):
        sp.acknowledge("m1", [batch(0, 0, A.ACCEPT), batch(1, 2, A.RENEW)], now_ms=1_000)
    assert states(sp, 0, 3) == [(AQ, 1)] * 4
    assert sp.record(1).lock_deadline_ms == 30_000
