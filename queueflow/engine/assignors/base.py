"""The assignor interface, the registry of assignors by name, and the choice of one per group.

KIP-932 "Share group membership": the coordinator assigns share-partitions with the assignor the
broker config ``group.share.assignors`` names. queueflow generalizes the choice the way
Kafka's classic membership protocol selects a JoinGroup protocol
(https://cwiki.apache.org/confluence/display/KAFKA/Kafka+Client-side+Assignment+Proposal):
every member advertises the assignors it supports (``queueflow.member.assignors`` in its
heartbeat), and the coordinator uses the first assignor of its own ordered preference list
that *every* current member supports. A member that advertises nothing (an older queueflow)
supports only ``simple``. So a rolling upgrade that adds an assignor keeps ``simple`` until the
last old member is gone, then switches.

An assignor is pure: :meth:`Assignor.assign` gets an :class:`AssignmentSpec` (members with their
subscriptions, racks and previous assignments; partition counts; per-share-partition lag and
partition racks where known) and returns member id → share-partitions. No I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from queueflow.errors import ConfigurationError
from queueflow.structs import TopicPartition

__all__ = [
    "DEFAULT_ASSIGNOR",
    "AssignmentSpec",
    "Assignor",
    "AssignorSelection",
    "MemberSpec",
    "get_assignor",
    "register_assignor",
    "registered_assignors",
    "select_assignor",
]

#: The assignor every member supports, advertised or not (KIP-932's SimpleAssignor).
DEFAULT_ASSIGNOR = "simple"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """One member as an assignor sees it.

    Attributes:
        subscribed_topics: the topics it subscribes to.
        rack_id: its rack (``client.rack``; KIP-848 heartbeats carry RackId), ``""`` if unset.
        previous: its current assignment (for stickiness).
    """

    subscribed_topics: tuple[str, ...]
    rack_id: str = ""
    previous: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class AssignmentSpec:
    """The input of an assignor.

    Attributes:
        members: member id → :class:`MemberSpec`.
        partitions: topic → partition count (topics unknown to the cluster are absent).
        lag: share-partition → records not yet delivered to completion (KIP-1226 lag: log end
            offset - SPSO - Acknowledged/Archived in flight), as last reported by its leader;
            absent when unknown. Only lag-aware assignors read it.
        partition_racks: Kafka partition → rack of its leader broker; absent when unknown.
            Only rack-aware assignors read it.
    """

    members: Mapping[str, MemberSpec]
    partitions: Mapping[str, int]
    lag: Mapping[TopicPartition, int] = field(default_factory=dict)
    partition_racks: Mapping[TopicPartition, str] = field(default_factory=dict)


@runtime_checkable
class Assignor(Protocol):
    """A share-group assignor (KIP-932 ``ShareGroupPartitionAssignor``; KIP-848 server-side
    ``ConsumerGroupPartitionAssignor``).

    Attributes:
        name: what members advertise and ``group.share.assignors`` lists.

    ``assign(spec)`` must be deterministic and return, for every member of ``spec.members``
    (possibly with ``[]``), a sorted list of share-partitions of topics it subscribes to; when
    there are members, every share-partition of a subscribed topic must go to at least one.
    """

    name: str

    def assign(self, spec: AssignmentSpec) -> dict[str, list[TopicPartition]]:
        """Member id → its sorted share-partitions."""
        ...


_REGISTRY: dict[str, Assignor] = {}


def register_assignor(assignor: Assignor, *, replace: bool = False) -> None:
    """Make ``assignor`` selectable by its name (``group.share.assignors``,
    ``queueflow.member.assignors``). Register on every leader worker before it starts.

    Raises:
        ConfigurationError: the name is not 1-64 letters, digits, ``.``, ``_`` or ``-``
            (starting with a letter or digit), or is taken and ``replace`` is false.
    """
    name = getattr(assignor, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"assignor name {name!r} is not valid: use 1-64 letters, digits, '.', '_' or '-'"
        )
    if name in _REGISTRY and not replace and _REGISTRY[name] is not assignor:
        raise ConfigurationError(
            f"an assignor named {name!r} is already registered; pick another name, or pass "
            "replace=True to replace it"
        )
    _REGISTRY[name] = assignor


def get_assignor(name: str) -> Assignor:
    """The registered assignor ``name``.

    Raises:
        ConfigurationError: none is registered under that name; the message lists the names.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown share-group assignor {name!r}; registered assignors: "
            + ", ".join(sorted(_REGISTRY))
        ) from None


def registered_assignors() -> list[str]:
    """The names of the registered assignors, sorted."""
    return sorted(_REGISTRY)


@dataclass(frozen=True, slots=True)
class AssignorSelection:
    """The assignor a group uses and why (logged as ``assignor_selected``).

    Attributes:
        name: the assignor's name.
        reason: one line: which preference it is and, when a preferred one was passed over,
            which members don't support it.
    """

    name: str
    reason: str


def supported_by(advertised: Sequence[str]) -> frozenset[str]:
    """What a member advertising ``advertised`` supports: those names plus ``simple``
    (a member that advertises nothing is an older member, which supports only ``simple``)."""
    return frozenset(advertised) | {DEFAULT_ASSIGNOR}


def select_assignor(
    preference: Sequence[str], members: Mapping[str, Sequence[str]]
) -> AssignorSelection:
    """The first assignor of ``preference`` that every member supports (as Kafka's classic
    group coordinator chooses a protocol all members support; the order of the list is the
    preference).

    Args:
        preference: ``group.share.assignors``, most preferred first.
        members: member id → the assignor names it advertises (``[]``: an older member).

    Returns:
        The selection; ``simple`` when no listed assignor is supported by all (every member
        supports it), or when ``preference`` is empty. Names not registered are passed over.
    """
    passed_over: list[str] = []
    for name in preference:
        if name not in _REGISTRY:  # the coordinator checks its list at start; never fail here
            passed_over.append(f"{name!r} is not registered")
            continue
        missing = sorted(m for m, names in members.items() if name not in supported_by(names))
        if not missing:
            why = "most preferred" if not passed_over else "; ".join(passed_over)
            if not members:
                why = "no members"
            return AssignorSelection(name, f"{why} (group.share.assignors={','.join(preference)})")
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        passed_over.append(f"{name!r} not supported by {len(missing)} member(s): {shown}")
    why = "; ".join(passed_over) or "no preference"
    return AssignorSelection(DEFAULT_ASSIGNOR, f"fallback: {why}")


def parse_names(text: str, setting: str) -> tuple[str, ...]:
    """``"simple,lag"`` → ``("simple", "lag")`` (blanks around names ignored).

    Raises:
        ConfigurationError: an empty or malformed name, or a name twice; the message names
            ``setting``.
    """
    if not text.strip():
        return ()
    names = tuple(n.strip() for n in text.split(","))
    for n in names:
        if not _NAME.fullmatch(n):
            raise ConfigurationError(
                f"{setting}={text!r}: {n!r} is not an assignor name; give a comma-separated "
                "list such as 'lag,simple'"
            )
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{setting}={text!r} names an assignor twice")
    return names


def check_known(names: Iterable[str], setting: str) -> None:
    """Raise :class:`ConfigurationError` naming ``setting`` if an assignor is not registered."""
    unknown = [n for n in names if n not in _REGISTRY]
    if unknown:
        raise ConfigurationError(
            f"{setting}: unknown assignor(s) {', '.join(map(repr, unknown))}; registered: "
            + ", ".join(sorted(_REGISTRY))
            + " (register your own with queueflow.engine.assignors.register_assignor)"
        )
