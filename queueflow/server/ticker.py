"""Clock ticks into the request partitions this worker owns.

Timed work (acquisition-lock expiry, member session expiry) must change state inside a stream
event of the partition that owns it, as every other state change does. The ticker therefore
appends a :class:`~queueflow.protocol.messages.Tick` to each owned request partition and the
coordinator partition; the leader and coordinator do the timed work when they read it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.server.context import ServerContext

__all__ = ["LeaderTicker"]


class LeaderTicker:
    """Sends ticks into the owned request partitions of the given source topics.

    Args:
        ctx: the server context (its runtime says which partitions this worker owns).
        source_topics: a live view of the source topics this worker leads (e.g. the keys of
            the leaders' dict), read at every tick.
    """

    def __init__(self, ctx: ServerContext, source_topics: Iterable[str]) -> None:
        self.ctx = ctx
        self.source_topics = source_topics

    def request_topics(self) -> set[str]:
        """The request topics that get ticks: each led topic's and the coordinator's."""
        names = {topics.fetch_topic(self.ctx.namespace, t) for t in self.source_topics}
        names.add(topics.coordinator_topic(self.ctx.namespace))
        return names

    async def tick(self) -> None:
        """Send one tick to every owned request partition (called every
        ``queueflow.lock.check.interval.ms``)."""
        names = self.request_topics()
        payload = protocol.encode(protocol.Tick(sent_ms=self.ctx.clock.now_ms()))
        for tp in self.ctx.runtime.assigned():
            if tp.topic in names:
                with contextlib.suppress(asyncio.CancelledError):
                    await self.ctx.sender.send(tp.topic, tp.partition, payload)
