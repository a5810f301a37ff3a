"""The engine's redelivery rules: delayed RELEASE (held by the reserved owner ``__delayed__``),
the group back-off policy, undelivered RELEASEs that give their delivery back,
``share.delivery.count.mode``, throttled delivery and the archive log (docs/concepts.md
"Delayed redelivery", "Throttled delivery", "Delivery counts")."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    RecordState,
    SharePartition,
    SharePartitionConfig,
)
from queueflow.engine.group import ShareGroup
from queueflow.engine.group_config import GroupConfig, validate_group_config
from queueflow.engine.redelivery import ArchivedRange, backoff_ms, throttle_cap
from queueflow.engine.reserved import DELAYED_OWNER, describe_owner, is_reserved
from queueflow.errors import (
    ConfigurationError,
    ErrorCode,
    InvalidRecordStateError,
    InvalidRequestError,
    ShareGroupError,
)
from queueflow.server.leader.ack_batches import ack_batches
from queueflow.settings import ShareGroupSettings

A = AcknowledgeType
AV, AQ, AR = RecordState.AVAILABLE, RecordState.ACQUIRED, RecordState.ARCHIVED
LOCK = 30_000


def cfg(**kw: object) -> SharePartitionConfig:
    """Throttled delivery on unless ``throttle_delivery=False`` (its default is off)."""
    return SharePartitionConfig(**{"throttle_delivery": True, **kw})  # type: ignore[arg-type]


def rel(
    first: int, last: int, delay_ms: int = 0, undelivered: bool = False
) -> AcknowledgementBatch:
    return AcknowledgementBatch(first, last, (A.RELEASE,), delay_ms, undelivered)


def acquired(sp: SharePartition, member: str, n: int, now: int, leo: int = 1000) -> list[int]:
    return [
        o for a in sp.acquire(member, n, leo, now) for o in range(a.first_offset, a.last_offset + 1)
    ]


# -- delayed redelivery ---------------------------------------------------------------------


def test_a_delayed_release_is_held_until_its_time_then_available_without_a_delivery() -> None:
    sp = SharePartition(cfg(), 0)
    assert acquired(sp, "m", 3, 0, leo=3) == [0, 1, 2]
    sp.acknowledge("m", [rel(0, 1, delay_ms=5000)], now_ms=100)
    view = sp.record(0)
    assert (view.state, view.delivery_count, view.member_id, view.lock_deadline_ms) == (
        AQ,
        1,
        DELAYED_OWNER,
        5100,
    )
    assert sp.delayed_count == 2 and sp.held_by("m") == 1
    assert acquired(sp, "n", 10, 5099, leo=3) == []  # not Available before its time
    sp.expire_locks(5099)
    assert sp.record(0).state is AQ
    sp.expire_locks(5100)
    assert (sp.record(0).state, sp.record(0).delivery_count) == (AV, 1)  # no delivery counted
    got = sp.acquire("n", 10, 3, 5101)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in got] == [(0, 1, 2)]


def test_a_delayed_record_stays_delayed_across_a_restore() -> None:
    """Durable through the v3 lock section: a new leader doesn't make it Available early."""
    sp = SharePartition(cfg(), 0)
    acquired(sp, "m", 2, 0, leo=2)
    sp.acknowledge("m", [rel(0, 1, delay_ms=60_000)], now_ms=10)
    start, batches = sp.snapshot()
    new = SharePartition.restore(cfg(), start, batches)
    assert new.record(1).member_id == DELAYED_OWNER and new.delayed_count == 2
    assert new.next_lock_deadline() == 60_010
    assert new.expire_locks(60_009) == 0
    assert new.acquire("n", 10, 2, 60_009) == []
    new.expire_locks(60_010)
    assert [a.delivery_count for a in new.acquire("n", 10, 2, 60_011)] == [2]


