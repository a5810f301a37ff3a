"""``queueflow.testing.ShareAgentHarness``: share agents in memory on the real engine,
coordinator and leaders, with a fake clock (docs/guide.md "Testing your share agents")."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import faust
import pytest

import queueflow
from queueflow import ACCEPT, REJECT, RELEASE
from queueflow.engine.state import RecordState
from queueflow.errors import ConfigurationError
from queueflow.structs import AcknowledgeType, ShareRecord
from queueflow.testing import HarnessTimeout, ShareAgentHarness

ACKNOWLEDGED, ARCHIVED = RecordState.ACKNOWLEDGED, RecordState.ARCHIVED


def run(coro: Awaitable[Any]) -> Any:
    """Run a scenario; fail it after 30 s."""
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


async def by_value(record: ShareRecord) -> Any:
    """ACCEPT ``ok``, REJECT ``bad``, RELEASE ``flaky`` twice, raise on ``boom``."""
    if record.value == b"bad":
        return REJECT
    if record.value == b"flaky" and record.delivery_count < 3:
        return RELEASE
    if record.value == b"boom":
        raise RuntimeError("boom")
    return ACCEPT


def test_outcomes_delivery_counts_and_handler_errors_per_record() -> None:
    """Each record's deliveries and outcomes, its final state, the share-partition, and the
    handler's errors with their log lines; a RELEASE loop ends Archived at the group's
    delivery count limit."""

    async def scenario() -> None:
        async with ShareAgentHarness(
            by_value, topic="jobs", group_config={"share.delivery.count.limit": 3}
        ) as h:
            refs = h.put_many([b"ok", b"bad", b"flaky", b"boom"])
            assert [r.offset for r in refs] == [0, 1, 2, 3]
            report = await h.run_until_idle(timeout_s=10)
            assert report.done and report.waiting == ()
            ok, bad, flaky, boom = h.records()
            assert (ok.state, ok.outcome_types, ok.delivery_count) == (ACKNOWLEDGED, [ACCEPT], 1)
            assert (bad.state, bad.outcome_types) == (ARCHIVED, [REJECT])
            assert flaky.state is ACKNOWLEDGED
            assert flaky.outcome_types == [RELEASE, RELEASE, ACCEPT]
            assert [d.delivery_count for d in flaky.deliveries] == [1, 2, 3]
            assert {d.member for d in flaky.deliveries} == {"by_value#0"}
            assert (boom.state, boom.outcome_types) == (ARCHIVED, [RELEASE] * 3)
            assert [r.offset for r in h.archived()] == [1, 3]
            assert [r.offset for r in h.acknowledged()] == [0, 2]
            view = h.share_partition(0)
            assert view is not None and (view.spso, view.speo, dict(view.in_flight)) == (4, 4, {})
            errors = h.handler_errors
            assert [e.event for e in errors] == ["handler_raised_record_released"] * 3
            assert [e.line["delivery_count"] for e in errors] == [1, 2, 3]
            assert all(e.member == "by_value#0" and "boom" in e.error for e in errors)
            assert errors[0].line["offset"] == 3

            h.put(b"ok")  # after the members went idle: fetched without moving the clock
            assert (await h.run_until_idle(timeout_s=10)).done
            assert h.history(4).state is ACKNOWLEDGED

    run(scenario())


class Order(faust.Record, serializer="json"):
    amount: int


def test_an_app_agent_sees_values_decoded_as_in_production() -> None:
    """Built from an ``@app.share_agent`` object: the agent's group, name and options, and
    values put through its topic's serializers, so the handler sees the decoded value; the
    key picks the partition as Kafka's default partitioner does."""
    app = queueflow.App("harness-app", broker="kafka://localhost:9092", role="member")
    orders = app.topic("orders", key_type=str, value_type=Order)
    seen: list[tuple[Any, Any, list[tuple[str, bytes]], int]] = []

    @app.share_agent(orders, group="billing", concurrency=2, name="bill")
    async def bill(record: ShareRecord) -> None:
        seen.append((record.key, record.value, list(record.headers), record.partition))

    async def scenario() -> None:
        async with ShareAgentHarness(bill, partitions=4) as h:
            ref = h.put(Order(amount=3), key="acct-1", headers={"trace": b"t1"})
            again = h.put(Order(amount=4), key="acct-1")
            assert ref.partition == again.partition  # partitioned by key
            assert (await h.run_until_idle()).done
            assert h.members[0].group == "billing" and h.members[0].concurrency == 2
            assert h.history(ref.offset, partition=ref.partition).state is ACKNOWLEDGED
            assert h.history(0, partition=ref.partition).deliveries[0].member == "bill#0"

    run(scenario())
    assert sorted(v.amount for _, v, _, _ in seen) == [3, 4]
    assert all(isinstance(v, Order) for _, v, _, _ in seen)
    assert {k for k, _, _, _ in seen} == {"acct-1"}
    assert seen[0][2] == [("trace", b"t1")]


