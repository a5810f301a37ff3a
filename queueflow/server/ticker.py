"""Clock ticks into the request partitions this worker owns.

Timed work (acquisition-lock expiry, member session expiry) must change state inside a stream
event of the partition that owns it, as every other state change does. The ticker therefore
appends a :class:`~queueflow.protocol.messages.Tick` to each owned request partition and the
coordinator partition; the leader and coordinator do the timed work when they read it.

Idle, it costs nothing per lock check interval: :meth:`LeaderTicker.run` ticks every
``queueflow.lock.check.interval.ms`` only while a led share-partition holds Acquired records,
and otherwise sleeps until a leader changes state (``ServerContext.state_changed``: a lock can
only be taken by a result a leader applies) or the next coordinator tick is due. Coordinator
ticks go only to the owned coordinator partitions that serve a share group (loaded, or with an
admin request pending): a tick of one without has nothing to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping

from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.envelope import topic_dest
from queueflow.server.context import ServerContext
from queueflow.server.leader import ShareLeader
from queueflow.server.transport import control_auth

__all__ = ["LeaderTicker"]


class LeaderTicker:
    """Sends ticks into the owned request partitions of the given source topics.

    Args:
        ctx: the server context (its runtime says which partitions this worker owns).
        leaders: a live view of this worker's leaders by source topic, read at every tick.
        coordinator_groups: the share groups the coordinator has loaded or has admin requests
            pending for (read at every coordinator tick): only their coordinator partitions
            are ticked. ``None``: every owned coordinator partition is.
    """

    def __init__(
        self,
        ctx: ServerContext,
        leaders: Mapping[str, ShareLeader],
        coordinator_groups: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.leaders = leaders
        self.coordinator_groups = coordinator_groups
        self._auth = control_auth(ctx, "ticker")
        # Sessions last many heartbeat intervals: the coordinator is ticked every half
        # heartbeat interval, not every lock check (which idle leaders would pay for).
        settings = ctx.settings
        self.coordinator_every = max(
            1, settings.heartbeat_interval_ms // 2 // settings.lock_check_interval_ms
        )
        self._ticks = 0

    def request_topics(self) -> set[str]:
        """The request topics that get ticks: each led topic's and the coordinator's."""
        names = {topics.request_topic(self.ctx.app_id, t) for t in self.leaders}
        names.add(topics.coordinator_topic(self.ctx.app_id))
        return names

    def locks_held(self) -> bool:
        """True if an owned request partition has a share-partition with Acquired records."""
        by_request_topic = {
            topics.request_topic(self.ctx.app_id, t): leader for t, leader in self.leaders.items()
        }
        for tp in self.ctx.runtime.assigned():
            leader = by_request_topic.get(tp.topic)
            if leader is not None and leader.has_acquired(tp.partition):
                return True
        return False

    async def run(self) -> None:
        """Tick until cancelled: every ``queueflow.lock.check.interval.ms`` while
        :meth:`locks_held`; otherwise only when the coordinator tick is due (every
        :attr:`coordinator_every` intervals), waking early when ``ctx.state_changed`` is set
        (then the periodic ticks resume if a lock is held)."""
        clock = self.ctx.clock
        interval_s = self.ctx.settings.lock_check_interval_ms / 1000
        changed = self.ctx.state_changed
        idle_since: float | None = None  # when the current idle wait began (monotonic s)
        while True:
            changed.clear()  # a change from here on wakes the idle wait below
            if self.locks_held():
                if idle_since is not None:  # the lock checks slept through count as ticks
                    self._ticks += self._slept(idle_since, interval_s)
                    idle_since = None
                await asyncio.sleep(interval_s)
                await self.tick()
                continue
            if idle_since is None:
                idle_since = clock.monotonic()
            skip = self._until_coordinator()
            left = (skip + 1) * interval_s - (clock.monotonic() - idle_since)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), max(left, 0.0))
            if clock.monotonic() - idle_since >= (skip + 1) * interval_s:
                self._ticks += skip  # the coordinator's pace holds through the idle time
                idle_since = None
                await self.tick()

    def _until_coordinator(self) -> int:
        """Lock checks before the tick that also ticks the coordinator."""
        return self.coordinator_every - 1 - self._ticks % self.coordinator_every

    def _slept(self, since: float, interval_s: float) -> int:
        """Whole lock check intervals since ``since``, at most up to the coordinator tick."""
        slept = int((self.ctx.clock.monotonic() - since) / interval_s)
        return min(slept, self._until_coordinator())

    async def tick(self) -> None:
        """Send one tick to every owned request partition with Acquired records (called every
        ``queueflow.lock.check.interval.ms`` while there are; a partition with no lock to
        expire costs nothing) and, every half heartbeat interval, to the owned coordinator
        partitions serving a share group."""
        names = self.request_topics()
        by_request_topic = {
            topics.request_topic(self.ctx.app_id, t): leader for t, leader in self.leaders.items()
        }
        payload = protocol.encode(protocol.Tick(sent_ms=self.ctx.clock.now_ms()))
        seal = self._auth.seal
        coordinator = topics.coordinator_topic(self.ctx.app_id)
        self._ticks += 1
        serving = self._coordinator_partitions()
        for tp in self.ctx.runtime.assigned():
            leader = by_request_topic.get(tp.topic)
            if leader is not None and not leader.has_acquired(tp.partition):
                continue
            if tp.topic == coordinator and (
                self._ticks % self.coordinator_every
                or (serving is not None and tp.partition not in serving)
            ):
                continue
            if tp.topic in names:
                with contextlib.suppress(asyncio.CancelledError):
                    sealed = seal(payload, topic_dest(tp.topic, tp.partition))
                    await self.ctx.sender.send(tp.topic, tp.partition, sealed)

    def _coordinator_partitions(self) -> set[int] | None:
        """The coordinator partitions serving a loaded share group (None: all of them)."""
        if self.coordinator_groups is None:
            return None
        return {self.ctx.coordinator_partition(g) for g in self.coordinator_groups()}