def test_changes_carry_the_delay() -> None:
    sp = SharePartition(cfg(), 0)
    acquired(sp, "m", 1, 0, leo=1)
    sp.take_changes()
    sp.acknowledge("m", [rel(0, 0, delay_ms=1000)], now_ms=5)
    update = sp.take_changes()
    assert update is not None
    (b,) = update.batches
    assert (b.state, b.member_id, b.lock_deadline_ms) == (AQ, DELAYED_OWNER, 1005)


@pytest.mark.parametrize(
    ("batch", "words"),
    [
        (rel(0, 0, delay_ms=-1), "not allowed"),
        (rel(0, 0, delay_ms=43_200_001), "above the maximum of 43200000 ms"),
        (AcknowledgementBatch(0, 0, (A.ACCEPT,), 1000), "RELEASE only, not to ACCEPT"),
        (AcknowledgementBatch(0, 1, (A.RELEASE, A.REJECT), 1000), "not to REJECT"),
        (AcknowledgementBatch(0, 0, (A.ACCEPT,), 0, True), "undelivered applies to RELEASE"),
    ],
)
def test_a_bad_delay_is_refused_and_changes_nothing(
    batch: AcknowledgementBatch, words: str
) -> None:
    sp = SharePartition(cfg(), 0)
    acquired(sp, "m", 2, 0, leo=2)
    before = sp.snapshot()
    with pytest.raises(InvalidRequestError, match=words) as info:
        sp.acknowledge("m", [batch], now_ms=1)
    assert "queueflow.redelivery.max.delay.ms" in str(info.value) or "only" in str(info.value)
    assert sp.snapshot() == before


def test_a_delayed_release_at_the_limit_archives_at_once() -> None:
    sp = SharePartition(cfg(delivery_count_limit=2, throttle_delivery=False), 0)
    acquired(sp, "m", 1, 0, leo=1)
    sp.acknowledge("m", [rel(0, 0)], now_ms=1)
    acquired(sp, "m", 1, 2, leo=1)
    sp.acknowledge("m", [rel(0, 0, delay_ms=1000)], now_ms=3)
    assert sp.start_offset == 1 and sp.delayed_count == 0
    assert sp.take_archived() == [ArchivedRange(0, 0, 2, "delivery_limit")]


def test_delayed_records_are_no_members_holdings_and_a_reset_discards_them() -> None:
    sp = SharePartition(cfg(member_max_in_flight_records=2), 0)
    acquired(sp, "m", 2, 0, leo=10)
    sp.acknowledge("m", [rel(0, 1, delay_ms=1000)], now_ms=1)
    assert sp.held_by("m") == 0
    assert acquired(sp, "m", 5, 2, leo=10) == [2, 3]  # its allowance is whole again
    assert sp.release_member("m", 3) == 2  # the delayed ones stay delayed
    assert sp.delayed_count == 2
    sp.reset_start_offset(10)  # the group is empty: delayed records are discarded too
    assert sp.acquired_count == 0 and sp.delayed_count == 0 and sp.next_lock_deadline() is None


def test_reserved_owners_are_refused_at_join_and_shown_as_delayed() -> None:
    group = ShareGroup("g", 45_000, 10)
    with pytest.raises(ShareGroupError) as info:
        group.heartbeat("__delayed__", 0, ["t"], 0, {"t": 1})
    assert info.value.code is ErrorCode.INVALID_REQUEST and "reserved" in str(info.value)
    assert not group.members
    assert is_reserved("__dead_letter__") and not is_reserved("m") and not is_reserved(None)
    assert describe_owner(DELAYED_OWNER, 0) == "Available (delayed until 1970-01-01T00:00:00.000Z)"
    assert describe_owner("m", 0) is None


# -- back-off policy ------------------------------------------------------------------------


