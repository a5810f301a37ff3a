"""One lock deadline per ShareFetch: the records of a fetch get their lock deadline and
delivery time as the parser builds them, and a batch unit
(:class:`~queueflow.member.agent.units.FetchUnit`) carries the deadline once, so admission,
the handler call's deadline and the give-back of queued records read it once per unit, not
once per record; records whose lock would expire are still released as before."""

from __future__ import annotations

import collections
import math
from types import SimpleNamespace
from typing import Any

from test_batch_first import build

from queueflow.member.agent.deadlines import Deadlines, HandlerCall
from queueflow.member.agent.giveback import release_expiring
from queueflow.member.agent.runner import HandlerRunner
from queueflow.member.agent.units import FetchUnit, unit_lock_deadline
from queueflow.member.flow import FlowControl
from queueflow.member.reader import carried_records, records_from_batches
from queueflow.metrics import Metrics
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition
from queueflow.testing import FakeClock


class CountingRecord(ShareRecord):
    """A ShareRecord that counts the reads of its ``lock_deadline``."""

    reads = 0

    @property  # type: ignore[override]
    def lock_deadline(self) -> float:
        CountingRecord.reads += 1
        return ShareRecord.lock_deadline.__get__(self)  # type: ignore[attr-defined,no-any-return]

    @lock_deadline.setter
    def lock_deadline(self, value: float) -> None:
        ShareRecord.lock_deadline.__set__(self, value)  # type: ignore[attr-defined]


def counting(n: int, deadline: float) -> list[ShareRecord]:
    records: list[ShareRecord] = [
        CountingRecord("t", 0, i, None, b"v", (), 0, 1, lock_deadline=deadline) for i in range(n)
    ]
    CountingRecord.reads = 0
    return records


def runner_for(clock: FakeClock) -> tuple[Any, list[int]]:
    expired: list[int] = []
    runner = SimpleNamespace(
        agent=SimpleNamespace(ctx=SimpleNamespace(clock=clock), decode=None),
        lock_expired_unhandled=lambda r: expired.append(r.offset),
    )
    return runner, expired


def test_the_parser_sets_the_fetch_deadline_and_delivery_time_on_every_record() -> None:
    data = build([(None, b"v%d" % i, []) for i in range(5)], 100)
    records, gaps, bad = records_from_batches(
        data, "t", 0, [(100, 104, 2)], lock_deadline=31.5, delivered_at=1.25
    )
    assert [r.offset for r in records] == list(range(100, 105)) and not gaps and not bad
    assert {(r.lock_deadline, r.delivered_at) for r in records} == {(31.5, 1.25)}
    (carried, _, _), rest = carried_records(
        data, "t", 0, [(100, 104, 1)], 105, lock_deadline=7.0, delivered_at=2.0
    )
    assert not rest and {(r.lock_deadline, r.delivered_at) for r in carried} == {(7.0, 2.0)}
    plain, _, _ = records_from_batches(data, "t", 0, [(100, 104, 1)])
    assert {(r.lock_deadline, r.delivered_at) for r in plain} == {(math.inf, 0.0)}


def test_a_fetch_unit_is_admitted_and_armed_without_reading_each_record() -> None:
    clock = FakeClock()
    runner, expired = runner_for(clock)
    unit = FetchUnit(counting(500, 30.0), 30.0)
    assert HandlerRunner.admit(runner, unit, 1.0) is unit
    deadlines = SimpleNamespace(
        agent=SimpleNamespace(
            ctx=SimpleNamespace(clock=clock, settings=SimpleNamespace()),
            handler_timeout_ms=None,
        ),
        lock_margin_s=lambda: 1.0,
    )
    call = HandlerCall()
    Deadlines.arm(deadlines, call, unit, 1.0, unit_lock_deadline(unit))  # type: ignore[arg-type]
    assert call.deadline == 29.0
    assert CountingRecord.reads == 0 and not expired