def test_a_hung_handler_waits_for_time_and_its_lock_expiry_redelivers_the_record() -> None:
    """A handler that hangs on the first delivery: ``run_until_idle`` comes back not done,
    naming the Acquired record; advancing past the lock cancels the call, the record is
    delivered again (delivery count 2) and ACCEPTed."""
    calls: list[int] = []

    async def hangs_once(record: ShareRecord) -> Any:
        calls.append(record.delivery_count)
        if record.delivery_count == 1:
            await asyncio.Event().wait()
        return ACCEPT

    async def scenario() -> None:
        async with ShareAgentHarness(
            hangs_once, topic="jobs", group_config={"share.record.lock.duration.ms": 5_000}
        ) as h:
            h.put(b"x")
            report = await h.run_until_idle()
            assert not report.done
            assert any("offsets 0..0: ACQUIRED by hangs_once#0" in w for w in report.waiting)
            view = h.share_partition(0)
            assert view is not None and view.in_flight[0] == (
                RecordState.ACQUIRED,
                1,
                "hangs_once#0",
            )
            report = await h.advance(ms=5_000)
            assert report.done
            record = h.history(0)
            assert record.state is ACKNOWLEDGED and record.delivery_count == 2
            assert calls == [1, 2]

    run(scenario())


def test_a_handler_timeout_is_seen_at_its_time_with_steps() -> None:
    """``handler_timeout_ms=500`` with ``advance(..., step_ms=100)``: the call is cancelled at
    500 ms (well inside its 30 s lock) and its record RELEASEd, then ACCEPTed."""
    started: list[float] = []

    async def slow_once(record: ShareRecord) -> Any:
        if record.delivery_count == 1:
            await asyncio.Event().wait()
        return ACCEPT

    async def scenario() -> None:
        async with ShareAgentHarness(slow_once, topic="jobs", handler_timeout_ms=500) as h:
            h.put(b"x")
            assert not (await h.run_until_idle()).done
            started.append(h.clock.monotonic())
            await h.advance(ms=400, step_ms=100)
            assert h.history(0).outcome_types == []
            await h.advance(ms=200, step_ms=100)
            record = h.history(0)
            assert record.outcome_types == [RELEASE, ACCEPT] and record.state is ACKNOWLEDGED
            (error,) = h.handler_errors
            assert error.event == "handler_timed_out_records_released"
            assert error.line["handler_timeout_ms"] == 500

    run(scenario())


def test_several_members_share_the_partitions_and_each_record_is_handled_once() -> None:
    handled: Counter[tuple[int, int]] = Counter()

    async def handler(record: ShareRecord) -> None:
        handled[(record.partition, record.offset)] += 1

    async def scenario() -> None:
        async with ShareAgentHarness(handler, topic="jobs", partitions=3, members=3) as h:
            assert len(h.members) == 3
            assignments = [m.session.assignment for m in h.members if m.session]
            assert sorted(len(a) for a in assignments) == [1, 1, 1]
            h.put_many(f"r{i}".encode() for i in range(30))
            assert (await h.run_until_idle()).done
            by_member = {(r.partition, r.deliveries[0].member) for r in h.records() if r.deliveries}
            assert len({m for _, m in by_member}) == 3  # each handled its own partition
            assert len(by_member) == 3

    run(scenario())
    assert handled == Counter({(p, o): 1 for p in range(3) for o in range(10)})