def test_the_back_off_policy_delays_each_release_more_up_to_the_cap() -> None:
    sp = SharePartition(
        cfg(
            redelivery_backoff_ms=1000,
            redelivery_backoff_multiplier=2.0,
            redelivery_backoff_max_ms=3000,
            delivery_count_limit=6,
            throttle_delivery=False,
        ),
        0,
    )
    now, deadlines = 0, []
    for _ in range(4):
        assert acquired(sp, "m", 1, now, leo=1) == [0]
        sp.acknowledge("m", [rel(0, 0)], now_ms=now)
        deadlines.append(sp.record(0).lock_deadline_ms - now)  # type: ignore[operator]
        now = sp.record(0).lock_deadline_ms  # type: ignore[assignment]
        sp.expire_locks(now)
    assert deadlines == [1000, 2000, 3000, 3000]
    # An explicit delay wins over the policy; a given-back delivery gets none.
    acquired(sp, "m", 1, now, leo=1)
    sp.acknowledge("m", [rel(0, 0, delay_ms=10)], now_ms=now)
    assert sp.record(0).lock_deadline_ms == now + 10
    sp.expire_locks(now + 10)
    acquired(sp, "m", 1, now + 10, leo=1)
    sp.acknowledge("m", [rel(0, 0, undelivered=True)], now_ms=now + 10)
    assert sp.record(0).state is AV


@given(
    count=st.integers(1, 50),
    initial=st.integers(0, 10**6),
    multiplier=st.floats(1.0, 1000.0),
    cap=st.integers(0, 43_200_000),
)
def test_backoff_is_monotonic_and_capped(
    count: int, initial: int, multiplier: float, cap: int
) -> None:
    delay = backoff_ms(count, initial, multiplier, cap)
    assert 0 <= delay <= max(cap, 0) or initial == 0
    if initial:
        assert delay <= backoff_ms(count + 1, initial, multiplier, cap)
        assert delay == min(cap, delay) and (count > 1 or delay == min(initial, cap))
    else:
        assert delay == 0


def test_back_off_group_configs_are_checked() -> None:
    settings = ShareGroupSettings()
    assert validate_group_config("share.redelivery.backoff.ms", "1500", settings) == "1500"
    assert validate_group_config("share.redelivery.backoff.multiplier", 3, settings) == "3.0"
    assert validate_group_config("share.delivery.count.mode", "attempts", settings) == "attempts"
    for name, bad in (
        ("share.redelivery.backoff.ms", -1),
        ("share.redelivery.backoff.max.ms", 43_200_001),
        ("share.redelivery.backoff.multiplier", 0.5),
        ("share.redelivery.backoff.multiplier", "nan"),
        ("share.delivery.count.mode", "deliveries"),
    ):
        with pytest.raises(ConfigurationError, match=name):
            validate_group_config(name, bad, settings)
    resolved = GroupConfig.resolve(settings, {"share.delivery.count.mode": "attempts"})
    assert (resolved.redelivery_backoff_ms, resolved.redelivery_backoff_max_ms) == (0, 60000)
    assert resolved.delivery_count_mode == "attempts"
    with pytest.raises(ConfigurationError, match=r"share\.delivery\.count\.mode"):
        cfg(delivery_count_mode="x")


# -- delivery counts ------------------------------------------------------------------------


def test_an_undelivered_release_gives_the_delivery_back_even_at_the_limit() -> None:
    """The issue's scenario in the engine: a record released unhandled every time is never
    Archived, and its releases don't count towards the member's release abuse."""
    sp = SharePartition(
        cfg(delivery_count_limit=2, release_abuse_records=1, throttle_delivery=False), 0
    )
    for now in range(0, 100, 10):
        assert acquired(sp, "m", 5, now, leo=5) == [0, 1, 2, 3, 4]
        assert sp.acknowledge("m", [rel(0, 4, undelivered=True)], now_ms=now) is None
        assert [sp.record(o).delivery_count for o in range(5)] == [0] * 5
    assert sp.archived_total == 0 and sp.take_archived() == []


