"""``release_expiring`` (queueflow/member/agent/giveback.py): queued records whose lock is about
to end count as expired in the queue; those that, at the measured rate, would start too late are
given back early, undelivered; the rest stay queued in order."""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any

from queueflow.member.agent.giveback import release_expiring
from queueflow.member.flow import FlowControl
from queueflow.metrics import Metrics
from queueflow.structs import AcknowledgeType


class _Runner:
    def __init__(self, deadlines: list[float], rate: float) -> None:
        flow = FlowControl(concurrency=1, max_poll_records=500, lock_s=10.0)
        flow.handler_s = 1 / rate
        self.unreserved = 0
        self.acks: list[tuple[int, AcknowledgeType, bool]] = []
        self.expired: list[int] = []
        self.agent = SimpleNamespace(
            flow=flow,
            group="g",
            topic_name="t",
            ctx=SimpleNamespace(metrics=Metrics()),
            stats=SimpleNamespace(given_back=0),
            dispatch=SimpleNamespace(unreserve=self._unreserve),
            log=SimpleNamespace(info=lambda *a, **k: None),
        )
        records = [
            SimpleNamespace(topic="t", partition=0, offset=i, lock_deadline=d, delivery_count=1)
            for i, d in enumerate(deadlines)
        ]
        self._queue = collections.deque([r] for r in records)
        self.queued = len(records)

    def _unreserve(self, count: int) -> None:
        self.unreserved += count

    def lock_expired_unhandled(self, record: Any) -> None:
        self.expired.append(record.offset)

    def acknowledge(self, record: Any, kind: AcknowledgeType, *, undelivered: bool) -> None:
        self.acks.append((record.offset, kind, undelivered))

    def where_batch(self, records: list[Any]) -> dict[str, Any]:
        return {"records": len(records)}


def test_expiring_records_count_as_expired_and_late_ones_are_given_back_early() -> None:
    # 2 records/s; locks end at 10 s. Window 1 s: start must come before 9 s.
    runner = _Runner([0.5] + [10.0] * 30, rate=2.0)
    released = release_expiring(runner, now=0.0, window_s=1.0)  # type: ignore[arg-type]
    assert runner.expired == [0]  # its lock ends within the window
    kept = [unit[0].offset for unit in runner._queue]
    assert kept == list(range(1, 18))  # 17 records start by 9 s at 2/s: (16 + 1) / 2 = 8.5 s
    assert [a[0] for a in runner.acks] == list(range(18, 31))
    assert all(
        kind is AcknowledgeType.RELEASE and undelivered for _, kind, undelivered in runner.acks
    )
    assert released == 1 + 13 and runner.queued == 17
    assert runner.agent.stats.given_back == 13 and runner.unreserved == 13


def test_nothing_moves_when_every_record_starts_in_time() -> None:
    runner = _Runner([10.0] * 5, rate=2.0)
    assert release_expiring(runner, now=0.0, window_s=1.0) == 0  # type: ignore[arg-type]
    assert len(runner._queue) == 5 and not runner.acks and not runner.expired