def test_a_crashed_members_records_come_back_when_its_session_expires() -> None:
    """Two members, one partition each; one crashes holding a record: its session expires
    when the clock passes ``share.session.timeout.ms`` (the live member keeps heartbeating),
    and the other member handles the record."""
    hold = asyncio.Event()

    async def handler(record: ShareRecord) -> None:
        if record.delivery_count == 1 and record.value == b"held":
            await hold.wait()

    async def scenario() -> None:
        async with ShareAgentHarness(
            handler,
            topic="jobs",
            partitions=2,
            members=2,
            group_config={"share.session.timeout.ms": 10_000},
        ) as h:
            ref = h.put(b"held", partition=0)
            assert not (await h.run_until_idle()).done
            owner = h.share_partition(0)
            assert owner is not None
            holder = owner.in_flight[ref.offset][2]
            assert holder is not None
            await h.stop_member(holder, crash=True)
            report = await h.advance(ms=11_000)
            record = h.history(ref.offset)
            assert record.state is ACKNOWLEDGED
            assert [d.delivery_count for d in record.deliveries] == [1, 2]
            assert record.deliveries[1].member != holder
            assert report.done
            hold.set()

    run(scenario())


def test_concurrent_batches_with_one_outcome_per_record() -> None:
    calls: list[list[int]] = []

    async def batch(records: list[ShareRecord]) -> list[Any]:
        calls.append([r.offset for r in records])
        return [REJECT if r.offset % 2 else ACCEPT for r in records]

    async def scenario() -> None:
        async with ShareAgentHarness(
            batch, topic="jobs", batch=True, batch_size=3, concurrency=2
        ) as h:
            h.put_many(b"x" for _ in range(10))
            assert (await h.run_until_idle()).done
            assert [r.offset for r in h.archived()] == [1, 3, 5, 7, 9]
            assert all(r.outcome_types in ([ACCEPT], [REJECT]) for r in h.records())

    run(scenario())
    assert max(len(c) for c in calls) <= 3
    assert sorted(o for c in calls for o in c) == list(range(10))


def test_run_until_idle_names_what_is_in_flight_when_its_bound_is_hit() -> None:
    """A handler that puts a record back on its own topic never lets the group go idle."""

    async def scenario() -> None:
        h: ShareAgentHarness

        async def forever(record: ShareRecord) -> None:
            h.put(b"again")

        async with ShareAgentHarness(forever, topic="loop") as h:
            h.put(b"first")
            with pytest.raises(HarnessTimeout, match=r"still busy after 0.5 s") as raised:
                await h.run_until_idle(timeout_s=0.5)
            assert "test-group loop[0]" in str(raised.value)

    run(scenario())


def test_misuse_says_what_to_do() -> None:
    async def handler(record: ShareRecord) -> None:
        return None

    with pytest.raises(ConfigurationError, match="pass topic="):
        ShareAgentHarness(handler)
    with pytest.raises(ConfigurationError, match="needs a share agent"):
        ShareAgentHarness()
    with pytest.raises(ConfigurationError, match="concurrency=0"):
        ShareAgentHarness(handler, topic="jobs", concurrency=0)
    with pytest.raises(ConfigurationError, match="lock_duration_ms=10 is out of range"):
        ShareAgentHarness(handler, topic="jobs", lock_duration_ms=10)
    with pytest.raises(TypeError, match="share agents or async handlers"):
        ShareAgentHarness(42, topic="jobs")  # type: ignore[arg-type]
    h = ShareAgentHarness(handler, topic="jobs", partitions=2)
    with pytest.raises(ValueError, match=r"has 2 partition\(s\) \(0..1\); partition=5"):
        h.put(b"x", partition=5)
    with pytest.raises(ConfigurationError, match=r"unknown topic 'nope'.*topics=\{'nope'"):
        h.put(b"x", topic="nope")
    with pytest.raises(TypeError, match=r"carries raw bytes.*put a bytes value, not dict"):
        h.put({"a": 1})
    with pytest.raises(ConfigurationError, match="no agent of the harness has dead_letter"):
        h.dead_letters()


