"""What a coordinator handler returns: the :class:`CoordinatorResult` of one message.

Kafka's group coordinator returns a ``CoordinatorResult`` (the response and the records to
write) from handlers that do no I/O; the runtime then writes the records and sends the
response. The share-group coordinator's handlers (:mod:`.membership`, :mod:`.admin`,
:mod:`.announcements`) do the same: they change the coordinator's in-memory state
(:class:`~queueflow.server.coordinator.state.CoordinatorState`) and return what must happen;
:class:`~queueflow.server.coordinator.dispatcher.ShareGroupCoordinator` performs it, in this
order: log events, group records (the ``share-groups`` table and its gauges), messages to
share-partition leaders, replies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from queueflow.protocol import messages as protocol

__all__ = [
    "NOTHING",
    "CoordinatorResult",
    "DeleteGroup",
    "GroupRecord",
    "LogEvent",
    "PersistGroup",
    "Reply",
    "ToLeader",
]


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One structured log event (``queueflow.server.coordinator`` logger) to emit.

    Attributes:
        level: the structlog method: ``"info"``, ``"warning"`` or ``"error"``.
        event: the event name (documented in docs/operations.md, "Monitoring: log events").
        fields: its key-value fields.
    """

    level: str
    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def info(cls, event: str, **fields: Any) -> LogEvent:
        """An ``info`` event."""
        return cls("info", event, fields)

    @classmethod
    def warning(cls, event: str, **fields: Any) -> LogEvent:
        """A ``warning`` event."""
        return cls("warning", event, fields)

    @classmethod
    def error(cls, event: str, **fields: Any) -> LogEvent:
        """An ``error`` event."""
        return cls("error", event, fields)


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer to a member or an admin on the reply topic.

    Attributes:
        recipient: the member id or admin id (the record key unless sealed).
        reply_partition: the reply-topic partition the recipient reads.
        message: the answer.
        reply_key: the member's X25519 public key to seal the answer to (``b""``: unsealed;
            see :func:`queueflow.server.transport.send_reply`).
    """

    recipient: str
    reply_partition: int
    message: protocol.HeartbeatResponse | protocol.AdminResponse
    reply_key: bytes = b""


@dataclass(frozen=True, slots=True)
class ToLeader:
    """A message to the leader of one share-partition, appended to the request topic
    partition of ``message.topic[message.partition]``."""

    message: protocol.ReleaseMember | protocol.ResetSharePartition


@dataclass(frozen=True, slots=True)
class PersistGroup:
    """Store a group's metadata in the ``share-groups`` table and update its gauges.

    Attributes:
        group_id: the share group (the table key, UTF-8).
        value: the encoded metadata (:func:`queueflow.protocol.group_codec.encode_group`).
        members: its member count (``queueflow_share_group_members``).
        group_epoch: its group epoch (``queueflow_share_group_epoch``).
        rebalances: group epochs bumped since the last count
            (``queueflow_share_group_rebalances_total``).
    """

    group_id: str
    value: bytes
    members: int
    group_epoch: int
    rebalances: int = 0


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """Delete a group's metadata from the ``share-groups`` table (its member gauge goes to 0)."""

    group_id: str


#: A record of the ``share-groups`` table to write.
GroupRecord = PersistGroup | DeleteGroup


@dataclass(frozen=True, slots=True)
class CoordinatorResult:
    """Everything one coordinator message leads to (see the module docstring).

    Attributes:
        events: log events, in order.
        records: group records to write, in order.
        to_leaders: messages to share-partition leaders (ReleaseMember, ResetSharePartition).
        replies: answers to members and admins.
    """

    events: tuple[LogEvent, ...] = ()
    records: tuple[GroupRecord, ...] = ()
    to_leaders: tuple[ToLeader, ...] = ()
    replies: tuple[Reply, ...] = ()

    def __add__(self, other: CoordinatorResult) -> CoordinatorResult:
        """Both results, ``self``'s effects first in each kind."""
        return CoordinatorResult(
            self.events + other.events,
            self.records + other.records,
            self.to_leaders + other.to_leaders,
            self.replies + other.replies,
        )

    @property
    def empty(self) -> bool:
        """Whether nothing is to be done."""
        return not (self.events or self.records or self.to_leaders or self.replies)


#: The result of a handler that has nothing to do.
NOTHING = CoordinatorResult()
