"""The parts of ``queueflow.member.agent`` on their own: the pure :func:`judge` of a handler
call, :class:`ShareAgentOptions` (the one declaration of ``share_agent``'s options), the
lifecycle tables of ``queueflow.member.lifecycle``, and the runner's one path for record and
batch handlers (which observes the acknowledgement latency for both)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from inprocess_helpers import TOPIC, cluster_with, run, until

import queueflow
from queueflow.errors import ConfigurationError
from queueflow.faust_app import ShareGroups
from queueflow.member.agent import (
    Failure,
    HandlerResult,
    Raised,
    Returned,
    ShareAgent,
    ShareAgentOptions,
    TimedOut,
    judge,
)
from queueflow.member.lifecycle import (
    AGENT_TRANSITIONS,
    HEALTH_TRANSITIONS,
    MEMBERSHIP_TRANSITIONS,
    SESSION_TRANSITIONS,
    AgentState,
    HandlersHealth,
    IllegalTransitionError,
    Lifecycle,
    MembershipState,
    SessionState,
)
from queueflow.structs import AcknowledgeType, ShareRecord
from queueflow.testing import FakeClock

ACCEPT, RELEASE, REJECT = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT


def records(n: int) -> list[ShareRecord]:
    return [ShareRecord(TOPIC, 0, offset, None, b"v", [], 0, 1) for offset in range(n)]


# -- judge: what a handler call yields ------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, ACCEPT), (ACCEPT, ACCEPT), (RELEASE, RELEASE), (REJECT, REJECT)],
)
def test_a_record_handler_outcome_is_the_records(value: Any, expected: AcknowledgeType) -> None:
    one = records(1)
    result = judge(Returned(value), one, batch=False)
    assert result == HandlerResult(one, (expected,), None, Returned(value), False)
    assert result.handler_errors == 0


@pytest.mark.parametrize("junk", ["ACCEPT", 1, [ACCEPT], AcknowledgeType.RENEW, object()])
def test_a_record_handler_returning_junk_releases_its_record(junk: Any) -> None:
    result = judge(Returned(junk), records(1), batch=False)
    assert result.outcomes == (RELEASE,)
    assert result.failure is Failure.INVALID_OUTCOME and result.handler_errors == 1


def test_a_raise_or_a_timeout_releases_every_record() -> None:
    batch = records(3)
    raised = judge(Raised(ValueError("boom")), batch, batch=True)
    assert raised.outcomes == (RELEASE,) * 3 and raised.failure is Failure.RAISED
    assert raised.handler_errors == 3
    timed_out = judge(TimedOut(), batch, batch=True)
    assert timed_out.outcomes == (RELEASE,) * 3 and timed_out.failure is Failure.TIMED_OUT
    assert timed_out.handler_errors == 0  # counted as handler_timeouts instead
    assert judge(TimedOut(), batch[:1], batch=False).failure is Failure.TIMED_OUT


def test_a_batch_handler_gives_one_outcome_per_record_or_one_for_all() -> None:
    batch = records(3)
    per_record = judge(Returned([None, RELEASE, REJECT]), batch, batch=True)
    assert per_record.outcomes == (ACCEPT, RELEASE, REJECT) and per_record.failure is None
    assert judge(Returned(REJECT), batch, batch=True).outcomes == (REJECT,) * 3
    assert judge(Returned(None), batch, batch=True).outcomes == (ACCEPT,) * 3
    wrong_length = judge(Returned([ACCEPT]), batch, batch=True)
    assert wrong_length.outcomes == (RELEASE,) * 3
    assert wrong_length.failure is Failure.INVALID_OUTCOME


@pytest.mark.parametrize(
    "value", [None, ACCEPT, RELEASE, REJECT, queueflow.release(delay=2)], ids=repr
)
def test_one_outcome_for_a_whole_batch_is_the_general_paths_result(value: Any) -> None:
    """The batch fast path (one outcome for all, no dead-letter route) gives what the general
    path gives: judged with a dead-letter route the outcomes and delays are the same."""
    from queueflow.member.agent.outputs import Routes

    batch = records(4)
    fast = judge(Returned(value), batch, batch=True)
    general = judge(Returned(value), batch, batch=True, routes=Routes((), "dlq", "g"))
    assert fast.outcomes == general.outcomes and len(fast.outcomes) == 4
    assert fast.delays == general.delays and fast.failure is None and fast.outputs is None
    assert fast.records is batch and fast.batch is True


def test_a_result_is_frozen() -> None:
    result = judge(Returned(None), records(1), batch=False)
    with pytest.raises(AttributeError):
        result.failure = Failure.RAISED  # type: ignore[misc]


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"concurrency": 0}, r"share_agent concurrency=0; must be >= 1"),
        ({"handler_timeout_ms": 0}, r"share_agent handler_timeout_ms=0; must be >= 1"),
        ({"batch_size": 5}, r"share_agent batch_size=5 needs batch=True"),
        ({"batch": True, "batch_size": 0}, r"share_agent batch_size=0; must be >= 1"),
    ],
)
def test_options_are_checked_when_built(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ShareAgentOptions(**fields)


def test_the_lock_duration_is_checked_against_the_group_bounds() -> None:
    cluster = cluster_with(0)
    settings = cluster.member_context.settings
    ShareAgentOptions(lock_duration_ms=settings.max_record_lock_duration_ms).check_lock_duration(
        settings
    )
    too_long = ShareAgentOptions(lock_duration_ms=settings.max_record_lock_duration_ms + 1)
    with pytest.raises(ConfigurationError, match=r"lock_duration_ms=.* is out of range"):
        too_long.check_lock_duration(settings)


@pytest.mark.parametrize("declare", [queueflow.App.share_agent, ShareGroups.share_agent])
def test_share_agent_takes_exactly_the_options_fields(declare: Any) -> None:
    """``App.share_agent`` and ``ShareGroups.share_agent`` keep their keyword arguments (the
    documented API): they are the fields of ShareAgentOptions, with the same defaults."""
    parameters = inspect.signature(declare).parameters
    keywords = {
        name: p.default
        for name, p in parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "group"
    }
    fields = {f.name: f.default for f in dataclasses.fields(ShareAgentOptions)}
    assert keywords == fields


def test_an_agent_takes_options_or_their_fields() -> None:
    async def handler(record: ShareRecord) -> None:
        return None

    ctx = cluster_with(0).member_context
    by_fields = ShareAgent(ctx, handler, TOPIC, "g", concurrency=3, name="n")
    by_options = ShareAgent(ctx, handler, TOPIC, "g", ShareAgentOptions(concurrency=3, name="n"))
    assert by_fields.options == by_options.options
    assert (by_fields.concurrency, by_fields.name, by_fields.client_id) == (3, "n", "n")
    default = ShareAgent(ctx, handler, TOPIC, "g")
    assert default.name == f"{handler.__module__}.{handler.__qualname__}"
    with pytest.raises(TypeError):
        ShareAgent(ctx, handler, TOPIC, "g", concurency=3)


# -- lifecycles ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("initial", "table"),
    [
        (AgentState.CREATED, AGENT_TRANSITIONS),
        (HandlersHealth.WORKING, HEALTH_TRANSITIONS),
        (SessionState.CREATED, SESSION_TRANSITIONS),
        (MembershipState.CREATED, MEMBERSHIP_TRANSITIONS),
    ],
)
def test_every_transition_not_in_the_table_is_refused(initial: Any, table: Any) -> None:
    states = list(type(initial))
    assert set(table) == set(states)  # every state has a row
    for start in states:
        for to in states:
            lifecycle = Lifecycle("x", start, table)
            if to in table[start]:
                assert lifecycle.move(to) is start and lifecycle.state is to
            else:
                with pytest.raises(IllegalTransitionError, match=f"{start.name} -> {to.name}"):
                    lifecycle.move(to)
                assert lifecycle.state is start


def test_the_agent_lifecycle_in_order() -> None:
    lifecycle = Lifecycle("agent", AgentState.CREATED, AGENT_TRANSITIONS)
    for state in (AgentState.STARTING, AgentState.RUNNING, AgentState.STOPPING):
        lifecycle.move(state)
    lifecycle.move(AgentState.STOPPED)
    assert not lifecycle.can_move(AgentState.STARTING)  # an agent is not started twice


def test_an_agent_runs_then_stops_and_cannot_start_again() -> None:
    async def handler(record: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        async with cluster_with(1) as cluster:
            agent = ShareAgent(cluster.member_context, handler, TOPIC, "g")
            assert agent.state is AgentState.CREATED
            await agent.start()
            assert agent.state is AgentState.RUNNING
            await agent.stop()
            assert agent.state is AgentState.STOPPED
            await agent.stop()  # again: nothing
            with pytest.raises(IllegalTransitionError):
                await agent.start()

    run(scenario())


def test_an_agent_stopped_before_it_started_stops() -> None:
    async def handler(record: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        async with cluster_with(0) as cluster:
            agent = ShareAgent(cluster.member_context, handler, TOPIC, "g")
            await agent.stop()
            assert agent.state is AgentState.STOPPED

    run(scenario())


# -- one runner ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [False, True])
def test_the_acknowledgement_latency_is_observed_for_record_and_batch_handlers(
    batch: bool,
) -> None:
    """Every record's delivery-to-outcome latency goes to
    ``queueflow_acknowledgement_latency_seconds``; batch handlers' records were left out."""
    clock = FakeClock()

    async def record_handler(record: ShareRecord) -> None:
        return None

    async def batch_handler(batch_records: list[ShareRecord]) -> None:
        return None

    async def scenario() -> float | None:
        async with cluster_with(3, clock=clock) as cluster:
            handler: Any = batch_handler if batch else record_handler
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=2, batch=batch)
            await until(lambda: agent.stats.accepted == 3, "every record accepted", clock)
            await agent.stop()
            return cluster.metrics.registry.get_sample_value(
                "queueflow_acknowledgement_latency_seconds_count", {"group": "g", "topic": TOPIC}
            )

    assert run(scenario()) == 3


def test_a_session_and_its_membership_go_through_their_lifecycles() -> None:
    async def scenario() -> None:
        async with cluster_with(1) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            session = consumer._require_session()
            membership = session._membership
            assert session.state is SessionState.STARTED
            assert membership.state is MembershipState.JOINED
            await consumer.close()
            assert session.state is SessionState.CLOSED
            assert membership.state is MembershipState.CLOSED
            await session.close()  # again: the group is not left twice
            assert session.state is SessionState.CLOSED

    run(scenario())