def test_group_configs_and_settings_reach_the_leaders() -> None:
    """``share.auto.offset.reset`` is earliest in the harness; a group config of ``latest``
    skips what was put before the group's share-partition started (the first fetch)."""

    async def handler(record: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        h = ShareAgentHarness(
            handler,
            topic="jobs",
            group_configs={"test-group": {"share.auto.offset.reset": "latest"}},
        )
        h.put(b"early")  # before the members start
        async with h:
            h.put(b"late")
            assert (await h.run_until_idle()).done
            assert h.settings.auto_offset_reset.value == "earliest"
            assert h.history(0).deliveries == []
            assert h.history(1).state is ACKNOWLEDGED

        h = ShareAgentHarness(handler, topic="jobs")
        h.put(b"early")
        async with h:
            assert (await h.run_until_idle()).done
            assert h.history(0).state is ACKNOWLEDGED

    run(scenario())


def test_advance_refuses_going_back() -> None:
    async def handler(record: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        async with ShareAgentHarness(handler, topic="jobs") as h:
            with pytest.raises(ValueError, match="doesn't go backwards"):
                await h.advance(ms=-1)
            with pytest.raises(KeyError, match=r"no member 'x#0'; members: \['handler#0'\]"):
                h.member("x#0")

    run(scenario())


def test_outcome_history_includes_renewals() -> None:
    """A call longer than its lock, with ``handler_timeout_ms`` beyond it: the lock is renewed
    (KIP-1222 RENEW) and the record ACCEPTed on its first delivery."""
    done = asyncio.Event()

    async def slow(record: ShareRecord) -> Any:
        await done.wait()
        return ACCEPT

    async def scenario() -> None:
        async with ShareAgentHarness(
            slow,
            topic="jobs",
            handler_timeout_ms=20_000,
            group_config={"share.record.lock.duration.ms": 5_000},
        ) as h:
            h.put(b"x")
            await h.run_until_idle()
            for _ in range(3):  # past each renewal point (lock - 0.5 s), before the lock
                await h.advance(ms=4_600)
            done.set()
            assert (await h.run_until_idle()).done
            record = h.history(0)
            assert record.delivery_count == 1 and record.state is ACKNOWLEDGED
            assert record.outcome_types[-1] is ACCEPT
            assert record.outcome_types == [AcknowledgeType.RENEW] * 3 + [ACCEPT]

    run(scenario())


def test_queueflow_testing_imports_without_pytest() -> None:
    code = (
        "import sys; sys.modules['pytest'] = None; sys.modules['_pytest'] = None\n"
        "import queueflow.testing as t; print(t.ShareAgentHarness.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "ShareAgentHarness"


def test_members_racing_on_one_partition_handle_each_record_once() -> None:
    """Three members of the group on one partition (KIP-932 lets several members share a
    partition): each record is acquired by one member at a time. One stopped while its calls
    hang past ``queueflow.shutdown.timeout.ms`` leaves the group, its records go to the others
    (delivery count 2) and every record ends ACCEPTed."""
    handled: Counter[int] = Counter()
    gate = asyncio.Event()

    async def handler(record: ShareRecord) -> None:
        handled[record.offset] += 1
        await gate.wait()

    async def scenario() -> set[int]:
        async with ShareAgentHarness(handler, topic="jobs", members=3, concurrency=2) as h:
            h.put_many(f"r{i}".encode() for i in range(12))
            report = await h.run_until_idle()
            assert not report.done  # every handler call waits on the gate
            view = h.share_partition(0)
            assert view is not None
            owners = {o: owner for o, (_, _, owner) in view.in_flight.items() if owner}
            assert len(set(owners.values())) >= 2  # they raced for the partition's records
            held = {o for o, owner in owners.items() if owner == "handler#0"}
            assert held
            await h.stop_member("handler#0")  # its calls hang: cancelled after 200 ms
            gate.set()
            assert (await h.run_until_idle()).done
            assert len(h.acknowledged()) == 12
            for record in h.records():
                again = record.offset in held
                assert record.delivery_count == (2 if again else 1), record
                assert record.outcome_types[-1] is ACCEPT
                if again:
                    assert record.deliveries[1].member != "handler#0"
            assert any(line["event"] == "drain_timeout" for line in h.logs)
            return held

    held = run(scenario())
    # its records queued behind the hung calls were released unhandled: handled once, elsewhere
    assert set(handled) == set(range(12))
    assert all(n == 1 or (n == 2 and o in held) for o, n in handled.items())
