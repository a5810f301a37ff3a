"""The log line of a handler call whose records were all RELEASEd (:func:`log_failure`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from queueflow.member.agent.results import (
    Failure,
    HandlerResult,
    Raised,
    Returned,
    TimedOut,
    safe_len,
    safe_repr,
)

if TYPE_CHECKING:
    from queueflow.member.agent.core import ShareAgent

__all__ = ["log_failure"]


def log_failure(agent: ShareAgent, result: HandlerResult) -> None:
    """Log one error for ``result``, a call whose records are all RELEASEd (``result.failure``
    set): what was raised or returned, and what was expected."""
    records, ended, count = result.records, result.ended, len(result.records)
    where, where_batch = agent.runner.where, agent.runner.where_batch
    if result.failure is Failure.INVALID_RESULT:
        agent.log.error(
            "handler_results_invalid_records_released",
            error=result.detail,
            returned_type=type(result.ended.value).__name__
            if isinstance(result.ended, Returned)
            else None,
            note='nothing published; see docs/guide.md "Producing results"',
            **(where(records[0]) if count == 1 else where_batch(records)),
        )
        return
    match ended:
        case TimedOut():
            agent.log.error(
                "handler_timed_out_records_released",
                records=count,
                handler_timeout_ms=agent.handler_timeout_ms,
                note="cancelled before the acquisition lock expired; raise "
                "handler_timeout_ms or group.share.record.lock.duration.ms if the handler "
                "needs longer",
                **(where(records[0]) if count == 1 else where_batch(records)),
            )
        case Raised(error=error) if result.batch:
            agent.log.error(
                "handler_raised_batch_released",
                error=safe_repr(error),
                exc_info=error,
                **where_batch(records),
            )
        case Raised(error=error):
            agent.log.error(
                "handler_raised_record_released",
                error=safe_repr(error),
                exc_info=error,
                **where(records[0]),
            )
        case Returned(value=value) if result.batch:
            agent.log.error(
                "batch_handler_returned_invalid_outcome_records_released",
                returned=safe_repr(value),
                returned_type=type(value).__name__,
                returned_length=safe_len(value),
                expected=f"a sequence of {count} outcomes (one per record, in order: "
                "queueflow.ACCEPT, queueflow.RELEASE, queueflow.REJECT, None or a "
                "queueflow.Result), or one outcome for the whole batch",
                **where_batch(records),
            )
        case Returned(value=value):
            agent.log.error(
                "handler_returned_invalid_outcome_record_released",
                returned=safe_repr(value),
                expected="queueflow.ACCEPT, queueflow.RELEASE, queueflow.REJECT, None or a "
                "queueflow.Result",
                **where(records[0]),
            )
