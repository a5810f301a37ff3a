"""The share-partition leader's pure handlers (queueflow.server.leader.handlers, resets,
fencing), called directly: no asyncio, no Kafka, no table writes; and the lifecycles' transition
tables (share-partitions in the leader's cache, leaderships in engine.fencing)."""

from __future__ import annotations

import itertools

import pytest

from queueflow.engine.fencing import (
    LEADERSHIP_TRANSITIONS,
    CoordinatorEpochs,
    IllegalTransitionError,
    Leadership,
    LeadershipState,
    PartitionFencing,
)
from queueflow.engine.partition import SharePartitionConfig
from queueflow.errors import CorruptStateError, ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader import cache as cache_module
from queueflow.server.leader import fencing, handlers, parking, resets
from queueflow.server.leader.cache import (
    SHARE_PARTITION_TRANSITIONS,
    SharePartitionCache,
    SharePartitionState,
)
from queueflow.server.leader.results import NOTHING, LeaderResult, MetricIncrement, NewState
from queueflow.server.tickets import TicketRefusal
from queueflow.structs import AcknowledgeType

TOPIC = "jobs"
NOW = 1_000_000
LOCK_MS = 30_000
ACCEPT, RELEASE = int(AcknowledgeType.ACCEPT), int(AcknowledgeType.RELEASE)


def share_partition(
    start: int = 0, table: dict[bytes, bytes] | None = None
) -> DurableSharePartition:
    return DurableSharePartition.create(
        {} if table is None else table, "g", TOPIC, 0, SharePartitionConfig(), 0, start
    )


def request(
    max_records: int = 10,
    acks: list[tuple[int, int, tuple[int, ...]]] | None = None,
    deadline_ms: int = NOW + 1000,
    member_id: str = "m",
) -> protocol.ShareFetchRequest:
    return protocol.ShareFetchRequest(
        group="g",
        topic=TOPIC,
        partition=0,
        member_id=member_id,
        request_id=7,
        reply_partition=0,
        max_records=max_records,
        acks=acks or [],
        deadline_ms=deadline_ms,
    )


def acquired(durable: DurableSharePartition, log_end: int, member_id: str = "m") -> None:
    durable.engine.acquire(member_id, 100, log_end, NOW, None)
    durable.persist()


# -- ShareFetch ------------------------------------------------------------------------------


def test_a_share_fetch_acquires_in_memory_and_returns_the_write_it_needs() -> None:
    table: dict[bytes, bytes] = {}
    durable = share_partition(table=table)
    before = dict(table)
    fetched = handlers.share_fetch(durable, request(), NOW, acquire_from=(3, None))
    assert fetched.response.acquired == [(0, 2, 1)]
    assert fetched.response.lock_timeout_ms == LOCK_MS
    assert fetched.durable is durable
    assert table == before  # the handler wrote nothing: the applier does
    labels = ("g", TOPIC, "0")
    assert fetched.effects.metrics == (
        MetricIncrement("acquisitions", labels, 3),
        MetricIncrement("deliveries", (*labels, "1"), 3),
    )
    result = handlers.answer_from_log(fetched, request(), offset=41, now_ms=NOW, replayed=False)
    assert result.writes == (durable,) and result.position == 41 and result.flush
    assert [r.response for r in result.replies] == [fetched.response]
    assert not result.changed  # no acknowledgements: nothing released for parked requests


def test_a_share_fetch_before_the_own_fence_applies_acknowledgements_but_acquires_nothing() -> None:
    durable = share_partition()
    acquired(durable, 3)
    acks = request(max_records=0, acks=[(0, 2, (ACCEPT,))])
    fetched = handlers.share_fetch(durable, acks, NOW, acquire_from=None)
    assert fetched.response.acquired == [] and fetched.response.ack_error == "NONE"
    assert durable.engine.start_offset == 3  # acknowledged: the SPSO moved past them
    result = handlers.answer_from_log(fetched, acks, offset=5, now_ms=NOW, replayed=False)
    assert result.changed and result.position == 5


