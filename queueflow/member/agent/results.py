"""What a handler call yields: a :class:`HandlerResult`, worked out without I/O.

The runner (:mod:`queueflow.member.agent.runner`) calls the handler, wraps how the call ended in
a :data:`CallEnd` (:class:`Returned`, :class:`Raised` or :class:`TimedOut`) and hands it to
:func:`judge`, a pure function that says what must happen to each record: its outcome
(acknowledge type), and, when the call failed, why (the runner counts and logs it). A record
handler is judged as a batch of one. The result is the seam for what later handlers will also
produce (records to send, table updates): new fields of :class:`HandlerResult`, applied by the
same runner.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from queueflow.member.agent.outputs import (
    InvalidResult,
    Outbound,
    Routes,
    Yielded,
    generator_outcome,
    result_parts,
    sort_outputs,
)
from queueflow.member.outcomes import Release, delay_of, kind_of
from queueflow.structs import AcknowledgeType, ShareRecord

__all__ = [
    "OUTCOMES",
    "AgentStats",
    "CallEnd",
    "Failure",
    "HandlerResult",
    "Raised",
    "Returned",
    "TimedOut",
    "batch_outcomes",
    "judge",
    "outcome_of",
    "safe_len",
    "safe_repr",
]

#: The acknowledge types a handler may return.
OUTCOMES = (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT)


def outcome_of(result: Any) -> AcknowledgeType | None:
    """Map a handler's return value to an acknowledge type; ``None`` if it is not one."""
    if result is None:
        return AcknowledgeType.ACCEPT
    result = kind_of(result)  # queueflow.release(delay=...): its delay is taken by judge()
    if isinstance(result, AcknowledgeType) and result in OUTCOMES:
        return result
    return None


def batch_outcomes(result: Any, count: int) -> list[AcknowledgeType] | AcknowledgeType | None:
    """Map a batch handler's return value for ``count`` records to their outcomes.

    Args:
        result: what the handler returned: a sequence (not ``str``/``bytes``) of ``count``
            outcomes (``ACCEPT``, ``RELEASE``, ``REJECT`` or ``None`` each), or one of those for
            the whole batch.
        count: the records the handler was called with.

    Returns:
        One outcome per record, in order; a single outcome for all of them; or ``None`` when
        ``result`` is none of the above (wrong length, an element that is not an outcome, or
        another type). Never raises.
    """
    single = outcome_of(result)
    if single is not None:
        return single
    if not isinstance(result, Sequence) or isinstance(result, (str, bytes, bytearray)):
        return None
    if len(result) != count:
        return None
    outcomes: list[AcknowledgeType] = []
    append = outcomes.append
    accept = AcknowledgeType.ACCEPT
    for item in result:
        item = kind_of(item)
        if item is None:
            append(accept)
        elif isinstance(item, AcknowledgeType) and item in OUTCOMES:
            append(item)
        else:
            return None
    return outcomes


