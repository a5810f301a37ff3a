"""``@share_agent``: a handler that processes records of a share group, one outcome per record.

A :class:`ShareAgent` joins the share group as a member, runs one fetch loop per assigned
share-partition and ``concurrency`` handler tasks, and acknowledges every record with the
handler's outcome (per record, or per batch with ``batch=True``: see below):

==============================  ==========================================================
handler does                    outcome
==============================  ==========================================================
returns ``None`` or ``ACCEPT``  ACCEPT: the record is Acknowledged
returns ``RELEASE``             RELEASE: delivered again (Archived at the delivery limit)
returns ``REJECT``              REJECT: Archived, never delivered again
raises                          RELEASE, with an error log line naming the record
returns ``Result(outcome, [..])``  that outcome; its results published with it (below)
yields results (async generator)  the outcome yielded (none: ACCEPT); results published
returns anything else           RELEASE, with an error log line saying what was returned
value can't be deserialized     REJECT, with an error log line
runs past its deadline          cancelled; RELEASE, with an error log line
==============================  ==========================================================

Results (``sink=``, ``dead_letter=``, :class:`~queueflow.member.agent.outputs.Send`,
:class:`~queueflow.member.agent.outputs.DeadLetter`) are tied to the outcome: a RELEASE publishes
nothing, an ACCEPT its results, a REJECT its dead letters only
(:mod:`~queueflow.member.agent.outputs`); at-least-once they are acknowledged by the brokers
before the outcome is recorded (:mod:`~queueflow.member.agent.publishing`), exactly-once they
commit with it in one transaction (:mod:`~queueflow.member.agent.transactions`).

"Raises" is any exception: also a ``CancelledError`` the handler raises itself (not the
agent's cancellation at a deadline or a stop), ``GeneratorExit`` or another ``BaseException``;
only ``KeyboardInterrupt`` and ``SystemExit`` stop the process. A return value whose ``repr()``
raises is named by its type. A record that can't be decoded at all (a header name that is not
UTF-8) is REJECTed by the session before it is queued. No record and no handler result ends a
handler task; one that ends anyway is logged and replaced.

A handler call's deadline is its record's acquisition lock deadline minus a margin (a tenth of
the lock duration, between two acknowledgement lingers and 1 s), or ``handler_timeout_ms``
after it started when that is sooner. A call still running then is cancelled and its record
RELEASEd while the lock still holds, so the leader can deliver it again at once. A record
whose lock ends within that margin when a handler is free is not started at all: it is RELEASEd
unhandled (log ``acquisition_lock_expired_before_handling``), because its outcome would reach
the leader after the lock elapsed and the record would be handled twice. When
``handler_timeout_ms`` is set and the group allows RENEW (``share.renew.acknowledge.enable``,
KIP-1222), the lock no longer bounds the call: a lock margin before it elapses the agent RENEWs
the call's records (log ``handler_locks_renewed``), as often as needed, and the call is
cancelled only at ``handler_timeout_ms`` (or at the lock, if a RENEW is refused). A handler that
ignores the cancellation (catches ``CancelledError``, or blocks the event loop) is *stuck*;
when every handler task is stuck, the member RELEASEs the records queued for them and acquires
nothing until one returns (log ``share_agent_handlers_stuck``, gauge
``queueflow_share_agent_stuck_handlers``), so nothing waits behind a hung handler.

Acknowledgements are batched per share-partition and ride along with that share-partition's next
ShareFetch; one batch is applied atomically by the leader (all through its
:class:`~queueflow.member.session.ShareFetchSession`). Faust's own offset tracking is not used at
all (see https://github.com/faust-streaming/faust/issues/606). The host
(:mod:`queueflow.faust_app`) starts and stops the agent with the worker.

Batch handlers (``batch=True``): ``async def handler(records: list[ShareRecord])`` is called
with the records of one ShareFetch (at most ``batch_size`` of them when set; a larger ShareFetch
is split into several calls) and returns one outcome per record, in order, or one outcome for
the whole batch. Every record then gets exactly the outcome the per-record path would give it:

=================================================  ===============================================
handler does                                       outcome of each record of the batch
=================================================  ===============================================
returns a sequence of ``len(records)`` outcomes    that record's outcome (``None`` means ACCEPT)
returns one outcome (or ``None``)                  that outcome
raises                                             RELEASE, as a raising per-record handler; one
                                                   error log line for the batch
returns anything else (wrong length or type)       RELEASE, as an invalid per-record outcome; one
                                                   error log line naming the agent, what was
                                                   returned and what was expected
=================================================  ===============================================

Records that can't be decoded are REJECTed before the call and left out of ``records``, and
records whose acquisition lock expired (or ends within the margin) while queued are released
unhandled, both exactly as on the per-record path (the handler is not called when none is
left).

The package, by concern:

* :mod:`~queueflow.member.agent.core`: :class:`ShareAgent`, its lifecycle
  (:class:`~queueflow.member.lifecycle.AgentState`: start, drain, stop);
* :mod:`~queueflow.member.agent.options`: :class:`ShareAgentOptions` and the handler types;
* :mod:`~queueflow.member.agent.dispatch`: fetch loops, reservations, acknowledgement sends;
* :mod:`~queueflow.member.agent.runner`: the one runner of record and batch handlers;
* :mod:`~queueflow.member.agent.results`: what a call yields (:class:`HandlerResult`, pure);
* :mod:`~queueflow.member.agent.outputs`: results and dead letters, the rules (pure);
* :mod:`~queueflow.member.agent.publishing`: at-least-once publishing, encoders;
* :mod:`~queueflow.member.agent.transactions`: the exactly_once commit path;
* :mod:`~queueflow.member.agent.failures`: the log line of a failed call;
* :mod:`~queueflow.member.agent.deadlines`: call deadlines, lock renewal, stuck handlers.
"""

from queueflow.member.agent.core import STOP_TASKS_TIMEOUT_S, ShareAgent
from queueflow.member.agent.deadlines import HANDLER_WATCH_INTERVAL_S
from queueflow.member.agent.dispatch import FETCHES_IN_FLIGHT
from queueflow.member.agent.options import (
    BatchHandler,
    Decoder,
    Handler,
    RecordHandler,
    ShareAgentOptions,
)
from queueflow.member.agent.outputs import (
    COPY_OF_RECORD,
    USE_RECORD_KEY,
    DeadLetter,
    Result,
    Send,
)
from queueflow.member.agent.results import (
    AgentStats,
    CallEnd,
    Failure,
    HandlerResult,
    Raised,
    Returned,
    TimedOut,
    batch_outcomes,
    judge,
    outcome_of,
)
from queueflow.member.lifecycle import AgentState, HandlersHealth

__all__ = [
    "COPY_OF_RECORD",
    "FETCHES_IN_FLIGHT",
    "HANDLER_WATCH_INTERVAL_S",
    "STOP_TASKS_TIMEOUT_S",
    "USE_RECORD_KEY",
    "AgentState",
    "AgentStats",
    "BatchHandler",
    "CallEnd",
    "DeadLetter",
    "Decoder",
    "Failure",
    "Handler",
    "HandlerResult",
    "HandlersHealth",
    "Raised",
    "RecordHandler",
    "Result",
    "Returned",
    "Send",
    "ShareAgent",
    "ShareAgentOptions",
    "TimedOut",
    "batch_outcomes",
    "judge",
    "outcome_of",
]
