"""Pluggable share-group assignors (KIP-932 "Share group membership"; chosen per group the way
Kafka's classic group membership protocol chooses one, see :mod:`.base`).

* :class:`Assignor`: the interface (``name``, ``assign(spec)``), :class:`AssignmentSpec` and
  :class:`MemberSpec` its input;
* built in: ``simple`` (:class:`SimpleAssignor`, the default), ``lag``
  (:class:`LagAwareAssignor`) and ``rack`` (:class:`RackAwareAssignor`);
* :func:`register_assignor` adds your own; :func:`get_assignor` looks one up by name;
* :func:`select_assignor`: the coordinator's choice, the first of ``group.share.assignors``
  that every member supports.
"""

from __future__ import annotations

from queueflow.engine.assignors.base import (
    DEFAULT_ASSIGNOR,
    AssignmentSpec,
    Assignor,
    AssignorSelection,
    MemberSpec,
    check_known,
    get_assignor,
    parse_names,
    register_assignor,
    registered_assignors,
    select_assignor,
    supported_by,
)
from queueflow.engine.assignors.lag import LagAwareAssignor
from queueflow.engine.assignors.rack import RackAwareAssignor
from queueflow.engine.assignors.simple import SimpleAssignor

__all__ = [
    "DEFAULT_ASSIGNOR",
    "AssignmentSpec",
    "Assignor",
    "AssignorSelection",
    "LagAwareAssignor",
    "MemberSpec",
    "RackAwareAssignor",
    "SimpleAssignor",
    "check_known",
    "get_assignor",
    "parse_names",
    "register_assignor",
    "registered_assignors",
    "select_assignor",
    "supported_by",
]

for _builtin in (SimpleAssignor(), LagAwareAssignor(), RackAwareAssignor()):
    register_assignor(_builtin)
