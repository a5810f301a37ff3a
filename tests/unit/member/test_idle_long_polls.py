"""An idle share-partition's long polls wait longer and longer (fewer idle round trips), and
records bring the wait back to ``fetch.max.wait.ms``."""

from __future__ import annotations

from types import SimpleNamespace

from queueflow.member.agent.dispatch import IDLE_LONG_POLL_MAX_MS, Dispatcher
from queueflow.metrics import Metrics
from queueflow.structs import TopicPartition
from tests.unit.inprocess_helpers import settings


def _dispatcher() -> Dispatcher:
    ctx = SimpleNamespace(metrics=Metrics(), settings=settings(fetch_max_wait_ms=500))
    agent = SimpleNamespace(ctx=ctx, group="g", topic_name="t")
    return Dispatcher(agent)  # type: ignore[arg-type]


def test_empty_long_polls_double_the_wait_up_to_the_cap_and_records_reset_it() -> None:
    dispatch, tp = _dispatcher(), TopicPartition("t", 0)
    waits = []
    for _ in range(8):
        dispatch._long_polled[tp] = True  # the leader held it and answered empty
        dispatch._next_wait(tp, 0)
        waits.append(dispatch._idle_wait_ms[tp])
    assert waits == [1000, 2000, 4000, 8000, 8000, 8000, 8000, 8000]
    assert max(waits) == IDLE_LONG_POLL_MAX_MS
    dispatch._next_wait(tp, 3)  # records: back to fetch.max.wait.ms (None: the setting)
    assert tp not in dispatch._idle_wait_ms


def test_an_empty_answer_that_was_not_a_long_poll_keeps_the_wait() -> None:
    dispatch, tp = _dispatcher(), TopicPartition("t", 0)
    dispatch._long_polled[tp] = False  # answered at once (a busy fetch, the request topic)
    dispatch._next_wait(tp, 0)
    assert tp not in dispatch._idle_wait_ms
