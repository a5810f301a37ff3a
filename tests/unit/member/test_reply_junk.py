"""A member's reply reader under a flood of junk keyed to it: every junk reply costs a look at
its first bytes (or one failed decryption), a counter and at most 20 log lines per 10 s; the
answer it waits for, behind the junk, still resolves its request."""

from __future__ import annotations

import asyncio
import os
import time

from structlog.testing import capture_logs

from queueflow.member.transport import Requester
from queueflow.metrics import Metrics
from queueflow.protocol import messages as protocol
from queueflow.protocol.auth import ControlAuth
from queueflow.protocol.sealed_replies import ReplyKey, ReplySealer
from queueflow.protocol.topics import REPLY_PARTITIONS

SECRET = "k" * 43
JUNK = 100_000


class Loopback:
    """A transport whose replies the test hands to ``on_reply`` itself."""

    reply_partition = REPLY_PARTITIONS - 1

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def start(self, on_reply: object) -> None:
        return None

    async def send(self, topic: str, partition: int, payload: bytes) -> None:
        self.sent.append(payload)

    async def close(self) -> None:
        return None


def test_a_flood_of_junk_replies_costs_little_and_the_awaited_answer_still_comes() -> None:
    metrics = Metrics()
    key = ReplyKey()
    requester = Requester(
        Loopback(),
        "app",
        5000,
        ControlAuth("hmac", SECRET, "app", "m-1"),
        key,
        metrics=metrics,
    )
    server = ControlAuth("hmac", SECRET, "app", "app/leader")
    answer = ReplySealer().seal(
        key.public,
        server.seal(
            protocol.encode(
                protocol.HeartbeatResponse(member_id="m-1", member_epoch=1, request_id=1)
            )
        ),
    )
    junk = [os.urandom(64) for _ in range(256)]

    async def scenario() -> tuple[protocol.Message, float]:
        call = asyncio.ensure_future(requester.call("t", 0, 1, b"{}"))
        await asyncio.sleep(0)
        start = time.perf_counter()
        for i in range(JUNK):
            requester.on_reply(junk[i % len(junk)])
        elapsed = time.perf_counter() - start
        requester.on_reply(answer)
        return await asyncio.wait_for(call, 5), elapsed

    with capture_logs() as logs:
        reply, elapsed = asyncio.run(scenario())
    assert isinstance(reply, protocol.HeartbeatResponse) and reply.request_id == 1
    # 100k junk replies well within the few seconds a flood of them may take to arrive.
    assert elapsed < 5.0, f"{JUNK} junk replies took {elapsed:.1f} s"
    lines = [e for e in logs if e["event"] == "undecodable_reply"]
    assert len(lines) <= 20
    assert requester.junk.total == JUNK
    counted = sum(
        sample.value
        for metric in metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "queueflow_control_messages_dropped_total"
        and sample.labels["receiver"] == "member"
    )
    assert counted == JUNK