def test_a_refused_acknowledgement_reports_the_stale_batches() -> None:
    durable = share_partition()
    acquired(durable, 3, member_id="other")
    fetched = handlers.share_fetch(
        durable, request(max_records=0, acks=[(0, 2, (ACCEPT,))]), NOW, acquire_from=None
    )
    assert fetched.response.ack_error == ErrorCode.INVALID_RECORD_STATE.value
    assert fetched.response.ack_stale


def test_an_acquisition_refused_by_the_ticket_sets_the_error_and_counts_it() -> None:
    durable = share_partition()
    refusal = TicketRefusal(ErrorCode.FENCED_MEMBER_EPOCH, "fenced_epoch", "old epoch")
    fetched = handlers.share_fetch(durable, request(), NOW, acquire_from=(None, refusal))
    assert fetched.response.error == ErrorCode.FENCED_MEMBER_EPOCH.value
    assert fetched.response.acquired == [] and durable.engine.acquired_count == 0
    assert fetched.effects.metrics == (MetricIncrement("ticket_refusals", (TOPIC, "fenced_epoch")),)
    (log,) = fetched.effects.logs
    assert (log.event, log.limiter) == ("share_fetch_refused", "refusals")


def test_a_request_refused_by_its_ticket_refuses_its_acknowledgements_too() -> None:
    refusal = TicketRefusal(ErrorCode.UNKNOWN_MEMBER_ID, "missing", "no ticket")
    fetched = handlers.refused_fetch(request(acks=[(0, 0, (ACCEPT,))]), TOPIC, 0, refusal)
    assert fetched.durable is None
    assert fetched.response.error == fetched.response.ack_error == "UNKNOWN_MEMBER_ID"
    result = handlers.answer_from_log(fetched, request(), offset=1, now_ms=NOW, replayed=False)
    assert result.writes == () and result.position is None and len(result.replies) == 1


def test_corrupt_state_is_answered_with_its_code() -> None:
    fetched = handlers.unloadable_fetch(request(), TOPIC, 0, CorruptStateError("bad snapshot"))
    assert fetched.response.error == ErrorCode.CORRUPT_STATE.value and fetched.durable is None


def test_a_replayed_request_is_answered_only_while_its_member_waits() -> None:
    durable = share_partition()
    late = request(deadline_ms=NOW - 1)
    fetched = handlers.share_fetch(durable, late, NOW, acquire_from=None)
    result = handlers.answer_from_log(fetched, late, offset=3, now_ms=NOW, replayed=True)
    assert result.replies == () and result.writes == (durable,)
    result = handlers.answer_from_log(fetched, late, offset=3, now_ms=NOW, replayed=False)
    assert len(result.replies) == 1


# -- ticks, releases -------------------------------------------------------------------------


def test_a_tick_expires_elapsed_locks_and_writes_only_what_changed() -> None:
    expiring, idle = share_partition(), share_partition()
    acquired(expiring, 2)
    assert handlers.tick([expiring, idle], NOW) == NOTHING  # not elapsed yet
    result = handlers.tick([expiring, idle], NOW + LOCK_MS)
    assert result.writes == (expiring,) and result.changed
    assert result.metrics == (MetricIncrement("lock_expiries", ("g", TOPIC, "0"), 2),)
    assert expiring.engine.available_count == 2


def test_a_release_member_releases_its_records_and_persists_the_position() -> None:
    durable = share_partition()
    acquired(durable, 4, member_id="gone")
    message = protocol.ReleaseMember(group="g", topic=TOPIC, partition=0, member_id="gone")
    assert handlers.release_member(message, None, NOW, 9) == NOTHING
    result = handlers.release_member(message, durable, NOW, 9)
    assert result.writes == (durable,) and result.position == 9 and result.changed
    assert result.logs[0].event == "member_records_released"
    assert result.logs[0].fields["records"] == 4
    assert handlers.release_member(message, durable, NOW, 10) == NOTHING  # nothing left


# -- admin resets ----------------------------------------------------------------------------


