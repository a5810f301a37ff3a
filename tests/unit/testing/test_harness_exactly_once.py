"""``exactly_once`` share agents in ``ShareAgentHarness``: the member's real transactional
publisher against the in-memory transactions, the leaders' real ``AckApplier`` on the in-memory
ack topics and their lock clock. Results become visible only at commit, together with the
acknowledgement; a RELEASE, an abort, a late record or a crash publishes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import queueflow
from queueflow import ACCEPT, REJECT, RELEASE, DeadLetter, Result, Send
from queueflow.protocol import topics
from queueflow.structs import ShareRecord
from queueflow.testing import FakeClock, RecordState, ShareAgentHarness

OUT = "out"


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def events(h: ShareAgentHarness, name: str) -> list[dict[str, Any]]:
    return [line for line in h.logs if line["event"] == name]


def harness(handler: Any, **kwargs: Any) -> ShareAgentHarness:
    """A harness running ``handler`` as an exactly_once agent of topic ``jobs``."""
    topics_ = {OUT: 1, "dlq": 1, **kwargs.pop("topics", {})}
    return ShareAgentHarness(
        handler, topic="jobs", topics=topics_, processing_guarantee="exactly_once", **kwargs
    )


def values(h: ShareAgentHarness, topic: str = OUT) -> list[bytes | None]:
    return [r.value for r in h.sent(topic)]


def test_an_accept_publishes_its_result_once_at_commit_with_its_acknowledgement() -> None:
    async def handler(record: ShareRecord) -> Any:
        return Result(ACCEPT, [Send(OUT, record.value + b"!")])

    async def scenario() -> None:
        async with harness(handler) as h:
            assert h.settings.processing_guarantee.value == "exactly_once"  # set by the harness
            h.cluster.hold_commits()
            h.put(b"a", key=b"k")
            report = await h.run_until_idle()
            assert not report.done and h.cluster.commits_held == 1
            assert values(h) == []  # the transaction is open: nothing visible
            assert h.history(0).state is RecordState.ACQUIRED and not h.history(0).outcomes
            h.cluster.release_commits()
            assert (await h.run_until_idle()).done
            (result,) = h.sent(OUT)
            assert (result.key, result.value) == (b"k", b"a!")
            record = h.history(0)
            assert record.outcome_types == [ACCEPT] and record.state is RecordState.ACKNOWLEDGED
            member = h.members[0]
            assert member.transactions is not None
            assert (member.transactions.committed, member.transactions.aborted) == (1, 0)
            # The ACCEPT went through the ack topic, applied by the leader's AckApplier.
            acks = h.cluster.acks
            assert acks is not None
            assert len(acks.messages(topics.ack_topic(h.cluster.app_id, "jobs"), 0)) == 1
            applied = h.cluster.metrics.transactional_acks.labels("jobs")._value.get()
            assert applied == 1
            assert member.stats.accepted == 1

    run(scenario())


def test_a_release_publishes_nothing_and_the_record_comes_back() -> None:
    async def handler(record: ShareRecord) -> Any:
        if record.delivery_count == 1:
            return Result(RELEASE, [Send(OUT, b"never")])
        return Result(ACCEPT, [Send(OUT, b"once")])

    async def scenario() -> None:
        async with harness(handler) as h:
            h.put(b"a")
            assert (await h.run_until_idle()).done
            assert values(h) == [b"once"]
            assert h.history(0).outcome_types == [RELEASE, ACCEPT]
            assert h.members[0].transactions.committed == 1  # type: ignore[union-attr]

    run(scenario())


def test_a_reject_publishes_only_its_dead_letters() -> None:
    async def handler(record: ShareRecord) -> Any:
        if record.value == b"bad":
            return REJECT  # the automatic copy to dead_letter=
        if record.value == b"worse":
            return Result(REJECT, [Send(OUT, b"dropped"), DeadLetter(reason="worse")])
        return Result(ACCEPT, [Send(OUT, record.value), DeadLetter(reason="dropped too")])

    async def scenario() -> None:
        async with harness(handler, dead_letter="dlq") as h:
            h.put_many([b"bad", b"worse", b"good"])
            assert (await h.run_until_idle()).done
            assert values(h) == [b"good"]
            dead = h.dead_letters()
            assert sorted(d.value or b"" for d in dead) == [b"bad", b"worse"]
            reasons = {dict(d.headers).get("queueflow.dead_letter.reason") for d in dead}
            assert reasons == {b"rejected", b"worse"}
            assert [r.state for r in h.records()] == [
                RecordState.ARCHIVED,
                RecordState.ARCHIVED,
                RecordState.ACKNOWLEDGED,
            ]
            assert [r.outcome_types for r in h.records()] == [[REJECT], [REJECT], [ACCEPT]]

    run(scenario())


def test_an_aborted_transaction_publishes_nothing_and_the_record_is_released() -> None:
    """A destination that doesn't exist aborts the transaction: the result to the existing
    topic of the same call is not published either; the record is RELEASEd, delivered again."""

    async def handler(record: ShareRecord) -> Any:
        if record.delivery_count == 1:
            return Result(ACCEPT, [Send(OUT, b"first"), Send("missing", b"x")])
        return Result(ACCEPT, [Send(OUT, b"second")])

    async def scenario() -> None:
        async with harness(handler) as h:
            h.put(b"a")
            assert (await h.run_until_idle()).done
            assert values(h) == [b"second"]
            assert h.history(0).outcome_types == [RELEASE, ACCEPT]
            (aborted,) = events(h, "share_agent_transaction_aborted")
            assert aborted["sink_topic"] == "missing"
            txn = h.members[0].transactions
            assert txn is not None and (txn.committed, txn.aborted) == (1, 1)

    run(scenario())


def test_a_failed_send_inside_a_transaction_discards_what_it_sent_before() -> None:
    """The topic exists but the partition doesn't: the send fails after the first result was
    buffered in the transaction; the abort discards it."""

    async def handler(record: ShareRecord) -> Any:
        if record.delivery_count == 1:
            return Result(ACCEPT, [Send(OUT, b"first", partition=0), Send(OUT, b"x", partition=7)])
        return Result(ACCEPT, [Send(OUT, b"second", partition=0)])

    async def scenario() -> None:
        async with harness(handler) as h:
            h.put(b"a")
            assert (await h.run_until_idle()).done
            assert values(h) == [b"second"]
            assert h.history(0).outcome_types == [RELEASE, ACCEPT]
            assert events(h, "share_agent_transaction_aborted")

    run(scenario())


def test_a_record_whose_lock_ends_within_the_margin_is_not_put_in_a_transaction() -> None:
    """The handler returns with the record's lock ending within the lock margin (the fake clock
    moved meanwhile): its outcome could reach the leader after the lock elapsed, so it enters
    no transaction; it is RELEASEd, nothing is published, and it is delivered again."""
    clock = FakeClock()

    async def handler(record: ShareRecord) -> Any:
        if record.delivery_count == 1:
            clock.advance(29_500)  # the 30 s lock now ends in 0.5 s: within the 1 s margin
        return Result(ACCEPT, [Send(OUT, b"r%d" % record.delivery_count)])

    async def scenario() -> None:
        async with harness(handler, clock=clock, lock_duration_ms=30_000) as h:
            h.put(b"a")
            assert (await h.run_until_idle()).done
            assert values(h) == [b"r2"]
            assert h.history(0).outcome_types == [RELEASE, ACCEPT]
            assert events(h, "acquisition_lock_expired_before_handling")
            txn = h.members[0].transactions
            assert txn is not None and (txn.committed, txn.aborted) == (1, 0)
            assert h.members[0].stats.lock_expired == 1

    run(scenario())


def test_a_crashed_members_open_transaction_publishes_nothing() -> None:
    """The member crashes with its transaction open (its commit held): nothing of it is
    published. The open transaction holds the releases of its partition (the lock clock) until
    its timeout aborts it, although the record's 5 s lock ended; then the record goes to the
    other member, whose transaction publishes its result once."""

    async def handler(record: ShareRecord) -> Any:
        return Result(ACCEPT, [Send(OUT, record.value)])

    async def scenario() -> None:
        async with harness(
            handler,
            members=2,
            lock_duration_ms=5_000,
            settings={"queueflow.transaction.timeout.ms": 10_000},
        ) as h:
            h.cluster.hold_commits()
            h.put(b"a")
            await h.run_until_idle()
            assert h.cluster.commits_held == 1
            (delivery,) = h.history(0).deliveries
            await h.stop_member(delivery.member, crash=True)
            h.cluster.release_commits()
            await h.advance(6_000)  # the lock ended, the open transaction holds it
            assert values(h) == []
            assert h.history(0).state is RecordState.ACQUIRED
            assert h.history(0).delivery_count == 1
            await h.advance(5_000, step_ms=1_000)  # past the transaction timeout: aborted
            assert (await h.run_until_idle()).done
            assert values(h) == [b"a"]
            record = h.history(0)
            assert [d.member for d in record.deliveries] == [
                delivery.member,
                next(m for m in ("handler#0", "handler#1") if m != delivery.member),
            ]
            assert record.outcome_types == [ACCEPT] and record.state is RecordState.ACKNOWLEDGED

    run(scenario())


def test_a_commit_after_the_transaction_timeout_fails_and_publishes_nothing() -> None:
    """The cluster aborted the open transaction (its timeout): the commit fails, nothing is
    published; the member can't tell a failed commit from one that went through, so the
    record is left to its lock, then delivered again."""

    async def handler(record: ShareRecord) -> Any:
        return Result(ACCEPT, [Send(OUT, b"r%d" % record.delivery_count)])

    async def scenario() -> None:
        async with harness(handler, settings={"queueflow.transaction.timeout.ms": 3_000}) as h:
            h.cluster.hold_commits()
            h.put(b"a")
            await h.run_until_idle()
            assert h.cluster.commits_held == 1
            await h.advance(4_000)  # the open transaction times out (the 30 s lock holds)
            h.cluster.release_commits()
            assert not (await h.run_until_idle()).done
            assert values(h) == []
            (aborted,) = events(h, "share_agent_transaction_aborted")
            assert "ProducerFenced" in aborted["error"] and aborted["released"] is False
            assert h.history(0).state is RecordState.ACQUIRED
            await h.advance(27_000)  # past the record's lock
            assert values(h) == [b"r2"]
            assert h.history(0).outcome_types == [ACCEPT]
            assert [d.delivery_count for d in h.history(0).deliveries] == [1, 2]

    run(scenario())


def test_an_app_wide_exactly_once_holds_in_the_harness() -> None:
    """An ``@app.share_agent`` without ``processing_guarantee=`` on an exactly_once app runs
    exactly_once in the harness (its settings follow); an at_least_once agent of the same app
    stays at_least_once."""
    app = queueflow.App(
        "harness-eos",
        broker="kafka://localhost:9092",
        role="member",
        share_settings={"queueflow.processing.guarantee": "exactly_once"},
    )

    @app.share_agent("jobs", group="g1", sink="mid")
    async def first(record: ShareRecord) -> Any:
        yield record.value + b"1"

    @app.share_agent("mid", group="g2", sink=OUT, processing_guarantee="at_least_once")
    async def second(record: ShareRecord) -> Any:
        yield record.value + b"2"

    async def scenario() -> None:
        async with ShareAgentHarness(first, second, topics={OUT: 1}) as h:
            assert h.settings.processing_guarantee.value == "exactly_once"
            first_member, second_member = h.members
            assert first_member.transactions is not None
            assert second_member.transactions is None
            h.put(b"a")
            assert (await h.run_until_idle()).done
            assert values(h, "mid") == [b"a1"]
            assert values(h) == [b"a12"]

    run(scenario())


def test_closing_the_harness_with_commits_held_commits_them() -> None:
    """The members drain on close: a commit held by ``hold_commits`` is let through rather
    than waited on forever."""

    async def handler(record: ShareRecord) -> Any:
        return Result(ACCEPT, [Send(OUT, record.value)])

    async def scenario() -> ShareAgentHarness:
        async with harness(handler) as h:
            h.cluster.hold_commits()
            h.put(b"a")
            await h.run_until_idle()
            assert h.cluster.commits_held == 1
        return h

    h = run(scenario())
    assert values(h) == [b"a"]


def test_a_member_that_leaves_with_a_record_in_hand_leaves_it_to_its_lock() -> None:
    """On an exactly_once app a leaving member's records stay Acquired until their own lock
    deadlines (``release_by_lock_end``: the member could still commit until then); then they
    go to another member, whose transaction publishes the result once."""
    hang = asyncio.Event()

    async def handler(record: ShareRecord) -> Any:
        if record.delivery_count == 1:
            await hang.wait()  # never set: the first holder is stopped mid-call
        return Result(ACCEPT, [Send(OUT, b"r%d" % record.delivery_count)])

    async def scenario() -> None:
        async with harness(handler, members=2, lock_duration_ms=5_000) as h:
            h.put(b"a")
            assert not (await h.run_until_idle()).done
            (delivery,) = h.history(0).deliveries
            await h.stop_member(delivery.member)  # graceful: drains, then leaves
            assert not (await h.run_until_idle()).done
            assert h.history(0).state is RecordState.ACQUIRED and values(h) == []
            assert (await h.advance(5_000)).done  # its lock ends
            assert values(h) == [b"r2"]
            assert [d.delivery_count for d in h.history(0).deliveries] == [1, 2]
            assert h.history(0).state is RecordState.ACKNOWLEDGED

    run(scenario())
