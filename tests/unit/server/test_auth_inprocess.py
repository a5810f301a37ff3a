"""queueflow.auth.mode=hmac through the in-process cluster (issue #12): members that hold the
secret work as before; forged, unsigned, re-signed-as-another-member and replayed control
messages on the request and coordinator topics are dropped (logged) and change nothing."""

from __future__ import annotations

from typing import Any

from inprocess_helpers import TOPIC, cluster_with, events, run
from structlog.testing import capture_logs

from queueflow.member.session import ShareFetchSession
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.credentials import Credentials, member_credential
from queueflow.protocol.envelope import topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.structs import TopicPartition

SECRET = "aT4-inprocess-9Xq_Lm2Vb7Nc5Zr8Kw3Hy6Jd1Pf0Gs"
GUESS = "gU3-guessed-secret-7Yt_Qw2Ex9Rz4Vb8Nm5Kc1Lp6"


def member(ns: str, secret: str = SECRET) -> ControlAuth:
    """A member's authenticator holding only the member credential of ``secret``."""
    creds = Credentials.from_member_credential(member_credential(secret, ns), ns)
    return ControlAuth(creds, role="member")


def worker(ns: str, secret: str) -> ControlAuth:
    return ControlAuth(Credentials.from_secret(secret, ns), f"{ns}/forger")


AUTH = {"auth_mode": "hmac", "auth_secret": SECRET}
TP0 = TopicPartition(TOPIC, 0)


def forged_fetch(
    member_id: str, request_id: int = 1, now_ms: int = 0, ticket: bytes = b""
) -> protocol.ShareFetchRequest:
    return protocol.ShareFetchRequest(
        group="g",
        topic=TOPIC,
        partition=0,
        member_id=member_id,
        request_id=request_id,
        reply_partition=0,
        max_records=100,
        deadline_ms=now_ms + 60_000,
        ticket=ticket,
    )


def test_members_with_the_secret_acquire_and_acknowledge() -> None:
    async def scenario() -> Any:
        async with cluster_with(3, **AUTH) as cluster:
            session = ShareFetchSession(cluster.member_context, "g", [TOPIC], "test")
            await session.start()
            fetched = await session.fetch(TP0, 10)
            await session.close()
            return fetched

    fetched = run(scenario())
    assert fetched.error is None and fetched.acquired == 3


