"""The exactly_once member side without a broker: which records may enter a transaction (the
lock-deadline check), the acknowledgement messages per share-partition, and what ``submit``
leaves to the normal path. The transactions themselves run on the real broker
(tests/integration/test_composition.py)."""

from __future__ import annotations

import pytest
from inprocess_helpers import TOPIC, cluster_with, events, run, settle, until
from structlog.testing import capture_logs

from queueflow.errors import ConfigurationError
from queueflow.member.agent import ShareAgent
from queueflow.member.agent.outputs import Outbound
from queueflow.member.agent.results import Failure, HandlerResult, Returned
from queueflow.member.agent.transactions import (
    Pending,
    TransactionalPublisher,
    ack_batches,
    split_late,
    transactional_id,
)
from queueflow.settings import ProcessingGuarantee
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition
from queueflow.testing import FakeClock

ACCEPT, RELEASE, REJECT = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT


def record(offset: int, partition: int = 0, deadline: float = 100.0) -> ShareRecord:
    return ShareRecord(TOPIC, partition, offset, None, b"v", [], 0, 1, b"v", b"k", deadline)


def agent() -> ShareAgent:
    async def handler(r: ShareRecord) -> None:
        return None

    ctx = cluster_with(0, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE).member_context
    return ShareAgent(ctx, handler, TOPIC, "g", processing_guarantee="exactly_once")


def test_the_transactional_id_names_app_group_and_member() -> None:
    assert transactional_id("app", "g", "m-1") == "app-share-txn-g-m-1"


def test_only_records_whose_lock_outlasts_the_margin_enter_a_transaction() -> None:
    items = [
        Pending(record(0, deadline=10.5), ACCEPT, []),
        Pending(record(1, deadline=11.0), ACCEPT, []),
    ]
    ready, late = split_late(items, now=10.0, margin_s=0.5)
    assert [p.record.offset for p in ready] == [1]
    assert [p.record.offset for p in late] == [0]  # exactly at the margin: too late


def test_one_ack_message_per_share_partition_with_its_ranges() -> None:
    items = [
        Pending(record(0), ACCEPT, []),
        Pending(record(1), ACCEPT, []),
        Pending(record(2), REJECT, []),
        Pending(record(5, partition=1), ACCEPT, []),
    ]
    assert ack_batches(items) == {
        TopicPartition(TOPIC, 0): [(0, 1, (1,)), (2, 2, (3,))],
        TopicPartition(TOPIC, 1): [(5, 5, (1,))],
    }


def test_submit_keeps_releases_and_failures_on_the_normal_path() -> None:
    a = agent()
    transactions = TransactionalPublisher(a)
    rs = [record(0), record(1), record(2)]
    outputs = ((Outbound("out", b"k", b"r0"),), (), (Outbound("out", b"k", b"r2"),))
    left = transactions.submit(
        HandlerResult(rs, (ACCEPT, RELEASE, REJECT), None, Returned(None), True, outputs)
    )
    assert left.records == [rs[1]] and left.outcomes == (RELEASE,) and left.outputs is None
    assert [(p.record.offset, p.outcome) for p in transactions._pending] == [
        (0, ACCEPT),
        (2, REJECT),
    ]
    assert transactions._pending[0].encoded == [("out", b"r0", b"k", (), None)]
    failed = HandlerResult(rs[:1], (RELEASE,), Failure.RAISED, Returned(None))
    assert transactions.submit(failed) is failed


def test_a_value_the_serializer_refuses_releases_its_call_only() -> None:
    a = agent()
    transactions = TransactionalPublisher(a)
    bad = HandlerResult(
        [record(0)], (ACCEPT,), None, Returned(None), False, ((Outbound("out", b"k", object()),),)
    )
    with capture_logs() as logs:
        left = transactions.submit(bad)
    assert left.outcomes == (RELEASE,) and not transactions._pending
    (logged,) = events(logs, "share_agent_results_not_published")
    assert logged["sink_topic"] == "out"


def test_records_too_late_for_a_transaction_are_released_without_one() -> None:
    """No producer was started: a transaction would fail; late records never get there."""
    a = agent()
    transactions = TransactionalPublisher(a)
    now = a.ctx.clock.monotonic()
    transactions.submit(
        HandlerResult([record(0, deadline=now + 0.001)], (ACCEPT,), None, Returned(None), False)
    )

    async def scenario() -> None:
        with capture_logs() as logs:
            await transactions.flush()
        assert events(logs, "acquisition_lock_expired_before_handling")

    run(scenario())
    assert (transactions.committed, transactions.aborted) == (0, 0)
    assert a.stats.lock_expired == 1 and a.stats.accepted == 0


def test_an_exactly_once_agent_is_refused_at_start_without_transactions() -> None:
    """A cluster without transactions (``transactions=False``: as one whose principal lacks the
    transactional-id ACLs): the agent's start fails naming why, and it leaves the group."""
    c = cluster_with(1, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE)
    c.transactions = False

    async def handler(r: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        async with c:
            with pytest.raises(ConfigurationError, match="needs Kafka transactions") as caught:
                await c.agent(handler, TOPIC, "g", processing_guarantee="exactly_once")
            assert "share-txn-" in str(caught.value) and "no transactions" in str(caught.value)

    run(scenario())


def test_an_exactly_once_agent_runs_in_memory() -> None:
    """The in-process cluster has transactions: an exactly_once agent starts, commits its
    ACCEPT through the ack topic, and the leader applies it."""
    clock = FakeClock()
    c = cluster_with(2, clock=clock, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE)

    async def handler(r: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        async with c:
            a = await c.agent(handler, TOPIC, "g", processing_guarantee="exactly_once")
            await until(lambda: a.stats.accepted == 2, "both records ACCEPTed", clock)
            assert a.transactions is not None and a.transactions.committed >= 1
            await settle(c)
            engine = c.share_partition("g", TOPIC, 0)
            assert int(engine.start_offset) == 2  # both Acknowledged: the SPSO moved past them

    run(scenario())


def test_an_exactly_once_agent_on_an_at_least_once_app_is_refused() -> None:
    """Its leaders would never read its transactional acknowledgements: refused when built,
    naming the app setting."""

    async def handler(r: ShareRecord) -> None:
        return None

    ctx = cluster_with(0).member_context
    with pytest.raises(ConfigurationError, match=r"queueflow\.processing\.guarantee=exactly_once"):
        ShareAgent(ctx, handler, TOPIC, "g", processing_guarantee="exactly_once")