def test_a_unit_whose_lock_ends_within_the_margin_is_released_record_by_record() -> None:
    clock = FakeClock()
    runner, expired = runner_for(clock)
    clock.advance(29_500)  # 0.5 s before the locks end, inside the 1 s margin
    unit = FetchUnit(counting(5, 30.0), 30.0)
    assert HandlerRunner.admit(runner, unit, 1.0) == []
    assert expired == [0, 1, 2, 3, 4]


def test_a_unit_built_without_a_deadline_takes_its_records_earliest() -> None:
    records = counting(3, 50.0)
    records[1].lock_deadline = 20.0
    unit = FetchUnit(records)
    assert unit.lock_deadline == 20.0 and unit_lock_deadline(unit) == 20.0
    assert unit_lock_deadline(list(records)) == 20.0  # any sequence: its minimum
    assert unit_lock_deadline(records[:1]) == 50.0  # a lone record: its own
    assert type(unit.copy()) is list  # what a batch handler is given stays a plain list


def test_queued_fetch_units_are_given_back_by_their_one_deadline() -> None:
    flow = FlowControl(concurrency=1, max_poll_records=500, lock_s=10.0)
    released: list[int] = []
    runner = SimpleNamespace(
        agent=SimpleNamespace(flow=flow),
        _queue=collections.deque([FetchUnit(counting(200, 0.5), 0.5)]),
        queued=200,
        lock_expired_unhandled=lambda r: released.append(r.offset),
    )
    assert release_expiring(runner, now=0.0, window_s=1.0) == 200  # type: ignore[arg-type]
    assert released == list(range(200)) and runner.queued == 0 and not runner._queue
    assert CountingRecord.reads == 0  # the unit's deadline, not its records'
    keep = SimpleNamespace(
        agent=SimpleNamespace(flow=flow, ctx=SimpleNamespace(metrics=Metrics())),
        _queue=collections.deque([FetchUnit(counting(200, 50.0), 50.0)]),
        queued=200,
    )
    assert release_expiring(keep, now=0.0, window_s=1.0) == 0  # type: ignore[arg-type]
    assert CountingRecord.reads == 0 and len(keep._queue[0]) == 200


class _Latency:
    def __init__(self) -> None:
        self.seen: list[tuple[float, int]] = []

    def observe(self, value: float, n: int = 1) -> None:
        self.seen.append((value, n))


def accepted(records: list[ShareRecord]) -> tuple[list[Any], list[tuple[float, int]]]:
    """The acknowledge_range calls and latency observations of accept_all on ``records``."""
    from queueflow.member.agent.accepts import accept_all

    ranges: list[Any] = []
    clock = FakeClock()
    clock.advance(5_000)
    runner: Any = SimpleNamespace(
        agent=SimpleNamespace(
            stats=SimpleNamespace(accepted=0),
            session=SimpleNamespace(acknowledge_range=lambda *a: ranges.append(a)),
            ctx=SimpleNamespace(clock=clock),
        ),
        ack_counts=collections.Counter(),
        ack_latency=_Latency(),
    )
    accept_all(runner, records)
    assert runner.agent.stats.accepted == len(records)
    return ranges, runner.ack_latency.seen


def test_a_whole_fetch_unit_without_a_hole_is_accepted_as_one_range_in_one_step() -> None:
    records = counting(300, 30.0)
    for r in records:
        r.delivered_at = 1.0
    unit = FetchUnit(records, 30.0)
    fast = accepted(unit)
    assert fast == accepted(list(records))  # what the step-by-step runs give
    assert fast == ([(TopicPartition("t", 0), 0, 299, AcknowledgeType.ACCEPT)], [(4.0, 300)])
    holed = FetchUnit(records[:100] + records[101:], 30.0)  # a gap: two runs
    ranges, _ = accepted(holed)
    assert [(r[1], r[2]) for r in ranges] == [(0, 99), (101, 299)]
    records[-1].delivered_at = 2.0  # read apart (the rest of a carried answer): two times
    assert accepted(FetchUnit(records, 30.0))[1] == [(4.0, 299), (3.0, 1)]