@pytest.mark.parametrize("mode", ["acquisitions", "attempts"])
def test_a_member_that_died_holding_records_counts_only_in_acquisitions_mode(mode: str) -> None:
    sp = SharePartition(
        cfg(delivery_count_limit=2, delivery_count_mode=mode, throttle_delivery=False), 0
    )
    acquired(sp, "m", 2, 0, leo=4)
    sp.expire_locks(LOCK)  # lock expiry
    acquired(sp, "m", 2, LOCK, leo=4)
    sp.release_member("m", LOCK + 1)  # session expiry / leave
    if mode == "attempts":
        assert [sp.record(o).delivery_count for o in range(2)] == [0, 0]
        assert sp.start_offset == 0 and sp.archived_total == 0
    else:
        assert sp.start_offset == 2  # two deliveries at limit 2: Archived
        assert sp.take_archived() == [ArchivedRange(0, 1, 2, "delivery_limit")]
    # A member's own RELEASE counts in both modes.
    sp2 = SharePartition(cfg(delivery_count_limit=2, delivery_count_mode=mode), 0)
    acquired(sp2, "m", 1, 0, leo=1)
    sp2.acknowledge("m", [rel(0, 0)], 1)
    acquired(sp2, "m", 1, 2, leo=1)
    sp2.acknowledge("m", [rel(0, 0)], 3)
    assert sp2.start_offset == 1


def test_every_archived_record_is_reported_once_with_its_reason() -> None:
    sp = SharePartition(cfg(delivery_count_limit=2, throttle_delivery=False), 0)
    acquired(sp, "m", 10, 0, leo=10)
    sp.acknowledge(
        "m",
        [
            AcknowledgementBatch(0, 1, (A.REJECT,)),
            AcknowledgementBatch(2, 2, (A.GAP,)),
            rel(3, 9),
        ],
        1,
    )
    assert sp.take_archived() == [ArchivedRange(0, 1, 1, "rejected")]  # not the GAP
    acquired(sp, "m", 10, 2, leo=10)
    sp.expire_locks(2 + LOCK)
    assert sp.take_archived() == [ArchivedRange(3, 9, 2, "delivery_limit")]
    assert sp.take_archived() == []


# -- throttled delivery ---------------------------------------------------------------------


def test_records_past_half_the_limit_go_in_smaller_batches_the_last_alone() -> None:
    sp = SharePartition(cfg(delivery_count_limit=5), 0)
    sizes = []
    now = 0
    while sp.start_offset < 16 and now < 10_000:
        got = sp.acquire("m", 16, 16, now)
        assert len(got) <= 1  # never mixes delivery counts when throttled
        if got:
            a = got[0]
            sizes.append((a.delivery_count, a.last_offset - a.first_offset + 1))
            sp.acknowledge("m", [rel(a.first_offset, a.last_offset)], now)
        now += 1
    assert sizes[:3] == [(1, 16), (2, 16), (3, 8)]
    assert all(n == 1 for count, n in sizes if count == 5)  # the last attempt alone
    assert all(n <= 4 for count, n in sizes if count == 4)
    assert all(n <= 8 for count, n in sizes if count == 3)
    assert sp.archived_total == 16


def test_throttling_can_be_switched_off() -> None:
    sp = SharePartition(cfg(delivery_count_limit=2, throttle_delivery=False), 0)
    acquired(sp, "m", 4, 0, leo=4)
    sp.acknowledge("m", [rel(0, 3)], 1)
    assert acquired(sp, "m", 4, 2, leo=4) == [0, 1, 2, 3]


