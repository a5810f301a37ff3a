"""What a handler produces besides its outcome: results (:class:`Send`, plain values) and dead
letters (:class:`DeadLetter`), and the rules that tie them to the outcome. Pure: no I/O.

A handler gives its results in one of three forms (docs/guide.md "Producing results"):

* ``return Result(ACCEPT, [v1, Send("audit", v2)])`` from a coroutine handler;
* ``yield v1`` / ``yield Send(...)`` / ``yield DeadLetter(...)`` from an async generator
  handler, which may also yield its outcome once, last (finishing without one is ACCEPT);
* one :class:`Result` (or outcome, or ``None``) per record from a batch handler.

The rules (:func:`sort_outputs`):

==========================  ===================================================================
outcome                     published
==========================  ===================================================================
ACCEPT                      its :class:`Send` items and plain values (plain values go to every
                            sink of the agent); :class:`DeadLetter` items are dropped
REJECT                      only its :class:`DeadLetter` items; none given and the agent has a
                            ``dead_letter=`` topic: a copy of the record goes there
RELEASE, a raise, an        nothing
invalid result, a timeout
==========================  ===================================================================

An item that can't be routed (a plain value or ``Send(to=None)`` on an agent without ``sink=``,
a :class:`DeadLetter` without ``to`` on an agent without ``dead_letter=``) makes the result
invalid: the record is RELEASEd and the reason logged, as for an invalid outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from queueflow.member.outcomes import kind_of
from queueflow.structs import AcknowledgeType, ShareRecord

__all__ = [
    "COPY_OF_RECORD",
    "DEAD_LETTER_HEADER",
    "USE_RECORD_KEY",
    "DeadLetter",
    "InvalidResult",
    "Outbound",
    "Result",
    "Routes",
    "Send",
    "Yielded",
    "dead_letter_headers",
    "generator_outcome",
    "result_parts",
    "sort_outputs",
]


class _Marker:
    """A named default that no user value can be equal to."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"queueflow.{self.name}"

    def __reduce__(self) -> str:  # copies and pickles stay the one instance
        return self.name


#: ``Send.key`` default: the source record's key, as its raw bytes (so results stay partitioned
#: by the source key).
USE_RECORD_KEY: Final = _Marker("USE_RECORD_KEY")
#: ``DeadLetter.value`` default: a copy of the source record (raw key, value and headers).
COPY_OF_RECORD: Final = _Marker("COPY_OF_RECORD")

#: The prefix of the headers a dead-lettered record carries: ``group``, ``topic``,
#: ``partition``, ``offset``, ``delivery_count``, ``reason`` (UTF-8 text).
DEAD_LETTER_HEADER = "queueflow.dead_letter."

_ACCEPT = AcknowledgeType.ACCEPT
_RELEASE = AcknowledgeType.RELEASE
_REJECT = AcknowledgeType.REJECT
_OUTCOMES = (_ACCEPT, _RELEASE, _REJECT)