def test_forged_and_replayed_requests_are_dropped() -> None:
    """Attack matrix rows 4-8: an unsigned fetch, one signed with a guessed secret, one signed
    by a key holder under another member's id, a replay of a valid signed request and an
    unsigned Fence(leader_epoch=999999): none acquires, none fences; the member still gets
    every record."""

    async def scenario() -> Any:
        async with cluster_with(3, **AUTH) as cluster:
            ns = cluster.app_id
            request_topic = topics.request_topic(ns, TOPIC)
            coordinator_topic = topics.coordinator_topic(ns)
            guessed = member(ns, GUESS)
            insider = member(ns)
            valid = member(ns)
            dest = topic_dest(request_topic, 0)
            # A genuine member's request: sealed with its key, with the ticket binding it.
            assert valid.reply_key is not None
            ticket = cluster.ticket("g", "m-x", reply_key=valid.reply_key.public)
            replayed = valid.seal(
                protocol.encode(forged_fetch("m-x", 7, cluster.clock.now_ms(), ticket)), dest
            )
            attacks = [
                (request_topic, protocol.encode(forged_fetch("m-x"))),
                (request_topic, guessed.seal(protocol.encode(forged_fetch("m-x")), dest)),
                # another member, with m-x's ticket: bound to m-x's key, not its own
                (
                    request_topic,
                    insider.seal(
                        protocol.encode(forged_fetch("m-x", 8, cluster.clock.now_ms(), ticket)),
                        dest,
                    ),
                ),
                (request_topic, protocol.encode(protocol.Fence(leader_epoch=999999))),
                (
                    request_topic,
                    worker(ns, GUESS).seal(
                        protocol.encode(protocol.Fence(leader_epoch=999999)), dest
                    ),
                ),
                (
                    coordinator_topic,
                    protocol.encode(
                        protocol.HeartbeatRequest(
                            group="g",
                            member_id="m-x",
                            member_epoch=0,
                            subscribed_topics=["nope"],
                            reply_partition=0,
                            request_id=1,
                        )
                    ),
                ),
            ]
            for topic, data in attacks:
                await cluster.bus.send(topic, 0, data, b"m-x")
            await cluster.bus.drain()
            # A valid request from m-x acquires once; the same bytes again are a replay.
            await cluster.bus.send(request_topic, 0, replayed, b"m-x")
            await cluster.bus.drain()
            engine = cluster.share_partition("g", TOPIC, 0)
            taken_by_replayed = engine.acquired_count
            await cluster.bus.send(request_topic, 0, replayed, b"m-x")
            await cluster.bus.drain()
            after_replay = engine.acquired_count
            groups = set(cluster.coordinator.groups)
            return taken_by_replayed, after_replay, groups

    with capture_logs() as logs:
        first, second, groups = run(scenario())
    # The one genuinely signed request, sent after the forged fences: the leader still serves.
    assert first == 3
    assert second == 3  # its replay acquired nothing more
    assert groups == set()  # the forged join created no group
    reasons = [e["error"] for e in events(logs, "undecodable_request")]
    assert len(reasons) == 4
    assert sum("(wrong_key)" in r for r in reasons) == 2
    assert sum("(wrong_member)" in r for r in reasons) == 1
    assert sum("(replay)" in r for r in reasons) == 1
    logged = [e["reason"] for e in events(logs, "undecodable_request")]
    assert sorted(logged) == ["replay", "wrong_key", "wrong_key", "wrong_member"]
    # Unsigned ones are dropped by their first byte, before the MAC check (prefilter).
    dropped = events(logs, "control_message_dropped")
    assert [e["reason"] for e in dropped] == ["unknown_format"] * 3
    assert sum(e["topic"].endswith("-share-coordinator") for e in dropped) == 1
    assert not events(logs, "undecodable_coordinator_request")
    assert not events(logs, "leader_fenced") and not events(logs, "leader_stepped_down")


def test_direct_path_with_hmac_serves_signed_members_and_drops_forged_frames() -> None:
    """Over the leader's TCP endpoint: a member with the secret long-polls as before; an
    unsigned frame, one signed with a guessed secret and one whose signed sender is not the
    member it names are dropped (connection closed, no answer, nothing acquired)."""
    from inprocess_helpers import direct_cluster, fetch

    from queueflow.member.direct import DirectClient, DirectPathError

    async def scenario() -> Any:
        async with direct_cluster(records=3, **AUTH) as cluster:
            assert cluster.endpoint is not None
            address = cluster.endpoint.address
            ns = cluster.app_id
            refused = []
            m1_ticket = cluster.ticket("g", "m1", reply_key=member(ns).reply_key.public)  # type: ignore[union-attr]
            for auth in (
                ControlAuth(None, role="member"),
                member(ns, GUESS),
                member(ns),  # another member, with m1's ticket (bound to m1's key)
            ):
                client = DirectClient(auth)
                try:
                    await client.call(address, fetch("m1", 1, ticket=m1_ticket), 0.5)
                except DirectPathError as exc:
                    refused.append(str(exc))
                await client.close()
            engine = cluster.share_partition("g", TOPIC, 0)
            forged_acquired = 0 if engine is None else engine.acquired_count
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            records = await consumer.poll(timeout_ms=2_000)
            await consumer.close()
            return refused, forged_acquired, [r.offset for r in records]

    with capture_logs() as logs:
        refused, forged_acquired, offsets = run(scenario())
    assert len(refused) == 3 and forged_acquired == 0
    assert offsets == [0, 1, 2]
    reasons = [e["error"] for e in events(logs, "undecodable_direct_request")]
    assert len(reasons) == 3
    assert any("(unsigned)" in r for r in reasons)
    assert any("(wrong_key)" in r for r in reasons)
    assert any("(wrong_member)" in r for r in reasons)
