"""A share agent's lock-deadline checks on a queued batch unit, per record vs per unit.

One repeat takes :attr:`Sizes.read_batches` units of 500 records (one ShareFetch each) through
what the handler runner does to a batch unit before and around the handler call: admission
(:meth:`~queueflow.member.agent.runner.HandlerRunner.admit`, no decoder), the call's deadline
(:meth:`~queueflow.member.agent.deadlines.Deadlines.arm`) and the watchdog's give-back check of
the queue (:func:`~queueflow.member.agent.giveback.release_expiring`, nothing due).

* ``units.fetch``: the units are :class:`~queueflow.member.agent.units.FetchUnit` objects
  carrying the fetch's one lock deadline: each check reads it once per unit;
* ``units.list``: the same records as plain lists: each check reads every record's
  ``lock_deadline`` (what every unit cost before ``FetchUnit``);
* ``units.judge``: :func:`~queueflow.member.agent.results.judge` and
  :func:`~queueflow.member.agent.accepts.plain_accepts` of a batch handler call that returned
  ``None`` (all ACCEPT) on each unit: the step between the handler and the acknowledgement
  ranges;
* ``units.accept.fetch`` / ``units.accept.list``: :func:`~queueflow.member.agent.accepts.accept_all`
  of each unit (its offset ranges and acknowledgement latency, into a session stub): a
  ``FetchUnit`` without a hole in one step, plain lists run by run.

µs per record. No handler call, no acknowledgement.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from bench.micro.timing import Result, Sizes, sample, summarize
from queueflow.member.agent.accepts import accept_all, plain_accepts
from queueflow.member.agent.deadlines import Deadlines, HandlerCall
from queueflow.member.agent.giveback import release_expiring
from queueflow.member.agent.results import Returned, judge
from queueflow.member.agent.runner import HandlerRunner
from queueflow.member.agent.units import FetchUnit, unit_lock_deadline
from queueflow.member.flow import FlowControl
from queueflow.structs import AcknowledgeType, ShareRecord

__all__ = ["BENCHMARKS"]

#: Records per unit (one ShareFetch of max_poll_records).
UNIT = 500
_ACCEPT = AcknowledgeType.ACCEPT
#: The units' lock deadline, far ahead of the clock (monotonic s): nothing is due.
DEADLINE = 1_000.0


class _Clock:
    def monotonic(self) -> float:
        return 0.0


def _units(count: int, fetch_units: bool) -> list[list[ShareRecord]]:
    out: list[list[ShareRecord]] = []
    for u in range(count):
        records = [
            ShareRecord("jobs", 0, u * UNIT + i, None, b"v", (), 0, 1, lock_deadline=DEADLINE)
            for i in range(UNIT)
        ]
        out.append(FetchUnit(records, DEADLINE) if fetch_units else records)
    return out


def _checks(units: list[list[ShareRecord]]) -> Callable[[], None]:
    clock = _Clock()
    flow = FlowControl(concurrency=1, max_poll_records=UNIT, lock_s=30.0)
    flow.handler_s = 1e-6  # fast handlers: no unit is given back
    agent = SimpleNamespace(
        ctx=SimpleNamespace(clock=clock, settings=SimpleNamespace()),
        decode=None,
        handler_timeout_ms=None,
        flow=flow,
    )
    runner: Any = SimpleNamespace(agent=agent, _queue=collections.deque(units), queued=0)
    deadlines: Any = SimpleNamespace(agent=agent, lock_margin_s=lambda: 1.0)
    call = HandlerCall()

    def run() -> None:
        release_expiring(runner, 0.0, 2.0)  # the watchdog's check of the queue: nothing due
        for unit in units:
            admitted = HandlerRunner.admit(runner, unit, 1.0)
            first = admitted[0].lock_deadline if len(admitted) == 1 else None
            Deadlines.arm(deadlines, call, admitted, 1.0, first or unit_lock_deadline(admitted))

    return run


def bench_units(sizes: Sizes) -> list[Result]:
    out = []
    count = sizes.read_batches
    n = count * UNIT
    for fetch_units, name, what in (
        (True, "units.fetch", "FetchUnit: one lock deadline per unit"),
        (False, "units.list", "plain lists: every record's lock deadline read"),
    ):
        run = _checks(_units(count, fetch_units))
        samples = sample(run, units=n, repeats=sizes.repeats)
        out.append(summarize(name, "record", n, samples, f"admit + arm + give-back check; {what}"))
    units = _units(count, True)
    ended = Returned(None)

    def judged() -> None:
        for unit in units:
            if not plain_accepts(judge(ended, unit, True)):
                raise AssertionError("a batch returning None is not all ACCEPT")

    samples = sample(judged, units=n, repeats=sizes.repeats)
    what = "judge + plain_accepts of a batch handler call that returned None (all ACCEPT)"
    out.append(summarize("units.judge", "record", n, samples, what))
    for fetch_units, name in ((True, "units.accept.fetch"), (False, "units.accept.list")):
        out.append(_accepts(sizes, _units(count, fetch_units), name))
    return out


def _accepts(sizes: Sizes, units: list[list[ShareRecord]], name: str) -> Result:
    """``accept_all`` of every unit (delivered at one time) into a session stub."""
    for unit in units:
        for record in unit:
            record.delivered_at = 1.0
    agent = SimpleNamespace(
        stats=SimpleNamespace(accepted=0),
        session=SimpleNamespace(acknowledge_range=lambda *args: None),
        ctx=SimpleNamespace(clock=_Clock()),
    )
    latency = SimpleNamespace(observe=lambda value, n=1: None)
    runner: Any = SimpleNamespace(agent=agent, ack_counts={_ACCEPT: 0}, ack_latency=latency)

    def run() -> None:
        for unit in units:
            accept_all(runner, unit)

    n = len(units) * UNIT
    samples = sample(run, units=n, repeats=sizes.repeats)
    kind = "FetchUnit" if type(units[0]) is FetchUnit else "plain lists"
    return summarize(name, "record", n, samples, f"accept_all of all-ACCEPT units ({kind})")


#: Name prefix -> the function that runs those benchmarks.
BENCHMARKS: dict[str, Callable[[Sizes], list[Result]]] = {"units": bench_units}
