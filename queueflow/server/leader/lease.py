"""The membership lease on the leaders' direct path: the I/O around
:class:`~queueflow.engine.fencing.MembershipLease` (docs/architecture.md "The membership lease").

A leader cut off from Faust's group coordinator (a network partition, a stuck consumer thread)
keeps its event loop, its direct endpoint and its members. The broker gives its partitions to a
successor once the session timeout has passed since the last heartbeat it accepted, so the
leader may hand out records, and write state, only while an OK heartbeat *sent* less than the
session timeout (minus a margin) ago proves its membership. :class:`LeaseGate` checks that
when a direct request arrives, before a batch of queued or parked ones acquires, and before an
answer leaves (its state write or record read may have outlasted the lease); it logs
``leader_lease_lapsed`` and ``leader_lease_regained`` once per change and counts refusals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from queueflow.engine.fencing import LeaseChange, LeaseTransitions, lease_allows
from queueflow.errors import FencedStateEpochError
from queueflow.logging import get_logger
from queueflow.server.context import ServerContext

__all__ = ["LEASE_LAPSED", "LeaseGate"]

log = get_logger("queueflow.server.leader.lease")

#: Why a direct request is refused while the lease has lapsed.
LEASE_LAPSED = (
    "no recent OK heartbeat proves this worker's Faust group membership (cut off from the "
    "group coordinator, or a stuck consumer thread): its partitions may have moved"
)


class LeaseGate:
    """Whether this worker may serve the direct path now (its membership lease holds).

    Args:
        ctx: the server context (``runtime.lease_remaining_ms()``, metrics).
    """

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self._transitions = LeaseTransitions()

    def holds(self) -> bool:
        """True while the lease holds (always, for hosts whose membership can't lapse)."""
        return lease_allows(self.ctx.runtime.lease_remaining_ms())

    def check(self, stage: str, count: int = 1) -> None:
        """Raise unless the lease holds; ``stage`` (``acquire``, ``answer``) labels the refusal
        of ``count`` requests in ``queueflow_direct_requests_unserved_total`` (reason
        ``lease_<stage>``).

        Raises:
            FencedStateEpochError: the lease has lapsed (the request is answered
                ``NOT_LEADER_OR_FOLLOWER`` and the member re-routes).
        """
        if not self.holds():
            self.refused(stage, count)
            raise FencedStateEpochError(LEASE_LAPSED)

    def refused(self, stage: str, count: int = 1) -> None:
        """Count ``count`` direct requests refused at ``stage`` for the lease."""
        self.ctx.metrics.direct_requests_unserved.labels(f"lease_{stage}").inc(count)

    def watch(self, live: Callable[[], Mapping[str, Sequence[int]]]) -> None:
        """Log a change of the lease (call it from the stall guard's timer: no I/O).

        Args:
            live: the request partitions this worker is live on, per source topic.
        """
        runtime = self.ctx.runtime
        remaining = runtime.lease_remaining_ms()
        change = self._transitions.observe(remaining, runtime.rebalancing)
        if change is None:
            return
        partitions = {topic: sorted(ps) for topic, ps in live().items() if ps}
        generation = runtime.generation
        if change is LeaseChange.LAPSED:
            self.ctx.metrics.leader_lease_lapses.inc()
            log.warning(
                "leader_lease_lapsed",
                generation=generation,
                over_by_ms=-(remaining or 0),
                live_partitions=partitions,
                reason=LEASE_LAPSED,
            )
        else:
            log.info("leader_lease_regained", generation=generation, live_partitions=partitions)
