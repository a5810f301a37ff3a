"""A share agent's records that no handler finished: given back, or retried alone.

* :func:`release_expiring`: records still queued for a handler whose locks are about to end,
  or that the handlers at their measured rate would not start before then, are RELEASEd with
  their delivery given back (``undelivered``: they never reached a handler), before the lock
  runs out in the queue and counts as a delivery (docs/concepts.md "Delivery counts" and
  "Adaptive acquisition").
* :func:`retry_alone`: after a batch handler raised, each of its records is handled alone, so
  one poison record doesn't take its neighbours towards the delivery count limit
  (docs/concepts.md "Throttled delivery").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queueflow.member.agent.results import Failure, HandlerResult, Raised, safe_repr
from queueflow.member.agent.units import unit_lock_deadline
from queueflow.structs import AcknowledgeType, ShareRecord

if TYPE_CHECKING:
    from queueflow.member.agent.deadlines import HandlerCall
    from queueflow.member.agent.runner import HandlerRunner

__all__ = ["give_back_unstarted", "release_expiring", "retry_alone"]

_RELEASE = AcknowledgeType.RELEASE


def release_expiring(runner: HandlerRunner, now: float, window_s: float) -> int:
    """Give back ``runner``'s queued records that no handler will start in time, as RELEASE
    ``undelivered`` (they never reached a handler: docs/concepts.md "Delivery counts").

    * a unit whose lock ends within ``window_s`` of ``now`` (monotonic s) is released as
      expired (:meth:`HandlerRunner.lock_expired_unhandled`, counted in
      ``queueflow_records_lock_expired_unhandled_total``);
    * a unit that, at the measured handling rate (:meth:`FlowControl.start_delay_s` with the
      records queued before it), would start less than ``window_s`` before its lock ends is
      given back now, while its lock still has time for another member
      (:func:`give_back_unstarted`), so the handlers slowing down after a large acquisition
      doesn't leave records to expire in the queue.

    Returns how many records were released."""
    queue = runner._queue
    per_record_s = runner.agent.flow.start_delay_s(0)  # one record's share of the rate
    expired: list[list[ShareRecord]] = []
    late: list[list[ShareRecord]] = []
    keep: list[list[ShareRecord]] = []
    ahead = 0
    for unit in queue:
        first = unit_lock_deadline(unit)
        if first <= now + window_s:
            expired.append(unit)
        elif now + (ahead + 1) * per_record_s >= first - window_s:
            late.append(unit)
        else:
            keep.append(unit)
            ahead += len(unit)
    if not expired and not late:
        return 0
    queue.clear()
    queue.extend(keep)
    released = 0
    for unit in expired:
        runner.queued -= len(unit)
        for record in unit:
            runner.lock_expired_unhandled(record)
        released += len(unit)
    by_partition: dict[int, list[ShareRecord]] = {}
    for unit in late:
        for record in unit:
            by_partition.setdefault(record.partition, []).append(record)
    for records in by_partition.values():  # one log line per share-partition
        released += give_back_unstarted(runner, records, ahead)
    return released


def give_back_unstarted(runner: HandlerRunner, records: list[ShareRecord], ahead: int) -> int:
    """RELEASE ``records`` (of one share-partition, taken out of the queue) ``undelivered``
    before their locks expire: at the measured rate the handlers would not start them in time,
    with ``ahead`` records still queued before them. Counted in
    ``queueflow_records_given_back_unstarted_total`` and logged once
    (``unstarted_records_given_back``); returns how many."""
    agent = runner.agent
    runner.queued -= len(records)
    for record in records:
        runner.acknowledge(record, _RELEASE, undelivered=True)
    agent.dispatch.unreserve(len(records))
    agent.stats.given_back += len(records)
    agent.ctx.metrics.given_back_unstarted.labels(agent.group, agent.topic_name).inc(len(records))
    agent.log.info(
        "unstarted_records_given_back",
        queued=ahead,
        rate=round(agent.flow.rate, 1),
        lock_s=agent.flow.lock_s,
        note="the handlers would not start these before their locks end; released "
        "undelivered so that another member takes them in time",
        **runner.where_batch(records),
    )
    return len(records)


async def retry_alone(runner: HandlerRunner, result: HandlerResult, call: HandlerCall) -> None:
    """A batch handler raised on ``result.records``: count and log it
    (``batch_handler_raised_retrying_alone``), then call the handler on each record alone (a
    batch of one, judged as usual). A record whose lock ends within the lock margin, or any
    left when the agent stops, is RELEASEd instead (it was handed to the batch call)."""
    agent, records = runner.agent, result.records
    agent.ctx.metrics.handler_errors.labels(
        agent.group, records[0].topic, Failure.RAISED.value
    ).inc(len(records))
    agent.stats.handler_errors += len(records)
    error = result.ended.error if isinstance(result.ended, Raised) else None
    agent.log.warning(
        "batch_handler_raised_retrying_alone",
        error=safe_repr(error),
        note="each record is handled alone so that one poison record fails alone",
        **runner.where_batch(records),
    )
    clock, deadlines = agent.ctx.clock, agent.deadlines
    for record in records:
        if agent.stopping or deadlines.too_late(record, clock.monotonic()):
            runner.acknowledge(record, _RELEASE)
            runner.counted(_RELEASE)
            agent.dispatch.unreserve(1)
            continue
        await runner.run([record], call)
