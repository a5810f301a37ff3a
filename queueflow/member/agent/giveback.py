"""A share agent's records that no handler finished: given back, or retried alone.

* :func:`release_expiring`: records still queued for a handler whose locks are about to end
  are RELEASEd with their delivery given back (``undelivered``: they never reached a handler),
  before the lock runs out in the queue and counts as a delivery (docs/concepts.md "Delivery
  counts").
* :func:`retry_alone`: after a batch handler raised, each of its records is handled alone, so
  one poison record doesn't take its neighbours towards the delivery count limit
  (docs/concepts.md "Throttled delivery").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queueflow.member.agent.results import Failure, HandlerResult, Raised, safe_repr
from queueflow.structs import AcknowledgeType

if TYPE_CHECKING:
    from queueflow.member.agent.deadlines import HandlerCall
    from queueflow.member.agent.runner import HandlerRunner

__all__ = ["release_expiring", "retry_alone"]

_RELEASE = AcknowledgeType.RELEASE


def release_expiring(runner: HandlerRunner, now: float, window_s: float) -> int:
    """Give back ``runner``'s queued records whose lock ends within ``window_s`` of ``now``
    (monotonic s), as RELEASE ``undelivered`` (:meth:`HandlerRunner.lock_expired_unhandled`).
    Looks from the head of the queue (the oldest fetches) up to the first unit with time
    left; returns how many."""
    queue, limit, released = runner._queue, now + window_s, 0
    while queue and min(record.lock_deadline for record in queue[0]) <= limit:
        unit = queue.popleft()
        runner.queued -= len(unit)
        for record in unit:
            runner.lock_expired_unhandled(record)
        released += len(unit)
    return released


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