def reset_message(
    start: int | None, deadline_ms: int = 0, topic: str = TOPIC
) -> protocol.ResetSharePartition:
    return protocol.ResetSharePartition(
        group="g",
        topic=topic,
        partition=0,
        admin_id="admin",
        request_id=3,
        start_offset=start,
        deadline_ms=deadline_ms,
    )


def test_a_reset_is_refused_for_another_topic_and_after_its_deadline() -> None:
    check = {"topic": TOPIC, "request_topic": "app-share-fetch-jobs", "partition": 0}
    wrong = resets.check_reset(reset_message(5, topic="other"), now_ms=NOW, **check)
    assert wrong is not None and wrong.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    late = resets.check_reset(reset_message(5, deadline_ms=NOW - 1), now_ms=NOW, **check)
    assert late is not None and late.code is ErrorCode.REQUEST_TIMED_OUT
    assert resets.check_reset(reset_message(5, deadline_ms=NOW), now_ms=NOW, **check) is None
    result = resets.refused_reset(reset_message(5), 0, late)
    (answer,) = result.coordinator_replies
    assert answer.error == ErrorCode.REQUEST_TIMED_OUT.value and answer.start_offset == -1


def test_a_reset_of_a_share_partition_with_acquired_records_is_refused() -> None:
    durable = share_partition()
    acquired(durable, 2)
    with pytest.raises(ShareGroupError) as refused:
        resets.reset(reset_message(5), durable, partition=0, offset=1)
    assert refused.value.code is ErrorCode.NON_EMPTY_GROUP
    assert durable.engine.acquired_count == 2


def test_resets_and_deletes_return_their_state_changes() -> None:
    created = resets.reset(reset_message(5), None, partition=0, offset=1)
    assert created.creates == (NewState("g", 0, 5),)
    assert created.coordinator_replies[0].start_offset == 5 and created.position == 1
    durable = share_partition()
    moved = resets.reset(reset_message(8), durable, partition=0, offset=2)
    assert moved.writes == (durable,) and durable.engine.start_offset == 8
    assert moved.coordinator_replies[0].start_offset == 8 and moved.changed
    deleted = resets.reset(reset_message(None), durable, partition=0, offset=3)
    assert deleted.deletes == (durable,) and deleted.logs[0].event == "share_partition_deleted"
    nothing = resets.reset(reset_message(None), None, partition=0, offset=4)
    assert not nothing.changed and nothing.position is None and nothing.coordinator_replies


# -- fencing ---------------------------------------------------------------------------------


def test_fences_make_the_leader_live_or_step_it_down() -> None:
    leadership = PartitionFencing(10_000)
    leadership.assign({0}, 3)
    assert fencing.on_fence(leadership, 0, 2).logs[0].event == "fence_ignored"
    assert fencing.on_fence(leadership, 0, 3).logs[0].event == "leader_live"
    superseded = fencing.on_fence(leadership, 0, 4)
    assert superseded.step_down is not None and superseded.step_down[0] == (0,)
    assert "epoch 4" in superseded.step_down[1]


def test_a_stale_coordinator_is_refused_and_counted() -> None:
    epochs = CoordinatorEpochs(45_000)
    message = protocol.ReleaseMember(
        group="g", topic=TOPIC, partition=0, member_id="m", coordinator_epoch=5
    )
    assert fencing.stale_coordinator(epochs, message, 0, NOW) is None
    older = protocol.ReleaseMember(
        group="g", topic=TOPIC, partition=0, member_id="m", coordinator_epoch=4
    )
    refused = fencing.stale_coordinator(epochs, older, 0, NOW)
    assert refused is not None
    assert refused.metrics[0].metric == "stale_coordinator_refusals"
    assert refused.logs[0].fields["newest_coordinator_epoch"] == 5


def test_results_add_up_with_each_share_partition_written_once() -> None:
    a, b = share_partition(), share_partition()
    total = LeaderResult(writes=(a,)) + LeaderResult(writes=(b, a), flush=True, changed=True)
    assert total.writes == (a, b) and total.flush and total.changed


