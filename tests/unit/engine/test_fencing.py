"""Leader fencing and fenced writes (``engine.fencing``, ``server.durable``), no Kafka.

The race test plays two leaders of one request partition over one shared state table and one
ordered request log, the way a paused leader and its successor meet in production.
"""

from __future__ import annotations

import pytest

from queueflow.engine import AcknowledgementBatch, AcknowledgeType, SharePartitionConfig
from queueflow.engine.fencing import FenceOutcome, LeaderFencing, MembershipLease, RecoveryWatch
from queueflow.errors import ErrorCode, FencedStateEpochError
from queueflow.server.durable import DurableSharePartition, delta_key

G, T, P = "G", "T", 0
CFG = SharePartitionConfig(max_in_flight_records=1000, delivery_count_limit=5)
LIMIT_MS = 11_000


def test_own_fence_makes_the_leader_live() -> None:
    f = LeaderFencing(LIMIT_MS)
    f.assign({0, 1}, epoch=4)
    assert not f.is_live(0)
    f.check(0)  # owned, not fenced: may apply acknowledgements
    assert f.on_fence(0, 4) is FenceOutcome.LIVE
    assert f.is_live(0) and not f.is_live(1)


def test_older_fence_is_ignored_and_newer_fence_supersedes() -> None:
    f = LeaderFencing(LIMIT_MS)
    f.assign({0}, epoch=4)
    f.on_fence(0, 4)
    assert f.on_fence(0, 3) is FenceOutcome.IGNORED
    assert f.is_live(0)
    assert f.on_fence(0, 5) is FenceOutcome.SUPERSEDED
    assert not f.is_live(0)
    with pytest.raises(FencedStateEpochError, match="taken over by leader epoch 5") as err:
        f.check(0)
    assert err.value.code is ErrorCode.FENCED_STATE_EPOCH
    # Stepping down is final for this assignment: its own fence doesn't revive it.
    assert f.on_fence(0, 4) is FenceOutcome.IGNORED
    assert not f.is_live(0)


def test_fence_for_a_partition_not_led_is_ignored() -> None:
    f = LeaderFencing(LIMIT_MS)
    assert f.on_fence(3, 9) is FenceOutcome.IGNORED
    with pytest.raises(FencedStateEpochError, match="does not lead partition 3"):
        f.check(3)


def test_reassignment_replaces_the_fenced_leadership() -> None:
    f = LeaderFencing(LIMIT_MS)
    f.assign({0}, epoch=4)
    f.on_fence(0, 6)
    f.revoke({0})
    f.assign({0}, epoch=7)
    f.check(0)
    assert f.on_fence(0, 7) is FenceOutcome.LIVE


def test_stall_longer_than_the_limit_fences_every_partition() -> None:
    f = LeaderFencing(LIMIT_MS)
    f.assign({0, 1}, epoch=4)
    f.on_fence(0, 4)
    assert f.alive(1_000) == []
    assert f.alive(1_000 + LIMIT_MS) == []  # exactly the limit: still ours
    assert sorted(f.alive(2_000 + 2 * LIMIT_MS)) == [0, 1]
    assert not f.is_live(0)
    with pytest.raises(FencedStateEpochError, match="stalled for 12000 ms, longer than the 11000"):
        f.check(1)


def test_partitions_come_back_after_a_stall_only_with_the_same_generation() -> None:
    f = LeaderFencing(LIMIT_MS)
    f.assign({0}, epoch=4)
    f.on_fence(0, 4)
    f.alive(0)
    assert f.alive(LIMIT_MS + 1) == [0]
    # Too early, rebalancing, or a new generation: stay down.
    assert f.resume_after_stall(LIMIT_MS + 2, epoch=4, rebalancing=False) == []
    assert f.resume_after_stall(3 * LIMIT_MS, epoch=4, rebalancing=True) == []
    assert f.resume_after_stall(3 * LIMIT_MS, epoch=5, rebalancing=False) == []
    assert f.resume_after_stall(3 * LIMIT_MS, epoch=4, rebalancing=False) == [0]
    f.check(0)
    assert not f.is_live(0)  # until the new fence is read back
    assert f.on_fence(0, 4) is FenceOutcome.LIVE


