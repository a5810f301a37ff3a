"""No handler result can stop a share agent: a handler raising ``CancelledError`` (not the
agent's), ``GeneratorExit`` or another ``BaseException``, or returning an object whose
``repr()`` raises, costs its record(s) only, logged; the handler tasks survive, and one that
dies anyway is restarted (in-process cluster, record and batch handlers)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from inprocess_helpers import TOPIC, cluster_with, events, run, until
from structlog.testing import capture_logs

import queueflow
from queueflow.member.agent.results import Raised, Returned, judge, safe_len, safe_repr
from queueflow.structs import AcknowledgeType, ShareRecord
from queueflow.testing import FakeClock

RECORDS = 40
BAD = {3, 7, 11, 15, 19, 23}  # more bad records than handler tasks


class BadRepr:
    """A return value whose repr() raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


class BadLen(list[Any]):
    """A sequence whose len() raises."""

    def __len__(self) -> int:
        raise RuntimeError("no len for you")


class Custom(BaseException):
    """A BaseException subclass short of process exit."""


def misbehaves(kind: str) -> Any:
    if kind == "cancelled":
        raise asyncio.CancelledError()
    if kind == "generator_exit":
        raise GeneratorExit()
    if kind == "base":
        raise Custom("custom")
    return BadRepr()


@pytest.mark.parametrize("kind", ["cancelled", "generator_exit", "base", "bad_repr"])
def test_a_misbehaving_record_handler_costs_its_records_only(kind: str) -> None:
    clock = FakeClock()
    handled: set[int] = set()
    bad_calls: list[int] = []

    async def handler(record: ShareRecord) -> object:
        if record.offset in BAD and record.delivery_count == 1:
            bad_calls.append(record.offset)
            return misbehaves(kind)
        handled.add(record.offset)
        return None

    async def scenario() -> None:
        async with cluster_with(RECORDS, clock=clock) as cluster:
            with capture_logs() as logs:
                agent = await cluster.agent(handler, TOPIC, "g", concurrency=2)
                await until(lambda: len(handled) == RECORDS, "every record handled", clock)
                view = cluster.share_partition("g", TOPIC, 0)
                await until(lambda: int(view.start_offset) == RECORDS, "all ACCEPTed", clock)
                assert sorted(bad_calls) == sorted(BAD)
                assert agent.stats.handler_errors == len(BAD)
            name = (
                "handler_returned_invalid_outcome_record_released"
                if kind == "bad_repr"
                else "handler_raised_record_released"
            )
            lines = events(logs, name)
            assert {line["offset"] for line in lines} == BAD
            if kind == "bad_repr":
                assert "repr() raised RuntimeError" in lines[0]["returned"]
            assert not events(logs, "share_agent_handler_task_restarted")

    run(scenario())


@pytest.mark.parametrize("kind", ["cancelled", "base", "bad_repr"])
def test_a_misbehaving_batch_handler_costs_its_batch_only(kind: str) -> None:
    clock = FakeClock()
    handled: set[int] = set()
    calls = 0

    async def handler(records: list[ShareRecord]) -> object:
        nonlocal calls
        calls += 1
        if calls <= 4:
            return misbehaves(kind)
        handled.update(r.offset for r in records)
        return None

    async def scenario() -> None:
        async with cluster_with(RECORDS, clock=clock) as cluster:
            agent = await cluster.agent(
                handler, TOPIC, "g", concurrency=2, batch=True, batch_size=5
            )
            await until(lambda: len(handled) == RECORDS, "every record handled", clock)
            assert agent.stats.handler_errors >= 4

    run(scenario())


def test_a_handler_task_that_dies_is_logged_and_restarted(monkeypatch: Any) -> None:
    clock = FakeClock()
    handled: set[int] = set()

    async def handler(record: ShareRecord) -> object:
        handled.add(record.offset)
        return None

    async def scenario() -> None:
        async with cluster_with(RECORDS, clock=clock) as cluster:
            with capture_logs() as logs:
                agent = await cluster.agent(handler, TOPIC, "g", concurrency=2)
                original = agent.runner.admit
                broken = {"left": 3}

                def admit(unit: list[ShareRecord], margin_s: float | None = None) -> Any:
                    if broken["left"]:
                        broken["left"] -= 1
                        for record in unit:  # its records go back (the test's doing)
                            agent.runner.acknowledge(record, AcknowledgeType.RELEASE)
                        agent.dispatch.unreserve(len(unit))
                        raise RuntimeError("a bug in admit")
                    return original(unit, margin_s)

                monkeypatch.setattr(agent.runner, "admit", admit)
                await until(lambda: len(handled) == RECORDS, "every record handled", clock)
            restarted = events(logs, "share_agent_handler_task_restarted")
            assert len(restarted) == 3
            assert "a bug in admit" in restarted[0]["error"]

    run(scenario())


def test_judge_never_raises_on_a_hostile_return_value() -> None:
    record = ShareRecord(TOPIC, 0, 1, None, b"v", [], 0, 1)
    result = judge(Returned(BadLen([None])), [record], True)
    assert result.outcomes == (AcknowledgeType.RELEASE,)
    result = judge(Raised(asyncio.CancelledError()), [record], False)
    assert result.outcomes == (AcknowledgeType.RELEASE,)
    assert "repr() raised" in safe_repr(BadRepr())
    assert safe_len(BadLen([1])) is None
    assert safe_repr(queueflow.ACCEPT) == repr(queueflow.ACCEPT)
