"""Replies only their member can read (issue #12, queueflow.protocol.sealed_replies): the pure
seal, then the real coordinator, leaders and members in process with ``hmac``, a reader of the
reply topic tapping every reply."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, cluster_with, run

from queueflow.errors import ShareGroupError
from queueflow.member.session import ShareFetchSession
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import AuthenticationError, ControlAuth, verify_ticket
from queueflow.protocol.sealed_replies import (
    PUBLIC_KEY_BYTES,
    SEALED_FORMAT,
    SEALED_OVERHEAD,
    ReplyKey,
    ReplySealer,
    reply_route,
)
from queueflow.structs import AcknowledgeType, TopicPartition
from queueflow.testing.inprocess import InProcessCluster

SECRET = "test-secret"
HMAC = {"auth_mode": "hmac", "auth_secret": SECRET}
TP0 = TopicPartition(TOPIC, 0)

# -- the seal, pure --------------------------------------------------------------------------


def test_a_sealed_reply_opens_only_with_its_members_key() -> None:
    member, other, sealer = ReplyKey(), ReplyKey(), ReplySealer()
    reply = b'{"kind":"fetch_response","member_id":"m"}'
    sealed = sealer.seal(member.public, reply)
    assert sealed[0] == SEALED_FORMAT and len(sealed) == len(reply) + SEALED_OVERHEAD
    assert reply not in sealed and b"member_id" not in sealed
    assert member.open(sealed) == reply
    with pytest.raises(AuthenticationError) as refused:
        other.open(sealed)
    assert refused.value.reason == "bad_seal"
    # Each reply has its own nonce: the same reply twice looks different.
    assert sealer.seal(member.public, reply) != sealed


def test_an_unsealed_reply_passes_through_and_a_bad_key_is_refused() -> None:
    assert ReplyKey().open(b'{"kind":"tick"}') == b'{"kind":"tick"}'  # an earlier release's
    with pytest.raises(ValueError, match="32 bytes"):
        ReplySealer().seal(b"short", b"x")
    with pytest.raises(ValueError):
        ReplySealer().seal(bytes(32), b"x")  # a low-order point: no shared secret


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_no_altered_byte_of_a_sealed_reply_opens(data: st.DataObject) -> None:
    member = ReplyKey()
    sealed = bytearray(ReplySealer().seal(member.public, b"reply body"))
    i = data.draw(st.integers(1, len(sealed) - 1))
    sealed[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(AuthenticationError):
        member.open(bytes(sealed))


def test_a_sealed_reply_whose_sender_key_has_its_ignored_top_bit_flipped_does_not_open() -> None:
    # X25519 masks that bit, so the same AES key would be derived: refused by its encoding.
    member = ReplyKey()
    sealed = bytearray(ReplySealer().seal(member.public, b"reply body"))
    sealed[PUBLIC_KEY_BYTES] ^= 0x80  # the last byte of the sender's key (after the format byte)
    with pytest.raises(AuthenticationError):
        member.open(bytes(sealed))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_sealed_looking_bytes_never_open(data: bytes) -> None:
    with pytest.raises(AuthenticationError):
        ReplyKey().open(bytes((SEALED_FORMAT,)) + data)


# -- in process ------------------------------------------------------------------------------


def tap_replies(cluster: InProcessCluster) -> list[tuple[bytes, bytes]]:
    """Every (key, value) the servers write to the reply topic: what a process with READ on
    it sees."""
    seen: list[tuple[bytes, bytes]] = []
    bus = cluster.bus
    send = bus.send

    async def tapped(topic: str, partition: int, value: bytes, key: bytes | None = None) -> None:
        if topic == bus.reply_topic:
            seen.append((key or b"", value))
        await send(topic, partition, value, key)

    bus.send = tapped  # type: ignore[method-assign]
    return seen


def test_another_member_or_a_secret_holder_cannot_read_a_members_replies() -> None:
    """Attack matrix row 10: two members work end to end under ``hmac``; everything on the
    reply topic addressed to one of them is sealed to its own key: the other member's key, a
    worker's envelope key and a plain decoder all fail on it."""

    async def scenario() -> Any:
        async with cluster_with(6, **HMAC) as cluster:
            replies = tap_replies(cluster)
            a = ShareFetchSession(cluster.member_context, "g", [TOPIC], "a")
            b = ShareFetchSession(cluster.member_context, "g", [TOPIC], "b")
            await a.start()
            await b.start()
            got = await a.fetch(TP0, 6)
            for record in got.records:
                a.acknowledge(TP0, record.offset, AcknowledgeType.ACCEPT)
            error = await a.flush(TP0)
            spso = cluster.share_partition("g", TOPIC, 0).start_offset
            keys = {
                s.member_id: s._requester.reply_key
                for s in (a, b)  # the members' own key pairs
            }
            tickets = {s.member_id: s._membership.ticket for s in (a, b)}
            await a.close()
            await b.close()
            return cluster, replies, a.member_id, b.member_id, keys, tickets, got, error, spso

    cluster, replies, a_id, b_id, keys, tickets, got, error, spso = run(scenario())
    assert got.acquired == 6 and error is None and spso == 6  # members work end to end
    # Keyed by a pseudonym of each member's reply key, never by a member id.
    assert {key for key, _ in replies} == {
        reply_route(k.public).encode() for k in keys.values() if k is not None
    }
    a_key = keys[a_id]
    assert a_key is not None
    to_a = [value for key, value in replies if key == reply_route(a_key.public).encode()]
    kinds = set()
    worker = ControlAuth("hmac", SECRET, cluster.app_id, "worker")
    for value in to_a:
        assert value[0] == SEALED_FORMAT
        assert a_id.encode() not in value and tickets[a_id] not in value
        with pytest.raises(AuthenticationError):
            keys[b_id].open(value)  # type: ignore[union-attr]  # another member
        with pytest.raises(AuthenticationError):
            worker.open(value)  # the app secret opens no sealed reply
        with pytest.raises(ShareGroupError):
            protocol.decode(value)
        reply = protocol.decode(worker.open(a_key.open(value)))  # only its own key does
        assert getattr(reply, "member_id", None) == a_id
        kinds.add(reply.kind)
    assert {"heartbeat_response", "fetch_response"} <= kinds