@dataclass(frozen=True, slots=True)
class Send:
    """One result record to one destination; published only if the record is ACCEPTed.

    Attributes:
        to: a topic name, a Faust topic or agent (its channel), or ``None``: every sink of the
            agent (``sink=``).
        value: the value, encoded with the destination's value serializer (a topic name: the
            app's default; ``bytes`` pass through).
        key: the key (default: the source record's raw key, :data:`USE_RECORD_KEY`); encoded
            with the destination's key serializer.
        headers: extra headers, ``{name: bytes}``.
        partition: the destination partition (``None``: the producer's partitioner, by key).
    """

    to: Any
    value: Any
    key: Any = USE_RECORD_KEY
    headers: Mapping[str, bytes] | None = None
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record for the dead-letter path; published only if the record is REJECTed.

    Attributes:
        value: the value (default :data:`COPY_OF_RECORD`: the source record's raw key, value
            and headers).
        reason: why, for the ``queueflow.dead_letter.reason`` header.
        to: the destination (default: the agent's ``dead_letter=`` topic).
    """

    value: Any = COPY_OF_RECORD
    reason: str | None = None
    to: Any = None


@dataclass(frozen=True, slots=True)
class Result:
    """A coroutine handler's outcome with its results.

    Attributes:
        outcome: ``ACCEPT`` (default), ``RELEASE`` or ``REJECT`` (``None`` means ACCEPT).
        values: the results: each a plain value (to every sink), a :class:`Send` or a
            :class:`DeadLetter`; a list or tuple.
    """

    outcome: AcknowledgeType | None = _ACCEPT
    values: Sequence[Any] = ()


class Yielded(list[Any]):
    """What an async generator handler yielded, in order (made by the runner)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Routes:
    """Where an agent's results go by default.

    Attributes:
        sinks: the agent's ``sink=`` destinations (topic names, Faust topics or agents).
        dead_letter: the agent's ``dead_letter=`` topic, or ``None``.
        group: the share group (for the dead-letter headers).
    """

    sinks: tuple[Any, ...] = ()
    dead_letter: Any = None
    group: str = ""


@dataclass(frozen=True, slots=True)
class Outbound:
    """One record to publish, before serialization.

    Attributes:
        to: the destination (a topic name or a Faust channel).
        key: the key (``bytes`` pass through the serializer).
        value: the value.
        headers: the headers, in order.
        partition: the destination partition, or ``None``.
        raw: key and value are raw bytes of the source record (no serializer applies).
    """

    to: Any
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None
    raw: bool = False


class InvalidResult(ValueError):
    """A handler's results can't be published as given (the message says why)."""


def generator_outcome(items: Sequence[Any]) -> tuple[AcknowledgeType, list[Any]]:
    """Split what an async generator handler yielded into its outcome and its results.

    Every item that is not an outcome is a result; an outcome (``ACCEPT``, ``RELEASE``,
    ``REJECT``) yielded sets the outcome, at most once and last; none yielded is ACCEPT.

    Raises:
        InvalidResult: a second outcome, a result after the outcome, or another acknowledge
            type (``RENEW``, ``GAP``) yielded.
    """
    outcome: AcknowledgeType | None = None
    values: list[Any] = []
    for item in items:
        item = kind_of(item)  # a queueflow.release(delay=...) is a RELEASE (its delay: judge)
        if isinstance(item, AcknowledgeType):
            if item not in _OUTCOMES:
                raise InvalidResult(f"yielded {item.name}, which is not an outcome")
            if outcome is not None:
                raise InvalidResult(f"yielded a second outcome ({outcome.name}, then {item.name})")
            outcome = item
        elif outcome is not None:
            raise InvalidResult(f"yielded a result after the outcome {outcome.name}")
        else:
            values.append(item)
    return (_ACCEPT if outcome is None else outcome), values


def result_parts(value: Any) -> tuple[AcknowledgeType, Sequence[Any]] | None:
    """The outcome and results of a :class:`Result` or a plain outcome (``None`` = ACCEPT);
    ``None`` when ``value`` is neither.

    Raises:
        InvalidResult: a :class:`Result` whose outcome is not one, or whose ``values`` is not a
            list or tuple.
    """
    if value is None:
        return _ACCEPT, ()
    value = kind_of(value)
    if isinstance(value, AcknowledgeType):
        return (value, ()) if value in _OUTCOMES else None
    if type(value) is Result:
        outcome = _ACCEPT if value.outcome is None else kind_of(value.outcome)
        if not (isinstance(outcome, AcknowledgeType) and outcome in _OUTCOMES):
            raise InvalidResult(f"Result.outcome={outcome!r} is not ACCEPT, RELEASE or REJECT")
        if not isinstance(value.values, (list, tuple)):
            raise InvalidResult(
                f"Result.values is a {type(value.values).__name__}; give a list or tuple"
            )
        return outcome, value.values
    return None


def dead_letter_headers(
    record: ShareRecord, group: str, reason: str | None
) -> tuple[tuple[str, bytes], ...]:
    """The ``queueflow.dead_letter.*`` headers naming ``record`` (UTF-8 text values)."""
    fields = (
        ("group", group),
        ("topic", record.topic),
        ("partition", str(record.partition)),
        ("offset", str(record.offset)),
        ("delivery_count", str(record.delivery_count)),
        ("reason", reason or "rejected"),
    )
    return tuple((DEAD_LETTER_HEADER + name, text.encode()) for name, text in fields)


def _raw_key(record: ShareRecord) -> Any:
    return record.raw_key if record.raw_key is not None else record.key


def _send(item: Send, record: ShareRecord, routes: Routes) -> list[Outbound]:
    key = _raw_key(record) if item.key is USE_RECORD_KEY else item.key
    headers = tuple(item.headers.items()) if item.headers else ()
    if item.to is None:
        if not routes.sinks:
            raise InvalidResult("Send(to=None) goes to every sink, and the agent has no sink=")
        return [Outbound(to, key, item.value, headers, item.partition) for to in routes.sinks]
    return [Outbound(item.to, key, item.value, headers, item.partition)]


def _dead_letter(item: DeadLetter, record: ShareRecord, routes: Routes) -> Outbound:
    to = item.to if item.to is not None else routes.dead_letter
    if to is None:
        raise InvalidResult("DeadLetter without to=, and the agent has no dead_letter=")
    headers = dead_letter_headers(record, routes.group, item.reason)
    if item.value is COPY_OF_RECORD:
        raw_value = record.raw_value if record.raw_value is not None else record.value
        return Outbound(to, _raw_key(record), raw_value, (*record.headers, *headers), None, True)
    return Outbound(to, _raw_key(record), item.value, headers)


def sort_outputs(
    outcome: AcknowledgeType, values: Sequence[Any], record: ShareRecord, routes: Routes
) -> tuple[Outbound, ...]:
    """The records to publish for ``record`` with ``outcome`` and results ``values`` (see the
    module docstring for the rules).

    Raises:
        InvalidResult: an item that would be published can't be routed, or an outcome was
            given among the results.
    """
    out: list[Outbound] = []
    if outcome is _ACCEPT:
        for item in values:
            if isinstance(item, Send):
                out.extend(_send(item, record, routes))
            elif isinstance(item, DeadLetter):
                continue  # dead letters go out with a REJECT only
            elif isinstance(item, (AcknowledgeType, Result)):
                raise InvalidResult(f"{item!r} among the results; give the outcome once")
            elif not routes.sinks:
                raise InvalidResult(
                    f"a plain result ({type(item).__name__}) goes to every sink, and the agent "
                    "has no sink=; give sink= or Send(to=...)"
                )
            else:
                key = _raw_key(record)
                out.extend(Outbound(to, key, item) for to in routes.sinks)
    elif outcome is _REJECT:
        letters = [item for item in values if isinstance(item, DeadLetter)]
        if not letters and routes.dead_letter is not None:
            letters = [DeadLetter()]
        out.extend(_dead_letter(item, record, routes) for item in letters)
    return tuple(out)