def test_only_an_answer_without_records_acknowledgements_or_error_parks() -> None:
    durable = share_partition()
    empty = protocol.ShareFetchResponse(member_id="m", request_id=1, topic=TOPIC, partition=0)
    item = parking.ParkedFetch(request(), None, empty, durable, until=10.0)  # type: ignore[arg-type]
    assert parking.should_park(item, 5.0)
    assert not parking.should_park(item, 10.0)  # its wait ended
    item.request = request(acks=[(0, 0, (ACCEPT,))])
    assert not parking.should_park(item, 5.0)  # acknowledgement results never wait


# -- lifecycles ------------------------------------------------------------------------------


def test_the_share_partition_transition_table_is_enforced_in_one_place() -> None:
    allowed = {
        (SharePartitionState.UNLOADED, SharePartitionState.LIVE),
        (SharePartitionState.UNLOADED, SharePartitionState.REFUSED),
        (SharePartitionState.LIVE, SharePartitionState.RETAINED),
        (SharePartitionState.LIVE, SharePartitionState.UNLOADED),
        (SharePartitionState.RETAINED, SharePartitionState.LIVE),
        (SharePartitionState.RETAINED, SharePartitionState.UNLOADED),
        (SharePartitionState.REFUSED, SharePartitionState.UNLOADED),
    }
    table = {(a, b) for a, targets in SHARE_PARTITION_TRANSITIONS.items() for b in targets}
    assert table == allowed
    for start, to in itertools.product(SharePartitionState, repeat=2):
        cache = SharePartitionCache({}, TOPIC, None, 0, lambda p: 1, None)  # type: ignore[arg-type]
        if start is not SharePartitionState.UNLOADED:
            cache._entries[("g", 0)] = cache_module._Entry(start, share_partition())
        if (start, to) in allowed:
            cache._move(("g", 0), to, share_partition())
            assert cache.state(("g", 0)) is to
        else:
            with pytest.raises(cache_module.IllegalTransitionError):
                cache._move(("g", 0), to, share_partition())


def test_dropping_a_partition_retains_live_share_partitions_fenced_and_forgets_refused_ones() -> (
    None
):
    cache = SharePartitionCache({}, TOPIC, None, 0, lambda p: 1, None)  # type: ignore[arg-type]
    durable = share_partition()
    cache._move(("g", 0), SharePartitionState.LIVE, durable)
    cache._move(("h", 0), SharePartitionState.REFUSED, error=CorruptStateError("bad"))
    cache.drop({0}, "a newer leader's fence")
    assert cache.state(("g", 0)) is SharePartitionState.RETAINED
    assert durable.fenced == "a newer leader's fence"
    assert cache.state(("h", 0)) is SharePartitionState.UNLOADED
    assert cache.live() == []
    cache.forget_retained({0})
    assert cache.state(("g", 0)) is SharePartitionState.RETAINED
    cache.forget_retained(set())
    assert cache.state(("g", 0)) is SharePartitionState.UNLOADED


def test_the_leadership_transition_table_is_enforced_in_one_place() -> None:
    allowed = {
        (LeadershipState.ASSIGNED, LeadershipState.LIVE),
        (LeadershipState.ASSIGNED, LeadershipState.SUPERSEDED),
        (LeadershipState.ASSIGNED, LeadershipState.STALLED),
        (LeadershipState.LIVE, LeadershipState.SUPERSEDED),
        (LeadershipState.LIVE, LeadershipState.STALLED),
        (LeadershipState.STALLED, LeadershipState.ASSIGNED),
    }
    table = {(a, b) for a, targets in LEADERSHIP_TRANSITIONS.items() for b in targets}
    assert table == allowed
    for start, to in itertools.product(LeadershipState, repeat=2):
        lead = Leadership(1, state=start)
        if (start, to) in allowed:
            lead.move_to(to, "why")
            assert lead.state is to
            assert lead.live == (to is LeadershipState.LIVE)
            stepped_down = to in (LeadershipState.SUPERSEDED, LeadershipState.STALLED)
            assert lead.fenced == ("why" if stepped_down else None)
        else:
            with pytest.raises(IllegalTransitionError):
                lead.move_to(to)
