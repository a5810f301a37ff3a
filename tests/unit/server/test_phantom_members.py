"""Phantom members: joins that never follow up (no heartbeat with their member epoch) don't
count toward ``group.share.max.size`` and are removed after ``share.member.join.grace.ms``, so
a real latecomer joins even right after 250 phantom joins (the coordinator's pure handlers,
the group engine, and the in-process cluster)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from inprocess_helpers import TOPIC as IN_TOPIC
from inprocess_helpers import RawMember, cluster_with, eventually, run
from test_coordinator_handlers import T0, answer, beat, make_state, names

from queueflow.engine.group import ShareGroup
from queueflow.server.coordinator import membership

PARTS = {"t": 4}


def test_a_latecomer_joins_after_250_phantom_joins_through_the_pure_handlers() -> None:
    state = make_state(max_size=10, session_timeout_ms=60_000)
    real = [f"real-{i}" for i in range(5)]
    for m in real:
        epoch = answer(beat(state, m, 0)).member_epoch
        assert answer(beat(state, m, epoch, now=T0 + 100)).error == "NONE"  # confirmed
    evicted: list[str] = []
    for i in range(250):
        result = beat(state, f"phantom-{i}", 0, now=T0 + 200 + i)
        assert answer(result).error == "NONE"
        evicted += [
            e.fields["member_id"] for e in result.events if e.event == "provisional_member_expired"
        ]
    group = state.groups["g"]
    assert len(group.members) == 10  # never more than group.share.max.size held
    assert len(evicted) == 245
    late = beat(state, "latecomer", 0, now=T0 + 1_000)
    assert answer(late).error == "NONE"
    assert set(real) <= set(group.members)
    # The phantoms left are removed once their grace ends; the latecomer, following up, stays.
    epoch = answer(late).member_epoch
    for m in real:
        beat(state, m, group.members[m].member_epoch, now=T0 + 2_000)
    beat(state, "latecomer", epoch, now=T0 + 2_000)
    tick = membership.handle_tick(state, T0 + 200 + group.join_grace_ms + 1_000)
    assert "provisional_member_expired" in names(tick)
    assert sorted(group.members) == sorted([*real, "latecomer"])
    assert {t.message.reason for t in tick.to_leaders} == {"provisional member expired"}


def test_confirmed_members_still_fill_the_group() -> None:
    state = make_state(max_size=2)
    for m in ("a", "b"):
        epoch = answer(beat(state, m, 0)).member_epoch
        beat(state, m, epoch)
    assert answer(beat(state, "c", 0)).error == "GROUP_MAX_SIZE_REACHED"


@settings(max_examples=50, deadline=None)
@given(
    max_size=st.integers(1, 12),
    ops=st.lists(st.tuples(st.integers(0, 30), st.booleans()), max_size=60),
)
def test_members_never_exceed_the_max_size_and_confirmed_ones_are_never_evicted(
    max_size: int, ops: list[tuple[int, bool]]
) -> None:
    g = ShareGroup("G", 45_000, max_size)
    confirmed: set[str] = set()
    for now, (member_no, confirm) in enumerate(ops, start=1):
        m = f"m{member_no}"
        try:
            if m in g.members and confirm:
                g.heartbeat(m, g.members[m].member_epoch, ["t"], now, PARTS)
                confirmed.add(m)
            elif m not in g.members:
                g.heartbeat(m, 0, ["t"], now, PARTS)
        except Exception as exc:  # GROUP_MAX_SIZE_REACHED only when full of confirmed ones
            assert "GROUP_MAX_SIZE_REACHED" in str(exc)
            assert len(confirmed & set(g.members)) >= max_size
        assert len(g.members) <= max_size
        assert confirmed <= set(g.members)


def test_a_latecomer_joins_the_in_process_cluster_after_phantom_joins() -> None:
    async def scenario() -> None:
        async with cluster_with(0, partitions=2, max_size=5) as cluster:
            first = cluster.consumer("g")
            await first.subscribe([IN_TOPIC])
            joined = cluster.coordinator.groups["g"].members[first.member_id]
            await eventually(lambda: not joined.provisional, "the member's follow-up heartbeat")
            for i in range(250):
                answer_ = await RawMember(cluster, f"phantom-{i}").heartbeat(0)
                assert answer_.error == "NONE"
            late = cluster.consumer("g")
            await late.subscribe([IN_TOPIC])  # raised GROUP_MAX_SIZE_REACHED before
            assert late.member_id in cluster.coordinator.groups["g"].members
            await late.close()
            await first.close()

    run(scenario())
