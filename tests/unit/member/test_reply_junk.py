"""A member's reply reader under a flood of junk keyed to it: every junk reply costs a look at
its first bytes (or one failed decryption), a counter and at most 20 log lines per 10 s; the
answer it waits for, behind the junk, still resolves its request."""

from __future__ import annotations

import asyncio
import os

from structlog.testing import capture_logs

from queueflow.member.transport import Requester
from queueflow.metrics import Metrics
from queueflow.protocol import messages as protocol
from queueflow.protocol.credentials import Credentials
from queueflow.protocol.envelope import reply_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.protocol.sealed_replies import SEALED_FORMAT, reply_route
from queueflow.protocol.topics import REPLY_PARTITIONS, reply_topic

SECRET = "rJ4-reply-junk-secret-7Wq_Ze2Rx8Vn5Bm9Lc3Hj"
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
    creds = Credentials.from_secret(SECRET, "app")
    member = ControlAuth(creds, role="member")
    requester = Requester(Loopback(), "app", 5000, member, metrics=metrics)
    assert member.reply_key is not None
    public = member.reply_key.public
    server = ControlAuth(creds, "app/leader")
    answer = server.seal_reply(
        public,
        protocol.encode(protocol.HeartbeatResponse(member_id="m-1", member_epoch=1, request_id=1)),
        reply_dest(reply_topic("app"), Loopback.reply_partition, reply_route(public)),
    )
    # Random bytes, and random bytes behind the sealed format byte (one failed decryption each)
    junk = [os.urandom(64) for _ in range(128)]
    junk += [bytes((SEALED_FORMAT,)) + os.urandom(80) for _ in range(128)]

    async def scenario() -> protocol.Message:
        call = asyncio.ensure_future(requester.call("t", 0, 1, b"{}"))
        await asyncio.sleep(0)
        for i in range(JUNK):
            requester.on_reply(junk[i % len(junk)])
        requester.on_reply(answer)
        return await asyncio.wait_for(call, 5)

    with capture_logs() as logs:
        reply = asyncio.run(scenario())
    assert isinstance(reply, protocol.HeartbeatResponse) and reply.request_id == 1
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
