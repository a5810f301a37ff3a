"""Fencing and the lease gate: whether this worker may serve a coordinator partition.

The coordinator is fenced by the leaders' rules (:mod:`queueflow.engine.fencing`): its
coordinator epoch is the Faust generation in which it was assigned the coordinator partition,
it appends ``Fence(epoch)`` to that partition and serves it once it reads its own fence back,
steps down when it reads a newer one or after a stall longer than the Faust session timeout
(the stall guard), and serves only while its Faust membership lease holds.

Each owned partition's lifecycle is an :class:`OwnedState`, changed only by
:meth:`CoordinatorGate.move`, which refuses transitions :data:`OWNED_TRANSITIONS` doesn't allow.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

import structlog

from queueflow.engine.fencing import FenceOutcome, PartitionFencing
from queueflow.errors import ErrorCode, IllegalTransitionError, ShareGroupError
from queueflow.logging import SkipLogLimiter
from queueflow.protocol import messages as protocol
from queueflow.protocol.roles import ControlAuth
from queueflow.server.context import ServerContext
from queueflow.server.transport import monotonic_ms, send_due_fences

__all__ = ["LEASE_WAIT_MS", "OWNED_TRANSITIONS", "CoordinatorGate", "OwnedState"]

log = structlog.get_logger("queueflow.server.coordinator")

#: How long (ms) a request waits for this worker's membership lease before it is skipped: after
#: a rebalance the new generation's first heartbeat comes one Faust heartbeat interval later.
LEASE_WAIT_MS = 3000
_LEASE_POLL_S = 0.05


class OwnedState(enum.Enum):
    """Where this worker is with one coordinator partition it owns."""

    #: Assigned (or taken back after a stall); its own fence is not read back yet.
    FENCING = "fencing"
    #: Its own fence was read back: requests after it are this worker's to serve.
    LIVE = "live"
    #: A newer coordinator's fence was read, or the stall guard fired: it serves nothing.
    STEPPED_DOWN = "stepped_down"


#: Allowed transitions. Assignment (a new coordinator epoch) starts at ``FENCING`` from any
#: state, and revocation ends ownership; neither is a transition.
OWNED_TRANSITIONS: dict[OwnedState, frozenset[OwnedState]] = {
    OwnedState.FENCING: frozenset({OwnedState.LIVE, OwnedState.STEPPED_DOWN}),
    OwnedState.LIVE: frozenset({OwnedState.STEPPED_DOWN}),
    OwnedState.STEPPED_DOWN: frozenset({OwnedState.FENCING}),  # the membership survived a stall
}


class CoordinatorGate:
    """Fencing of the coordinator partitions this worker owns, and the lease gate.

    Args:
        ctx: the server context.
        auth: the coordinator's control-message authenticator (seals its fences).
        request_topic: the coordinator topic.
        forget: called with the partitions this worker steps down from, to drop their groups.
    """

    def __init__(
        self,
        ctx: ServerContext,
        auth: ControlAuth,
        request_topic: str,
        forget: Callable[[list[int]], None],
    ) -> None:
        self.ctx = ctx
        self.auth = auth
        self.request_topic = request_topic
        self._forget = forget
        #: Which coordinator partitions this worker owns, under which coordinator epoch.
        self.fencing = PartitionFencing(ctx.stall_limit_ms, role="coordinator")
        #: The lifecycle of each owned partition.
        self.states: dict[int, OwnedState] = {}
        #: How long (ms) a request waits for the membership lease before it is skipped.
        self.lease_wait_ms = LEASE_WAIT_MS
        self.unserved = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))

    def move(self, partition: int, to: OwnedState) -> None:
        """Change ``partition``'s state to ``to``.

        Raises:
            ValueError: ``partition`` is not owned, or ``to`` is not allowed from its state.
        """
        now = self.states.get(partition)
        if now is None or to not in OWNED_TRANSITIONS[now]:
            was = "not owned" if now is None else now.value
            raise IllegalTransitionError(
                f"coordinator partition {partition}: {was} -> {to.value} is not allowed"
            )
        self.states[partition] = to

    def assign(self, partitions: set[int], epoch: int) -> None:
        """Own ``partitions`` under coordinator epoch ``epoch`` (not live until the own fence)."""
        self.fencing.assign(partitions, epoch)
        for p in partitions:
            self.states[p] = OwnedState.FENCING

    def revoke(self, partitions: set[int]) -> None:
        """Stop owning ``partitions`` (a Faust rebalance took them)."""
        self.fencing.revoke(partitions)
        for p in partitions:
            self.states.pop(p, None)

    def step_down(self, partitions: list[int], reason: str) -> None:
        """Stop serving coordinator ``partitions``: forget their groups and pending admin
        requests (the new coordinator reloads them from the table) and log why."""
        if not partitions:
            return
        for p in partitions:
            self.move(p, OwnedState.STEPPED_DOWN)
        self._forget(partitions)
        self.ctx.metrics.coordinator_step_downs.inc(len(partitions))
        log.warning(
            "coordinator_stepped_down",
            partitions=sorted(partitions),
            reason=reason,
            code=ErrorCode.FENCED_STATE_EPOCH.value,
        )

    def on_fence(self, partition: int, epoch: int) -> None:
        """Read ``Fence(epoch)`` from coordinator ``partition``: live on its own, step down on
        a newer one."""
        outcome = self.fencing.on_fence(partition, epoch)
        if outcome is FenceOutcome.LIVE:
            self.move(partition, OwnedState.LIVE)
            log.info("coordinator_live", partition=partition, coordinator_epoch=epoch)
        elif outcome is FenceOutcome.SUPERSEDED:
            self.step_down([partition], self.fencing.partitions[partition].fenced or "fenced")

    async def send_fences(self) -> None:
        """Append this worker's fence to the coordinator partitions it owns but isn't live on
        yet, once Faust has finished rebalancing (see :mod:`queueflow.engine.fencing`)."""
        sent = await send_due_fences(self.ctx, self.fencing, self.auth, self.request_topic)
        for p, epoch in sent:
            log.info("coordinator_fence_sent", partition=p, coordinator_epoch=epoch)

    async def watch_stalls(self, now_monotonic_ms: int) -> None:
        """:meth:`check_stalls`, then send the own fences that are due."""
        self.check_stalls(now_monotonic_ms)
        await self.send_fences()

    def check_stalls(self, now_monotonic_ms: int) -> None:
        """The stall guard (called every 100 ms, as the leaders', never behind I/O): step
        down after a stall longer than the Faust session timeout, take the partitions back if
        the membership survived it."""
        stalled = self.fencing.alive(now_monotonic_ms)
        if stalled:
            self.step_down(stalled, self.fencing.partitions[stalled[0]].fenced or "stalled")
        runtime = self.ctx.runtime
        for p in self.fencing.resume_after_stall(
            now_monotonic_ms, runtime.generation, runtime.rebalancing
        ):
            self.move(p, OwnedState.FENCING)
            log.info(
                "coordinator_resumed_after_stall",
                partition=p,
                coordinator_epoch=self.fencing.partitions[p].epoch,
            )

    async def may_serve(self, partition: int, message: protocol.Message) -> bool:
        """Whether this worker may handle ``message`` of coordinator ``partition``: it owns the
        partition, has not stepped down, and its membership lease holds (waiting up to
        :attr:`lease_wait_ms` for the first heartbeat of a new generation). Otherwise the
        request is skipped (``coordinator_request_unserved``, rate-limited; counted)."""
        deadline = self.ctx.clock.monotonic() + self.lease_wait_ms / 1000
        while True:
            try:
                self.fencing.check(partition)
            except ShareGroupError as exc:
                reason, detail = "not_owner", exc.message
                break
            remaining = self.ctx.runtime.lease_remaining_ms()
            if remaining is None or remaining > 0:
                return True
            if self.ctx.clock.monotonic() >= deadline:
                reason = "lease"
                detail = (
                    "this worker's Faust group membership is not proven by a recent heartbeat "
                    "(it was frozen or cut off from the broker, and has probably been replaced)"
                )
                break
            await asyncio.sleep(_LEASE_POLL_S)
        self.ctx.metrics.coordinator_unserved.labels(reason).inc()
        suppressed = self.unserved.admit()
        if suppressed is not None:
            log.warning(
                "coordinator_request_unserved",
                partition=partition,
                kind=getattr(message, "kind", "?"),
                reason=reason,
                detail=detail,
                suppressed=suppressed,
            )
        return False