def test_invalid_stall_limit() -> None:
    with pytest.raises(ValueError, match="stall_limit_ms must be > 0"):
        LeaderFencing(0)


def test_fenced_share_partition_refuses_every_write() -> None:
    table: dict[bytes, bytes] = {}
    d = DurableSharePartition.create(table, G, T, P, CFG, 10, start_offset=0)
    d.engine.acquire("m", 3, log_end_offset=10, now_ms=0)
    d.fence("partition 0 was taken over by leader epoch 9")
    before = dict(table)
    with pytest.raises(FencedStateEpochError) as err:
        d.persist()
    assert err.value.code is ErrorCode.FENCED_STATE_EPOCH
    assert "group=G topic=T partition=0" in str(err.value)
    assert "leader epoch 9" in str(err.value)
    with pytest.raises(FencedStateEpochError):
        d.write_snapshot()
    assert table == before


def test_two_leaders_racing_on_one_partition() -> None:
    """Leader A (epoch 3) is paused; B (epoch 4) takes over; A wakes up and keeps going."""
    table: dict[bytes, bytes] = {}
    log: list[tuple[str, int]] = []  # the request partition: fences, in append order
    a_fencing, b_fencing = LeaderFencing(LIMIT_MS), LeaderFencing(LIMIT_MS)

    # A leads: its fence, then it serves records 0..9 to member m1 who accepts 0..4.
    a_fencing.assign({P}, epoch=3)
    log.append(("fence", 3))
    assert a_fencing.on_fence(P, 3) is FenceOutcome.LIVE
    a = DurableSharePartition.create(table, G, T, P, CFG, 100, start_offset=0, leader_epoch=3)
    a.engine.acquire("m1", 10, log_end_offset=20, now_ms=0)
    a.engine.acknowledge("m1", [AcknowledgementBatch(0, 4, (AcknowledgeType.ACCEPT,))], 1)
    a.persist()

    # A pauses. B is assigned the partition, appends its fence and restores the state.
    b_fencing.assign({P}, epoch=4)
    log.append(("fence", 4))
    b = DurableSharePartition.load(table, G, T, P, CFG, 100, leader_epoch=4)
    assert b is not None and b.state_epoch == a.state_epoch + 1
    assert b_fencing.on_fence(P, 4) is FenceOutcome.LIVE
    # B keeps A's locks on 5..9 (m1 may still acknowledge them); they elapse, and B hands
    # 5..9 to m2.
    assert b.engine.record(7).member_id == "m1"
    assert b.engine.expire_locks(30_000) == 5
    acquired = b.engine.acquire("m2", 5, log_end_offset=20, now_ms=30_001)
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in acquired] == [(5, 9, 2)]
    b.persist()

    # A wakes with a request it read before the fence: a late write under its old epoch.
    a.engine.acknowledge("m1", [AcknowledgementBatch(5, 9, (AcknowledgeType.ACCEPT,))], 3)
    a.persist()
    # Then it reads B's fence, steps down, and every later write is refused.
    assert a_fencing.on_fence(P, log[-1][1]) is FenceOutcome.SUPERSEDED
    a.fence(a_fencing.partitions[P].fenced or "")
    a.engine.acquire("m1", 10, log_end_offset=20, now_ms=4)
    with pytest.raises(FencedStateEpochError, match="taken over by leader epoch 4"):
        a.persist()
    with pytest.raises(FencedStateEpochError):
        a_fencing.check(P)

    # B's state is intact: its late-write-free view, record for record.
    b.engine.acknowledge("m2", [AcknowledgementBatch(5, 6, (AcknowledgeType.RELEASE,))], 30_005)
    b.persist()
    restored = DurableSharePartition.load(table, G, T, P, CFG, 100, leader_epoch=5)
    assert restored is not None
    view = [
        (o, restored.engine.record(o).state.name, restored.engine.record(o).delivery_count)
        for o in range(5, 10)
    ]
    assert view == [
        (5, "AVAILABLE", 2),
        (6, "AVAILABLE", 2),
        (7, "ACQUIRED", 2),
        (8, "ACQUIRED", 2),
        (9, "ACQUIRED", 2),
    ]
    assert restored.engine.start_offset == 5
    # A's late delta sits under its own state epoch, where no replay of B's state looks.
    assert delta_key(G, P, a.state_epoch, a.snapshot_epoch, a.delta_index - 1) in table


