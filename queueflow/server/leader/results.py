"""What handling one request decided: the results the leader's pure handlers return.

Kafka's coordinators answer each request with a ``CoordinatorResult`` (the response plus the
records to write) and one place appends the records and sends the response. The leader works
the same way: the handlers of :mod:`queueflow.server.leader.handlers` and
:mod:`queueflow.server.leader.resets` change only in-memory state (the share-partition engines,
the ticket gate, the fencing state) and return a :class:`LeaderResult`;
:meth:`ShareLeader._apply <queueflow.server.leader.manager.ShareLeader._apply>` performs it:
state writes, the request position, the flush, replies, metrics and log lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from queueflow.protocol import messages as protocol
from queueflow.server.durable import DurableSharePartition

__all__ = ["FetchResult", "LeaderResult", "LogEvent", "MemberReply", "MetricIncrement", "NewState"]

#: Which rate limiter a log line goes through (``None``: logged every time).
Limiter = Literal["refusals", "skipped"]


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One structured log line of the leader's log (``queueflow.server.leader``).

    Attributes:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        event: the event name (listed in docs/operations.md).
        fields: its key-value fields (the leader adds ``topic``).
        limiter: log it through this rate limiter (then it carries ``suppressed=``), or always.
    """

    level: Literal["debug", "info", "warning", "error"]
    event: str
    fields: Mapping[str, object] = field(default_factory=dict)
    limiter: Limiter | None = None


@dataclass(frozen=True, slots=True)
class MetricIncrement:
    """Add ``amount`` to the counter ``metric`` (an attribute of :class:`queueflow.metrics.
    Metrics`) with ``labels``."""

    metric: Literal[
        "lock_expiries",
        "acquisitions",
        "deliveries",
        "ticket_refusals",
        "stale_coordinator_refusals",
        "member_fences",
    ]
    labels: tuple[str, ...]
    amount: int = 1


@dataclass(frozen=True, slots=True)
class MemberReply:
    """A ShareFetch answer to send on the reply topic (sealed to the member's key from the
    request's ticket under ``queueflow.auth.mode=hmac``)."""

    request: protocol.ShareFetchRequest
    response: protocol.ShareFetchResponse


@dataclass(frozen=True, slots=True)
class NewState:
    """A share-partition to create at ``start_offset`` (an admin reset of one without state)."""

    group: str
    partition: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class LeaderResult:
    """Everything handling one request (or one batch of direct requests) must make happen, in
    the order :meth:`~queueflow.server.leader.manager.ShareLeader._apply` performs it.

    Attributes:
        deletes: share-partitions whose durable state is deleted (admin delete).
        creates: share-partitions created with a first snapshot (admin reset).
        writes: share-partitions whose changes are written, one delta each.
        position: the request offset persisted as applied (after the state writes).
        flush: wait for the broker to acknowledge the writes before answering (only with
            ``queueflow.leader.state.durability=acked``).
        metrics: counter increments.
        logs: log lines.
        replies: ShareFetch answers to members, on the reply topic.
        coordinator_replies: admin-reset answers to the coordinator.
        step_down: ``(partitions, reason)`` to step down from (a newer leader's fence).
        changed: records may have become available: wake the partition's parked long polls.
    """

    deletes: tuple[DurableSharePartition, ...] = ()
    creates: tuple[NewState, ...] = ()
    writes: tuple[DurableSharePartition, ...] = ()
    position: int | None = None
    flush: bool = False
    metrics: tuple[MetricIncrement, ...] = ()
    logs: tuple[LogEvent, ...] = ()
    replies: tuple[MemberReply, ...] = ()
    coordinator_replies: tuple[protocol.ResetSharePartitionResult, ...] = ()
    step_down: tuple[tuple[int, ...], str] | None = None
    changed: bool = False

    def __add__(self, other: LeaderResult) -> LeaderResult:
        """Both results, this one's effects first (a batch of direct requests)."""
        step_down = other.step_down if other.step_down is not None else self.step_down
        return LeaderResult(
            deletes=self.deletes + other.deletes,
            creates=self.creates + other.creates,
            writes=_unique(self.writes + other.writes),
            position=other.position if other.position is not None else self.position,
            flush=self.flush or other.flush,
            metrics=self.metrics + other.metrics,
            logs=self.logs + other.logs,
            replies=self.replies + other.replies,
            coordinator_replies=self.coordinator_replies + other.coordinator_replies,
            step_down=step_down,
            changed=self.changed or other.changed,
        )


def _unique(durables: tuple[DurableSharePartition, ...]) -> tuple[DurableSharePartition, ...]:
    """Each share-partition once, in first-seen order (one delta per batch)."""
    return tuple({id(d): d for d in durables}.values())


#: Nothing to do.
NOTHING = LeaderResult()


@dataclass(frozen=True, slots=True)
class FetchResult:
    """A ShareFetch applied to its share-partition, before the path it came by adds its own
    effects (the request log persists and answers at once; the direct path writes once per
    batch and may park the request).

    Attributes:
        response: the answer so far.
        durable: the share-partition it may have changed (``None``: refused, or its state could
            not be loaded; nothing changed).
        effects: its metrics and log lines.
    """

    response: protocol.ShareFetchResponse
    durable: DurableSharePartition | None
    effects: LeaderResult = NOTHING
