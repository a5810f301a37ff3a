"""The membership lease on the direct path (docs/architecture.md "The membership lease"): a
leader that can't prove its Faust group membership acquires nothing, answers nothing it
acquired while the proof lapsed, and logs the lapse once. The rules are pure
(:class:`MembershipLease`, :class:`LeaseTransitions`); the in-process cluster runs the real
leader, endpoint and state writes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, direct_cluster, fetch, run
from structlog.testing import capture_logs

from queueflow.engine.fencing import LeaseChange, LeaseTransitions, MembershipLease, lease_allows
from queueflow.errors import ErrorCode
from queueflow.member.direct import DirectClient
from queueflow.server.leader.lease import LeaseGate

SESSION_MS = 10_000
MARGIN_MS = 1_000

# A heartbeat: (generation, sent at ms, answered after ms, accepted by the broker?)
heartbeats = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 60_000), st.integers(0, 5_000), st.booleans()),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(heartbeats, st.integers(1, 3), st.integers(0, 80_000))
def test_a_held_lease_always_ends_a_margin_before_the_broker_can_expire_the_member(
    beats: list[tuple[int, int, int, bool]], generation: int, now_ms: int
) -> None:
    """Safety: the broker keeps a member a session after the last heartbeat it accepted
    (received no earlier than it was sent), and only then can a successor be assigned its
    partitions. A lease that holds at ``now_ms`` for ``generation`` (counting the answers
    received by then, in any order) ends at least the margin before the earliest moment that
    generation's membership could expire."""
    lease = MembershipLease(SESSION_MS, MARGIN_MS)
    answered = [(g, s) for g, s, latency, ok in beats if ok and s + latency <= now_ms]
    for g, sent in sorted(answered, key=lambda beat: -beat[1]):  # late answers of old beats
        lease.heartbeat_ok(g, sent)
    remaining = lease.remaining_ms(generation, now_ms)
    proofs = [sent for g, sent in answered if g == generation]
    if lease_allows(remaining):
        assert proofs, "a lease held without an accepted heartbeat of its generation"
        earliest_expiry = max(proofs) + SESSION_MS  # received the moment it was sent
        assert now_ms + remaining + MARGIN_MS <= earliest_expiry
    elif proofs and generation == max(g for g, _ in answered):
        assert now_ms >= max(proofs) + SESSION_MS - MARGIN_MS  # never refused too early


def test_lease_transitions_report_a_lapse_and_a_regain_once_and_ignore_rebalances() -> None:
    watch = LeaseTransitions()
    assert watch.observe(0) is None  # never held: a new generation not proven yet
    assert watch.observe(5_000) is None  # proven: nothing to report
    assert watch.observe(4_000) is None
    assert watch.observe(0) is LeaseChange.LAPSED
    assert watch.observe(-300) is None  # still lapsed: reported once
    assert watch.observe(9_000) is LeaseChange.REGAINED
    assert watch.observe(0, rebalancing=True) is None  # Faust forgot the proof: a rebalance
    assert watch.observe(0) is None  # the new generation, not proven yet, had not held
    assert watch.observe(9_000) is None
    assert watch.observe(None) is None  # a host whose membership can't lapse holds


def test_a_lapse_across_a_rebalance_is_regained_when_the_new_generation_proves_itself() -> None:
    watch = LeaseTransitions()
    watch.observe(5_000)
    assert watch.observe(0) is LeaseChange.LAPSED  # cut off: its session expires...
    assert watch.observe(0, rebalancing=True) is None  # ...it rejoins
    assert watch.observe(8_000) is LeaseChange.REGAINED


def test_a_queued_request_acquires_nothing_once_the_lease_has_lapsed() -> None:
    """The endpoint checks the lease when a request arrives; one already queued (or parked)
    when the lease lapses must not acquire either: the batch itself checks it."""

    async def scenario() -> None:
        async with direct_cluster(records=2) as cluster:
            runtime: Any = cluster.server.runtime
            leader = cluster.leaders[TOPIC]
            assert (await leader.serve(fetch("m0", 1, max_records=1))).acquired  # loaded, live
            runtime.lease_ms = 0
            refused = await leader.serve(fetch("m1", 1))
            assert refused.error == ErrorCode.NOT_LEADER_OR_FOLLOWER.value
            assert "heartbeat" in refused.error_message and refused.acquired == []
            assert cluster.share_partition("g", TOPIC, 0).acquired_count == 1  # m0's only
            registry = cluster.server.metrics.registry
            name = "queueflow_direct_requests_unserved_total"
            assert registry.get_sample_value(name, {"reason": "lease_acquire"}) == 1

    run(scenario())


def test_records_acquired_while_the_lease_lapsed_during_the_state_write_are_not_handed_out() -> (
    None
):
    """With durability ``acked`` an answer waits for its state write; cut off from the broker,
    that wait can outlast the lease (and the write land after the successor took over). The
    answer then must not leave: the member gets NOT_LEADER and the records stay locked here
    until their lock elapses (redelivered, never lost)."""

    async def scenario() -> None:
        async with direct_cluster(records=1) as cluster:
            assert cluster.endpoint is not None
            runtime: Any = cluster.server.runtime
            runtime.lease_ms = 5_000
            flush = cluster.server.flush_state

            async def slow_flush() -> None:
                await flush()
                runtime.lease_ms = -1  # the lease ran out while the write waited

            cluster.server.flush_state = slow_flush
            client = DirectClient()
            answer = await client.call(cluster.endpoint.address, fetch("m1", 1), 2.0)
            await client.close()
            assert answer.error == ErrorCode.NOT_LEADER_OR_FOLLOWER.value
            assert answer.acquired == []
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.acquired_count == 1  # held by m1 until its lock elapses
            registry = cluster.server.metrics.registry
            name = "queueflow_direct_requests_unserved_total"
            assert registry.get_sample_value(name, {"reason": "lease_answer"}) == 1

    run(scenario())


def test_the_lease_gate_logs_a_lapse_and_a_regain_once_each_and_counts_lapses() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=1) as cluster:
            runtime: Any = cluster.server.runtime
            gate = LeaseGate(cluster.server)
            live = {TOPIC: [0]}
            runtime.lease_ms = 3_000
            with capture_logs() as logs:
                gate.watch(lambda: live)
                runtime.lease_ms = 0
                gate.watch(lambda: live)
                gate.watch(lambda: live)
                runtime.lease_ms = 3_000
                gate.watch(lambda: live)
            names = [e["event"] for e in logs]
            assert names == ["leader_lease_lapsed", "leader_lease_regained"]
            assert logs[0]["live_partitions"] == {TOPIC: [0]}
            registry = cluster.server.metrics.registry
            assert registry.get_sample_value("queueflow_leader_lease_lapses_total") == 1

    run(scenario())
