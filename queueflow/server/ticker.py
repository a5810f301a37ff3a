"""Clock ticks into the request partitions this worker owns.

Timed work (acquisition-lock expiry, member session expiry) must change state inside a stream
event of the partition that owns it, as every other state change does. The ticker therefore
appends a :class:`~queueflow.protocol.messages.Tick` to each owned request partition and the
coordinator partition; the leader and coordinator do the timed work when they read it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

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
    """

    def __init__(self, ctx: ServerContext, leaders: Mapping[str, ShareLeader]) -> None:
        self.ctx = ctx
        self.leaders = leaders
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

    async def tick(self) -> None:
        """Send one tick to every owned request partition with Acquired records (called every
        ``queueflow.lock.check.interval.ms``; a partition with no lock to expire costs nothing
        while idle) and, every half heartbeat interval, to the coordinator partition."""
        names = self.request_topics()
        by_request_topic = {
            topics.request_topic(self.ctx.app_id, t): leader for t, leader in self.leaders.items()
        }
        payload = protocol.encode(protocol.Tick(sent_ms=self.ctx.clock.now_ms()))
        seal = self._auth.seal
        coordinator = topics.coordinator_topic(self.ctx.app_id)
        self._ticks += 1
        for tp in self.ctx.runtime.assigned():
            leader = by_request_topic.get(tp.topic)
            if leader is not None and not leader.has_acquired(tp.partition):
                continue
            if tp.topic == coordinator and self._ticks % self.coordinator_every:
                continue
            if tp.topic in names:
                with contextlib.suppress(asyncio.CancelledError):
                    sealed = seal(payload, topic_dest(tp.topic, tp.partition))
                    await self.ctx.sender.send(tp.topic, tp.partition, sealed)