def safe_repr(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters, for a log line; never raises (a handler's
    return value or exception may have a ``__repr__`` that raises: it is named instead)."""
    try:
        return repr(value)[:limit]
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # any failure of foreign code
        return f"<{type(value).__name__} object; its repr() raised {type(exc).__name__}>"


def safe_len(value: object) -> int | None:
    """``len(value)`` of a sequence, else ``None``; never raises (for a log line)."""
    try:
        return len(value) if isinstance(value, Sequence) else None
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # a foreign __len__ or __class__
        return None


class AgentStats:
    """Counters of one share agent in this process.

    ``lock_expired``: records released unhandled because their acquisition lock expired while
    they waited for a handler; ``acks_dropped``: outcomes the leader refused as stale;
    ``handler_timeouts``: records RELEASEd because their handler call passed its deadline;
    ``renewed``: record lock renewals (RENEW) sent for handler calls still running;
    ``given_back``: records released undelivered before their lock expired because no handler
    would have started them in time (:func:`~queueflow.member.agent.giveback.release_expiring`).
    """

    def __init__(self) -> None:
        self.delivered = 0
        self.accepted = 0
        self.released = 0
        self.rejected = 0
        self.redelivered = 0
        self.handler_errors = 0
        self.undecodable = 0
        self.lock_expired = 0
        self.acks_dropped = 0
        self.handler_timeouts = 0
        self.renewed = 0
        self.given_back = 0

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return dict(vars(self))

    def count(self, kind: AcknowledgeType, n: int = 1) -> None:
        """Count ``n`` records acknowledged with ``kind`` (ACCEPT, RELEASE or REJECT)."""
        if kind is AcknowledgeType.ACCEPT:
            self.accepted += n
        elif kind is AcknowledgeType.RELEASE:
            self.released += n
        else:
            self.rejected += n


# -- how a handler call ended -----------------------------------------------------------------
# Made once per handler call, so kept cheap: plain slotted dataclasses (equal only to their own
# kind), never changed after they are made.
@dataclass(slots=True)
class Returned:
    """The handler returned ``value``."""

    value: Any


@dataclass(slots=True)
class Raised:
    """The handler raised ``error``: an ``Exception``, or a ``BaseException`` short of process
    exit (``CancelledError`` the handler raised itself, ``GeneratorExit``, ...); a stop's
    cancellation is not judged, ``KeyboardInterrupt`` and ``SystemExit`` end the process."""

    error: BaseException


@dataclass(slots=True)
class TimedOut:
    """The watchdog cancelled the call at its deadline (see
    :mod:`queueflow.member.agent.deadlines`)."""


#: How one handler call ended.
CallEnd = Returned | Raised | TimedOut


class Failure(enum.Enum):
    """Why a call's records were all RELEASEd; the value is the ``reason`` label of
    ``queueflow_handler_errors_total``."""

    RAISED = "raised"
    INVALID_OUTCOME = "invalid_outcome"
    #: an outcome with results that can't be published as given (``HandlerResult.detail``)
    INVALID_RESULT = "invalid_result"
    TIMED_OUT = "timeout"


class HandlerResult(NamedTuple):
    """What must happen after one handler call; the runner applies it (acknowledge each record
    with its outcome, count, log). Immutable; a named tuple because one is made per handler
    call (a frozen dataclass costs three times as much to build).

    Attributes:
        records: the records the handler was called with (one for a record handler).
        outcomes: one acknowledge type per record, in the same order.
        failure: why every record is RELEASEd, or ``None`` when the handler gave the outcomes.
        ended: how the call ended (what was returned or raised, for the log line).
        batch: the handler is a batch handler (its failures are logged per batch).
        outputs: per record (same order), the records to publish before its outcome is
            recorded (:func:`~queueflow.member.agent.outputs.sort_outputs`); ``None`` when no
            record has any (the common case: nothing to publish).
        detail: why the results are invalid (with ``Failure.INVALID_RESULT``).
        delays: per record (same order), the delay in ms of a RELEASE given as
            ``queueflow.release(delay=...)`` (0: none); ``None`` when no record has one.
    """

    records: Sequence[ShareRecord]
    outcomes: tuple[AcknowledgeType, ...]
    failure: Failure | None = None
    ended: CallEnd | None = None
    batch: bool = False
    outputs: tuple[tuple[Outbound, ...], ...] | None = None
    detail: str | None = None
    delays: tuple[int, ...] | None = None

    @property
    def handler_errors(self) -> int:
        """Records counted as handler errors (a raise, an invalid return value or results)."""
        failed = self.failure is not None and self.failure is not Failure.TIMED_OUT
        return len(self.records) if failed else 0


_NO_ROUTES = Routes()
_new = tuple.__new__


def _parts(
    value: Any, count: int, batch: bool
) -> list[tuple[AcknowledgeType, Sequence[Any]]] | None:
    """Each record's outcome and results from a handler's return value; ``None``: not valid.

    Raises:
        InvalidResult: a :class:`~queueflow.member.agent.outputs.Result` or what a generator
            yielded is invalid (the message says why).
    """
    if not batch:
        if type(value) is Yielded:
            return [generator_outcome(value)]
        single = result_parts(value)
        return None if single is None else [single]
    outcome = outcome_of(value)
    if outcome is not None:
        return [(outcome, ())] * count
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes, bytearray)):
        return None
    if len(value) != count:
        return None
    parts: list[tuple[AcknowledgeType, Sequence[Any]]] = []
    for item in value:
        one = result_parts(item)
        if one is None:
            return None
        parts.append(one)
    return parts


def _delays(value: Any, count: int, batch: bool) -> tuple[int, ...] | None:
    """Each record's RELEASE delay (ms) from a valid return value; ``None`` if none has one."""
    if not batch or not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        delay = delay_of(value)
        return (delay,) * count if delay else None
    delays = tuple(delay_of(item) for item in value)
    return delays if any(delays) else None


def judge(
    ended: CallEnd, records: Sequence[ShareRecord], batch: bool, routes: Routes | None = None
) -> HandlerResult:
    """The outcome of each of ``records``, and what each publishes, after a handler call that
    ended as ``ended``.

    A record handler (``batch=False``, one record) returns ``ACCEPT``/``RELEASE``/``REJECT``
    or ``None`` (:func:`outcome_of`), or a :class:`~queueflow.member.agent.outputs.Result`;
    an async generator handler's yields come as a
    :class:`~queueflow.member.agent.outputs.Yielded`; a batch handler returns one of those per
    record or one outcome for all (:func:`batch_outcomes`). A raise, a timeout or any other
    return value RELEASEs every record, and so do results that can't be routed
    (``Failure.INVALID_RESULT``); what is published follows
    :func:`~queueflow.member.agent.outputs.sort_outputs` with ``routes`` (the agent's
    ``sink=``/``dead_letter=``; ``None``: neither). Pure: never raises, does no I/O.
    """
    if not batch and type(ended) is Returned:  # the common case, first
        outcome = outcome_of(ended.value)
        if outcome is not None and (
            routes is None or routes.dead_letter is None or outcome is not AcknowledgeType.REJECT
        ):
            delays: tuple[int, ...] | None = (
                (ended.value.delay_ms,) if type(ended.value) is Release else None
            )
            # tuple.__new__: a third cheaper than the named tuple's own __new__ (per record)
            return _new(
                HandlerResult, (records, (outcome,), None, ended, False, None, None, delays)
            )
    count = len(records)
    if batch and type(ended) is Returned and (routes is None or routes.dead_letter is None):
        # One outcome for the whole batch (a batch handler returning None: all ACCEPT): what
        # the general path below gives, without a tuple or a generator step per record.
        outcome = outcome_of(ended.value)
        if outcome is not None:
            delay = delay_of(ended.value)
            delays = (delay,) * count if delay else None
            return HandlerResult(records, (outcome,) * count, None, ended, True, None, None, delays)
    release = (AcknowledgeType.RELEASE,) * count
    match ended:
        case TimedOut():
            return HandlerResult(records, release, Failure.TIMED_OUT, ended, batch)
        case Raised():
            return HandlerResult(records, release, Failure.RAISED, ended, batch)
        case Returned(value=value):
            try:
                parts = _parts(value, count, batch)
                if parts is None:
                    return HandlerResult(records, release, Failure.INVALID_OUTCOME, ended, batch)
                routes = routes or _NO_ROUTES
                outputs = tuple(
                    sort_outputs(outcome, values, record, routes)
                    if values or routes.dead_letter
                    else ()
                    for (outcome, values), record in zip(parts, records, strict=True)
                )
            except InvalidResult as exc:
                return HandlerResult(
                    records, release, Failure.INVALID_RESULT, ended, batch, None, str(exc)
                )
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:  # a foreign __len__, __iter__, __class__ ...
                return HandlerResult(records, release, Failure.INVALID_OUTCOME, ended, batch)
            outcomes = tuple(outcome for outcome, _ in parts)
            published = outputs if any(outputs) else None
            delays = _delays(value, count, batch)
            return HandlerResult(records, outcomes, None, ended, batch, published, None, delays)