def test_the_ticket_binds_the_members_reply_key_and_leaders_seal_to_it() -> None:
    async def scenario() -> Any:
        async with cluster_with(2, **HMAC) as cluster:
            replies = tap_replies(cluster)
            a = ShareFetchSession(cluster.member_context, "g", [TOPIC], "a")
            await a.start()
            await a.fetch(TP0, 2)
            key, ticket = a._requester.reply_key, a._membership.ticket
            await a.close()
            return cluster, replies, a.member_id, key, ticket

    cluster, replies, _a_id, key, ticket = run(scenario())
    assert key is not None
    t = verify_ticket(cluster.coordinator.ticket_key, ticket, now_ms=0)
    assert t.reply_key == key.public
    route = reply_route(key.public).encode()
    to_a = [v for k, v in replies if k == route]
    assert to_a and all(v[0] == SEALED_FORMAT for v in to_a)
    # the leader's answers among them, sealed to the ticket's key
    assert [v for v in to_a if b"fetch_response" in key.open(v)]


def test_without_hmac_replies_stay_readable_as_before() -> None:
    """``none`` mode: no reply key, nothing sealed (the threat model in docs/operations.md)."""

    async def scenario() -> Any:
        async with cluster_with(2) as cluster:
            replies = tap_replies(cluster)
            a = ShareFetchSession(cluster.member_context, "g", [TOPIC], "a")
            await a.start()
            got = await a.fetch(TP0, 2)
            await a.close()
            return replies, got, a._requester.reply_key

    replies, got, key = run(scenario())
    assert got.acquired == 2 and key is None
    assert all(protocol.decode(v) for _, v in replies)


