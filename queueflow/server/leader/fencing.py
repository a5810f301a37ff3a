"""The leader's fencing decisions, as pure handlers: its own and newer leaders' fences in the
request log, and the stale-coordinator check of what the coordinator sends
(:mod:`queueflow.engine.fencing` holds the rules)."""

from __future__ import annotations

from queueflow.engine.fencing import CoordinatorEpochs, FenceOutcome, PartitionFencing
from queueflow.errors import FencedStateEpochError
from queueflow.protocol import messages as protocol
from queueflow.server.leader.results import LeaderResult, LogEvent, MetricIncrement
from queueflow.server.transport import not_leader

__all__ = ["leads", "not_leader_answer", "on_fence", "stale_coordinator"]


def leads(fencing: PartitionFencing, partition: int) -> bool:
    """True while this worker leads ``partition`` (live or not yet live): requests read from
    it are its to handle. Otherwise its new leader answers them."""
    try:
        fencing.check(partition)
    except FencedStateEpochError:
        return False
    return True


def not_leader_answer(
    fencing: PartitionFencing,
    topic: str,
    request: protocol.ShareFetchRequest,
    failure: Exception | None = None,
) -> protocol.ShareFetchResponse:
    """The ``NOT_LEADER_OR_FOLLOWER`` answer to a direct request this worker does not serve,
    saying why (not led here, stepped down, not live yet, or ``failure``): the member
    re-routes."""
    lead = fencing.partitions.get(request.partition)
    if failure is not None and lead is not None and lead.fenced is None:
        why = f"could not be served by this worker ({failure!r}); re-send it elsewhere"
    elif lead is None:
        why = "is not led by this worker"
    else:
        why = lead.fenced or "is led by this worker, which is not live on it yet"
    return not_leader(request, f"partition {topic}[{request.partition}] {why}")


def on_fence(fencing: PartitionFencing, partition: int, epoch: int) -> LeaderResult:
    """Read ``Fence(epoch)`` from request partition ``partition``: the leader goes live on its
    own fence and steps down on a newer one (KIP-932 "Share-partition leader"; here the
    fence in the request log plays the share coordinator's state epoch)."""
    outcome = fencing.on_fence(partition, epoch)
    fields = {"partition": partition, "leader_epoch": epoch}
    if outcome is FenceOutcome.LIVE:
        return LeaderResult(logs=(LogEvent("info", "leader_live", fields),))
    if outcome is FenceOutcome.SUPERSEDED:
        reason = fencing.partitions[partition].fenced or "fenced"
        return LeaderResult(step_down=((partition,), reason))
    return LeaderResult(logs=(LogEvent("debug", "fence_ignored", fields),))


def stale_coordinator(
    epochs: CoordinatorEpochs,
    message: protocol.ReleaseMember | protocol.ResetSharePartition,
    partition: int,
    now_ms: int,
) -> LeaderResult | None:
    """``None`` when ``message`` may be acted on; else its refusal (counted, logged
    rate-limited as ``stale_coordinator_refused``): it comes from a coordinator older than the
    newest seen for its group, one that lost its partition (frozen, cut off) and must not
    release members' records or reset state
    (:class:`~queueflow.engine.fencing.CoordinatorEpochs`)."""
    if epochs.admit(message.group, message.coordinator_epoch, now_ms):
        return None
    return LeaderResult(
        metrics=(MetricIncrement("stale_coordinator_refusals", ("leader", message.kind)),),
        logs=(
            LogEvent(
                "warning",
                "stale_coordinator_refused",
                {
                    "group": message.group,
                    "partition": partition,
                    "kind": message.kind,
                    "coordinator_epoch": message.coordinator_epoch,
                    "newest_coordinator_epoch": epochs.newest(message.group),
                },
                limiter="refusals",
            ),
        ),
    )