@given(delivery=st.integers(1, 20), limit=st.integers(2, 10), max_records=st.integers(1, 10_000))
def test_throttle_cap_rule(delivery: int, limit: int, max_records: int) -> None:
    cap = throttle_cap(delivery, limit, max_records)
    assert 1 <= cap <= max_records
    if delivery <= limit // 2:
        assert cap == max_records
    if delivery >= limit:
        assert cap == 1
    assert throttle_cap(delivery + 1, limit, max_records) <= cap


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["acquire", "release", "delay", "undelivered", "reject", "expire"]),
            st.integers(1, 12),
        ),
        max_size=60,
    ),
    mode=st.sampled_from(["acquisitions", "attempts"]),
)
def test_rules_hold_under_any_sequence(ops: list[tuple[str, int]], mode: str) -> None:
    """Properties: a last-attempt acquisition holds one record; delayed records are never
    acquired before their time; every Archived record is reported exactly once; restoring
    the snapshot gives the same state."""
    limit = 3
    sp = SharePartition(cfg(delivery_count_limit=limit, delivery_count_mode=mode), 0)
    now, held, reported = 0, [], 0
    for op, n in ops:
        now += 250
        if op == "acquire":
            delayed = {
                r.first_offset + k
                for r in sp.in_flight()
                if r.member_id == DELAYED_OWNER
                for k in range(r.last_offset - r.first_offset + 1)
            }
            for a in sp.acquire("m", n, 40, now):
                offsets = set(range(a.first_offset, a.last_offset + 1))
                assert not offsets & delayed
                if a.delivery_count >= limit:
                    assert len(offsets) == 1
                held.extend(sorted(offsets))
        elif held:
            take, held = held[:n], held[n:]
            take = sorted(o for o in take if sp.record(o).member_id == "m")
            if op == "expire":
                sp.expire_locks(now + 10 * LOCK)
                held = []
            elif take:
                kind = A.REJECT if op == "reject" else A.RELEASE
                batches = [
                    AcknowledgementBatch(
                        o,
                        o,
                        (kind,),
                        1000 if op == "delay" else 0,
                        op == "undelivered",
                    )
                    for o in take
                ]
                sp.acknowledge("m", batches, now)
        reported += sum(r.last - r.first + 1 for r in sp.take_archived())
        start, batches_ = sp.snapshot()
        again = SharePartition.restore(replace(sp.config), start, batches_)
        assert again.snapshot() == (start, batches_)
    assert reported == sp.archived_total


# -- wire batches ---------------------------------------------------------------------------


def test_ack_batches_split_where_the_options_change() -> None:
    batches = ack_batches(
        [(0, 5, (2,)), (7, 8, (1, 2))], delays=[(2, 3, 500)], undelivered=[(5, 5), (8, 8)]
    )
    shape = [
        (b.first_offset, b.last_offset, b.acknowledge_types, b.delay_ms, b.undelivered)
        for b in batches
    ]
    assert shape == [
        (0, 1, (A.RELEASE,), 0, False),
        (2, 3, (A.RELEASE,), 500, False),
        (4, 4, (A.RELEASE,), 0, False),
        (5, 5, (A.RELEASE,), 0, True),
        (7, 7, (A.ACCEPT,), 0, False),
        (8, 8, (A.RELEASE,), 0, True),
    ]
    assert ack_batches([(0, 1, (1,))]) == [AcknowledgementBatch(0, 1, (A.ACCEPT,))]


def test_a_renew_of_records_the_member_does_not_hold_is_refused_and_changes_nothing() -> None:
    """Bad input: RENEW by a member that doesn't hold the records (another member's, or a
    delayed one, even by the member that released it) is refused with INVALID_RECORD_STATE
    naming the offsets; nothing changes, and the stale offsets are named for the member to
    drop."""
    sp = SharePartition(cfg(), 0)
    acquired(sp, "m", 2, 0, leo=4)
    sp.acknowledge("m", [rel(1, 1, delay_ms=5000)], now_ms=1)
    before = sp.snapshot()
    for member, offset in (("n", 0), ("n", 1), ("m", 1)):  # another's; delayed (twice)
        renew = [AcknowledgementBatch(offset, offset, (A.RENEW,))]
        with pytest.raises(InvalidRecordStateError, match=f"records {offset}..{offset} are not"):
            sp.acknowledge(member, renew, now_ms=2)
        assert sp.snapshot() == before
    assert sp.stale_acknowledgements("n", [AcknowledgementBatch(0, 1, (A.RENEW,))]) == [(0, 1)]