def test_fences_are_sent_once_and_resent_until_read_back() -> None:
    f = LeaderFencing(LIMIT_MS)
    f.assign({0, 1}, epoch=4)
    assert sorted(f.fences_due(100, resend_after_ms=1000)) == [0, 1]
    f.on_fence(0, 4)
    assert f.fences_due(1100, resend_after_ms=1000) == []
    assert f.fences_due(1101, resend_after_ms=1000) == [1]  # lost in the rebalance: again
    assert f.fences_due(1200, resend_after_ms=1000) == []
    f.on_fence(1, 4)
    assert f.fences_due(9000, resend_after_ms=1000) == []


def test_membership_lease_lasts_a_session_from_the_newest_ok_heartbeat_send() -> None:
    lease = MembershipLease(session_timeout_ms=10_000, margin_ms=1_000)
    assert lease.remaining_ms(generation=3, now_ms=0) == 0  # nothing proven yet
    lease.heartbeat_ok(generation=3, sent_ms=5_000)
    assert lease.remaining_ms(3, now_ms=6_000) == 8_000  # 5 s + 10 s - 1 s margin - 6 s
    lease.heartbeat_ok(3, sent_ms=4_000)  # an older heartbeat answered late proves less
    assert lease.remaining_ms(3, now_ms=6_000) == 8_000
    assert lease.remaining_ms(3, now_ms=14_000) == 0
    assert lease.remaining_ms(3, now_ms=20_000) < 0
    # Another generation's heartbeats prove nothing about this one, and a rebalance forgets.
    assert lease.remaining_ms(4, now_ms=6_000) == 0
    lease.heartbeat_ok(4, sent_ms=7_000)
    assert lease.remaining_ms(4, now_ms=7_000) == 9_000
    lease.reset()
    assert lease.remaining_ms(4, now_ms=7_000) == 0


@pytest.mark.parametrize("margin_ms", [-1, 10_000, 20_000])
def test_membership_lease_margin_must_be_below_the_session(margin_ms: int) -> None:
    with pytest.raises(ValueError, match="margin_ms must be in"):
        MembershipLease(session_timeout_ms=10_000, margin_ms=margin_ms)


def test_recovery_watch_reports_recovery_stuck_at_the_same_remaining_count() -> None:
    """Faust's table recovery stuck waiting for changelog records (seen after a worker was
    frozen) is reported once it has made no progress for the limit; progress, or the end of
    recovery, starts the count again."""
    watch = RecoveryWatch(limit_ms=1000)
    assert watch.check(True, 8, 0) is None
    assert watch.check(True, 8, 999) is None
    assert watch.check(True, 8, 1000) == 1000
    assert watch.check(True, 7, 1500) is None  # a record restored: progress
    assert watch.check(True, 7, 2400) is None
    assert watch.check(True, 7, 2600) == 1100
    assert watch.check(False, 0, 2700) is None  # recovered
    assert watch.check(True, 3, 5000) is None  # the next recovery counts afresh
    assert watch.check(True, 3, 5999) is None
    assert RecoveryWatch(0).check(True, 8, 10**9) is None  # 0: never


def test_recovery_watch_rearmed_reports_again_one_limit_later() -> None:
    """After the worker acted on a report (restarted recovery), the watch counts the period
    again from then; progress still starts it over."""
    watch = RecoveryWatch(limit_ms=1000)
    assert watch.check(True, 8, 0) is None
    assert watch.check(True, 8, 1000) == 1000
    watch.rearm(1000)
    assert watch.check(True, 8, 1999) is None
    assert watch.check(True, 8, 2000) == 1000
    watch.rearm(2000)
    assert watch.check(True, 5, 2500) is None  # progress
    assert watch.check(True, 5, 3499) is None
    assert watch.check(True, 5, 3500) == 1000
    idle = RecoveryWatch(limit_ms=1000)
    idle.rearm(10)  # not recovering: nothing to rearm
    assert idle.check(True, 3, 20) is None


def test_recovery_watch_refuses_a_negative_limit() -> None:
    with pytest.raises(ValueError, match="limit_ms"):
        RecoveryWatch(-1)