def test_a_heartbeat_with_a_malformed_reply_key_is_refused_unsealed() -> None:
    from inprocess_helpers import RawMember

    async def scenario() -> Any:
        async with cluster_with(0, **HMAC) as cluster:
            replies = tap_replies(cluster)
            member = RawMember(cluster, "m")
            request = member.heartbeat_request(0)
            request.reply_key = b"\x01" * 5
            worker = ControlAuth("hmac", SECRET, cluster.app_id, "m")
            await cluster.bus.send(
                topics.coordinator_topic(cluster.app_id),
                0,
                worker.seal(protocol.encode(request)),
                b"m",
            )
            await cluster.bus.drain()
            return cluster, replies

    cluster, replies = run(scenario())
    [(_, value)] = replies
    answer = protocol.decode(ControlAuth("hmac", SECRET, cluster.app_id, "x").open(value))
    assert isinstance(answer, protocol.HeartbeatResponse)
    assert answer.error == "INVALID_REQUEST" and "32-byte X25519" in answer.error_message
    assert not cluster.tables["groups"]  # no member was added


def test_a_refusal_that_cannot_be_sealed_still_reaches_its_member() -> None:
    """A request whose ticket the leader can't verify has no reply key to seal to: the refusal
    goes unsealed, keyed by the member id, which the member reads too; it heartbeats and
    resends with a good ticket (rather than waiting out the request timeout)."""

    async def scenario() -> Any:
        async with cluster_with(2, **HMAC) as cluster:
            replies = tap_replies(cluster)
            a = ShareFetchSession(cluster.member_context, "g", [TOPIC], "a")
            await a.start()
            a._membership.ticket = b"\x00not a ticket"
            got = await a.fetch(TP0, 2)
            await a.close()
            return cluster, replies, a.member_id, got

    cluster, replies, a_id, got = run(scenario())
    assert got.error is None and got.acquired == 2
    [value] = [v for k, v in replies if k == a_id.encode()]
    refusal = protocol.decode(ControlAuth("hmac", SECRET, cluster.app_id, "x").open(value))
    assert isinstance(refusal, protocol.ShareFetchResponse)
    assert refusal.error == "UNKNOWN_MEMBER_ID" and refusal.acquired == []


def test_direct_path_answers_are_sealed_to_the_member_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The direct path is point-to-point plaintext TCP: under ``hmac`` its answers are sealed
    like the reply topic's, so a reader of the connection learns nothing either."""
    from inprocess_helpers import direct_cluster

    from queueflow.protocol import framing
    from queueflow.server import endpoint

    frames: list[bytes] = []
    write = framing.write_frame

    def tapped(writer: Any, frame: bytes) -> None:  # both ends' frames
        frames.append(frame)
        write(writer, frame)

    monkeypatch.setattr(endpoint.framing, "write_frame", tapped)

    async def scenario() -> Any:
        async with direct_cluster(records=4, **HMAC) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            records = await consumer.poll(timeout_ms=3_000)
            await consumer.close()
            return cluster, [r.offset for r in records]

    cluster, offsets = run(scenario())
    assert offsets == [0, 1, 2, 3]
    # Frames both ways went through the tap: the member's requests are signed, not sealed;
    # every answer is sealed.
    worker = ControlAuth("hmac", SECRET, cluster.app_id, "worker")
    answers = [f for f in frames if f[0] == SEALED_FORMAT]
    requests = [protocol.decode_binary(worker.open(f)) for f in frames if f[0] != SEALED_FORMAT]
    assert answers and requests
    # (each connection opens with a ShareFetchCancel for no request: docs/operations.md, "The
    # direct port's limits")
    assert all(
        isinstance(r, protocol.ShareFetchRequest)
        or (isinstance(r, protocol.ShareFetchCancel) and r.request_id == -1)
        for r in requests
    )
    for frame in answers:
        with pytest.raises(AuthenticationError):
            ReplyKey().open(frame)
