"""A second delivery of an offset to the ``exactly_once`` member that has it in a transaction or
committed it moments ago publishes nothing again (queueflow/member/agent/committed.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, cluster_with, events, run
from structlog.testing import capture_logs

from queueflow import Result
from queueflow.member.agent import ShareAgent
from queueflow.member.agent.committed import CommittedOffsets, Seen
from queueflow.member.agent.outputs import Outbound
from queueflow.member.agent.results import HandlerResult, Returned
from queueflow.member.agent.transactions import TransactionalPublisher
from queueflow.settings import ProcessingGuarantee
from queueflow.structs import AcknowledgeType, ShareRecord

ACCEPT, RELEASE, REJECT = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT


def record(offset: int, delivery_count: int = 1, deadline: float = 1e9) -> ShareRecord:
    return ShareRecord(TOPIC, 0, offset, None, b"v", [], 0, delivery_count, b"v", b"k", deadline)


def test_an_offset_is_new_then_in_a_transaction_then_committed_for_the_window() -> None:
    offsets = CommittedOffsets(window_s=10.0)
    r = record(5)
    assert offsets.seen(r, 0.0) == (Seen.NEW, None)
    offsets.claim(r)
    assert offsets.seen(record(5, delivery_count=2), 0.0) == (Seen.IN_TRANSACTION, None)
    offsets.committed(r, ACCEPT, 1.0)
    assert offsets.seen(record(5, delivery_count=2), 10.9) == (Seen.COMMITTED, ACCEPT)
    assert offsets.seen(record(5, delivery_count=2), 11.0) == (Seen.NEW, None)
    assert len(offsets) == 0


def test_an_offset_unclaimed_without_a_commit_is_new_again() -> None:
    offsets = CommittedOffsets(window_s=10.0)
    r = record(5)
    offsets.claim(r)
    offsets.unclaim(r)
    assert offsets.seen(r, 0.0) == (Seen.NEW, None)


@given(st.lists(st.integers(0, 50), min_size=1, max_size=200), st.integers(1, 20))
def test_at_most_max_remembered_offsets_are_kept(offsets_: list[int], cap: int) -> None:
    offsets = CommittedOffsets(window_s=1e9, max_remembered=cap)
    for i, offset in enumerate(offsets_):
        offsets.committed(record(offset), ACCEPT, float(i))
    assert len(offsets) <= cap
    assert offsets.seen(record(offsets_[-1]), 0.0)[0] is Seen.COMMITTED  # the newest is kept


def agent() -> ShareAgent:
    async def handler(r: ShareRecord) -> None:
        return None

    ctx = cluster_with(0, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE).member_context
    return ShareAgent(ctx, handler, TOPIC, "g", processing_guarantee="exactly_once")


def accepted(r: ShareRecord) -> HandlerResult:
    outputs = ((Outbound("out", b"k", b"result"),),)
    return HandlerResult([r], (ACCEPT,), None, Returned(None), True, outputs)


def test_a_copy_of_an_offset_in_a_transaction_is_dropped_with_its_results() -> None:
    transactions = TransactionalPublisher(agent())
    transactions.submit(accepted(record(3)))
    with capture_logs() as logs:
        left = transactions.submit(accepted(record(3, delivery_count=2)))
    assert left.records == [] and left.outputs is None
    assert [p.record.delivery_count for p in transactions._pending] == [1]
    (logged,) = events(logs, "share_agent_duplicate_delivery")
    assert logged["seen"] == "in_transaction" and logged["offset"] == 3


def test_a_copy_of_a_committed_offset_is_acknowledged_with_the_committed_outcome() -> None:
    a = agent()
    transactions = TransactionalPublisher(a)
    first = record(3)
    transactions.offsets.committed(first, REJECT, a.ctx.clock.monotonic())
    left = transactions.submit(accepted(record(3, delivery_count=2)))
    assert left.outcomes == (REJECT,) and left.outputs is None and not transactions._pending
    assert transactions.duplicates == 1


def test_a_fetched_copy_of_a_committed_offset_never_reaches_a_handler() -> None:
    a = agent()
    transactions = TransactionalPublisher(a)
    transactions.offsets.committed(record(3), ACCEPT, a.ctx.clock.monotonic())
    transactions.offsets.claim(record(4))

    async def scenario() -> list[ShareRecord]:
        return transactions.screen([record(3, 2), record(4, 2), record(5)])

    kept = run(scenario())
    assert [r.offset for r in kept] == [5]


def test_a_leader_that_delivers_a_record_in_a_transaction_again_gets_no_second_result() -> None:
    """The leader's lock clock runs ahead (it ends the lock while the member's transaction is
    still committing) and delivers the record again to the same member: the member drops the new
    copy, the transaction's acknowledgement settles the offset, and nothing is published twice."""
    import asyncio

    from queueflow.testing import RecordState, ShareAgentHarness

    calls: list[int] = []

    async def handler(r: ShareRecord) -> object:
        calls.append(r.delivery_count)
        return Result(ACCEPT, [b"result"])

    async def scenario() -> None:
        async with ShareAgentHarness(
            handler,
            topic=TOPIC,
            group="g",
            topics={TOPIC: 1, "out": 1},
            sink=["out"],
            processing_guarantee="exactly_once",
            settings={
                "queueflow.processing.guarantee": "exactly_once",
                "queueflow.transaction.timeout.ms": 120_000,  # outlives the 31 s below
            },
        ) as h:
            h.cluster.leaders[TOPIC].fetcher.lock_clock = None  # a clock that runs ahead
            h.cluster.hold_commits()
            ref = h.put(b"job", key=b"k")
            await h.run_until_idle()
            assert calls == [1] and h.cluster.commits_held == 1
            with capture_logs() as logs:
                await h.advance(31_000)  # the lock ends at the leader: delivered again
            (logged,) = events(logs, "share_agent_duplicate_delivery")
            assert logged["seen"] == "in_transaction" and logged["delivery_count"] == 2
            h.cluster.release_commits()
            await h.run_until_idle()
            assert calls == [1]  # the handler never saw the second copy
            assert len(h.sent("out")) == 1
            history = h.history(ref.offset, partition=ref.partition)
            assert [d.delivery_count for d in history.deliveries] == [1, 2]
            assert history.state is RecordState.ACKNOWLEDGED

    run(asyncio.wait_for(scenario(), 60))
