"""Replies only their member can read and only the app's workers can write, and member requests
only the workers can read (queueflow.protocol.sealed_replies, queueflow.protocol.envelope): the
pure seal, then the real coordinator, leaders and members in process with ``hmac``, a reader of
the internal topics tapping every record."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, cluster_with, run

from queueflow.errors import ShareGroupError
from queueflow.member.session import ShareFetchSession
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import AuthenticationError, ReplayGuard, verify_ticket
from queueflow.protocol.credentials import Credentials
from queueflow.protocol.envelope import MEMBER_FORMAT, topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.protocol.sealed_replies import (
    SEALED_FORMAT,
    SEALED_FORMAT_V1,
    SEALED_OVERHEAD,
    ReplyKey,
    ReplySealer,
    reply_route,
)
from queueflow.structs import AcknowledgeType, TopicPartition
from queueflow.testing.inprocess import InProcessCluster

SECRET = "sR9-sealed-replies-4Tq_Wx7Ze2Vb5Nm8Lc3Hj6Pf1"
HMAC = {"auth_mode": "hmac", "auth_secret": SECRET}
TP0 = TopicPartition(TOPIC, 0)
WORKERS = Credentials.from_secret(SECRET, "app")
NOW = 1_700_000_000_000
DEST = "app-share-replies/3/r-abc"

# -- the seal, pure --------------------------------------------------------------------------


def sealer() -> ReplySealer:
    assert WORKERS.workers_private is not None
    return ReplySealer(WORKERS.workers_private, clock=lambda: NOW)


def guard() -> ReplayGuard:
    return ReplayGuard(window_ms=1_000, clock=lambda: NOW)


def test_a_sealed_reply_opens_only_with_its_members_key() -> None:
    member, other = ReplyKey(WORKERS.workers_public), ReplyKey(WORKERS.workers_public)
    reply = b'{"kind":"fetch_response","member_id":"m"}'
    sealed = sealer().seal(member.public, reply, DEST)
    assert sealed[0] == SEALED_FORMAT and len(sealed) > len(reply) + SEALED_OVERHEAD
    assert reply not in sealed and b"member_id" not in sealed and DEST.encode() not in sealed
    assert member.open(sealed, DEST, guard()) == reply
    with pytest.raises(AuthenticationError) as refused:
        other.open(sealed, DEST, guard())
    assert refused.value.reason == "bad_seal"
    # Each reply has its own nonce: the same reply twice looks different.
    assert sealer().seal(member.public, reply, DEST) != sealed


def test_a_reply_sealed_by_a_member_to_a_victims_key_is_refused() -> None:
    """An insider with a member credential knows the victim's public key (it was in the clear
    in v1 heartbeats) and can seal to it with a key pair of its own: the victim pins the
    workers' key, so the forged heartbeat answer (say member epoch 2**62) is ``bad_seal``."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    victim = ReplyKey(WORKERS.workers_public)
    forged = ReplySealer(X25519PrivateKey.generate(), clock=lambda: NOW).seal(
        victim.public, b"member epoch 2**62", DEST
    )
    with pytest.raises(AuthenticationError) as refused:
        victim.open(forged, DEST, guard())
    assert refused.value.reason == "bad_seal"


def test_sealed_replies_are_bound_to_their_destination_fresh_and_once() -> None:
    member = ReplyKey(WORKERS.workers_public)
    sealed = sealer().seal(member.public, b"r", DEST)
    g = guard()
    with pytest.raises(AuthenticationError) as refused:
        member.open(sealed, "app-share-replies/4/r-abc", g)
    assert refused.value.reason == "wrong_destination"
    assert member.open(sealed, DEST, g) == b"r"
    with pytest.raises(AuthenticationError) as refused:
        member.open(sealed, DEST, g)
    assert refused.value.reason == "replay"
    with pytest.raises(AuthenticationError) as refused:
        member.open(sealed, DEST, ReplayGuard(window_ms=1_000, clock=lambda: NOW + 5_000))
    assert refused.value.reason == "stale"


def test_unsealed_and_v1_replies_are_refused_and_a_bad_key_is_not_sealed_to() -> None:
    member = ReplyKey(WORKERS.workers_public)
    with pytest.raises(AuthenticationError) as refused:
        member.open(b'{"kind":"tick"}', DEST, guard())  # anyone could write that
    assert refused.value.reason == "unsigned"
    with pytest.raises(AuthenticationError) as refused:
        member.open(bytes((SEALED_FORMAT_V1,)) + bytes(80), DEST, guard())
    assert refused.value.reason == "envelope_v1"
    with pytest.raises(ValueError, match="32 bytes"):
        sealer().seal(b"short", b"x", DEST)
    with pytest.raises(ValueError):
        sealer().seal(bytes(32), b"x", DEST)  # a low-order point: no shared secret


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_no_altered_byte_of_a_sealed_reply_opens(data: st.DataObject) -> None:
    member = ReplyKey(WORKERS.workers_public)
    sealed = bytearray(sealer().seal(member.public, b"reply body", DEST))
    i = data.draw(st.integers(1, len(sealed) - 1))
    sealed[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(AuthenticationError):
        member.open(bytes(sealed), DEST, guard())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_sealed_looking_bytes_never_open(data: bytes) -> None:
    with pytest.raises(AuthenticationError):
        ReplyKey(WORKERS.workers_public).open(bytes((SEALED_FORMAT,)) + data, DEST, guard())


# -- in process ------------------------------------------------------------------------------


def tap(cluster: InProcessCluster, topic: str | None = None) -> list[tuple[bytes, bytes]]:
    """Every (key, value) sent to ``topic`` (default: the reply topic): what a process with
    READ on it sees."""
    seen: list[tuple[bytes, bytes]] = []
    bus = cluster.bus
    send = bus.send
    wanted = topic or bus.reply_topic

    async def tapped(topic: str, partition: int, value: bytes, key: bytes | None = None) -> None:
        if topic == wanted:
            seen.append((key or b"", value))
        await send(topic, partition, value, key)

    bus.send = tapped  # type: ignore[method-assign]
    return seen


def test_another_member_or_a_worker_envelope_opener_cannot_read_a_members_replies() -> None:
    """Attack matrix row 10: two members work end to end under ``hmac``; everything on the
    reply topic addressed to one of them is sealed to its own key: the other member's key, a
    worker's envelope opener and a plain decoder all fail on it."""

    async def scenario() -> Any:
        async with cluster_with(6, **HMAC) as cluster:
            replies = tap(cluster)
            a = ShareFetchSession(cluster.member_context, "g", [TOPIC], "a")
            b = ShareFetchSession(cluster.member_context, "g", [TOPIC], "b")
            await a.start()
            await b.start()
            got = await a.fetch(TP0, 6)
            for record in got.records:
                a.acknowledge(TP0, record.offset, AcknowledgeType.ACCEPT)
            error = await a.flush(TP0)
            spso = cluster.share_partition("g", TOPIC, 0).start_offset
            keys = {s.member_id: s._requester.reply_key for s in (a, b)}
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
    route = reply_route(a_key.public)
    to_a = [value for key, value in replies if key == route.encode()]
    worker = ControlAuth(Credentials.from_secret(SECRET, cluster.app_id), "worker")
    for value in to_a:
        assert value[0] == SEALED_FORMAT
        assert a_id.encode() not in value and tickets[a_id] not in value
        with pytest.raises(AuthenticationError):
            keys[b_id].open(value, "", ReplayGuard())  # type: ignore[union-attr]
        with pytest.raises(AuthenticationError):
            worker.open(value, "")  # the worker envelope keys open no sealed reply
        with pytest.raises(ShareGroupError):
            protocol.decode(value)
    assert to_a


def test_member_requests_reveal_neither_member_id_nor_reply_key() -> None:
    """Item 8 of the issue: a heartbeat or ShareFetch record's bytes contain neither the
    member id nor its reply key, so a reply's pseudonym can't be mapped to its member."""

    async def scenario() -> Any:
        async with cluster_with(3, **HMAC) as cluster:
            heartbeats = tap(cluster, topics.coordinator_topic(cluster.app_id))
            fetches = tap(cluster, topics.request_topic(cluster.app_id, TOPIC))
            a = ShareFetchSession(cluster.member_context, "g", [TOPIC], "a")
            await a.start()
            got = await a.fetch(TP0, 3)
            key = a._requester.reply_key
            await a.close()
            return heartbeats, fetches, a.member_id, key, got

    heartbeats, fetches, member_id, key, got = run(scenario())
    assert got.acquired == 3 and key is not None
    assert heartbeats and fetches
    members = [(k, v) for k, v in heartbeats + fetches if v[0] == MEMBER_FORMAT]
    assert len(members) >= 2  # (worker envelopes: ticks, fences, releases: signed, in the clear)
    for record_key, value in members:
        # The member's public key is in the clear header (the workers' ECDH needs it) and the
        # record key is its pseudonym; the member id is only inside the ciphertext.
        assert member_id.encode() not in value and member_id.encode() not in record_key
        assert record_key == reply_route(key.public).encode()
        assert b"heartbeat" not in value and b"fetch" not in value.replace(b"share-fetch", b"")


def test_the_ticket_binds_the_members_key_and_leaders_seal_to_it() -> None:
    async def scenario() -> Any:
        async with cluster_with(2, **HMAC) as cluster:
            replies = tap(cluster)
            a = ShareFetchSession(cluster.member_context, "g", [TOPIC], "a")
            await a.start()
            await a.fetch(TP0, 2)
            key, ticket = a._requester.reply_key, a._membership.ticket
            await a.close()
            return cluster, replies, key, ticket

    cluster, replies, key, ticket = run(scenario())
    assert key is not None
    t = verify_ticket(cluster.coordinator.ticket_key, ticket, now_ms=0)
    assert t.reply_key == key.public
    route = reply_route(key.public).encode()
    to_a = [v for k, v in replies if k == route]
    assert len(to_a) >= 2 and all(v[0] == SEALED_FORMAT for v in to_a)


def test_without_hmac_replies_stay_readable_as_before() -> None:
    """``none`` mode: no reply key, nothing sealed (the threat model in docs/operations.md)."""

    async def scenario() -> Any:
        async with cluster_with(2) as cluster:
            replies = tap(cluster)
            a = ShareFetchSession(cluster.member_context, "g", [TOPIC], "a")
            await a.start()
            got = await a.fetch(TP0, 2)
            await a.close()
            return replies, got, a._requester.reply_key

    replies, got, key = run(scenario())
    assert got.acquired == 2 and key is None
    assert all(protocol.decode(v) for _, v in replies)


def test_a_heartbeat_naming_another_key_than_its_own_is_refused() -> None:
    """A member can't have its answers and tickets bound to a key it didn't send with (a
    victim's): the heartbeat's reply key must be its envelope's key."""
    from inprocess_helpers import RawMember

    async def scenario() -> Any:
        async with cluster_with(0, **HMAC) as cluster:
            replies = tap(cluster)
            member = RawMember(cluster, "m")
            request = member.heartbeat_request(0)
            victim = ReplyKey(Credentials.from_secret(SECRET, cluster.app_id).workers_public)
            request.reply_key = victim.public
            auth = ControlAuth(Credentials.from_secret(SECRET, cluster.app_id), role="member")
            coordinator = topics.coordinator_topic(cluster.app_id)
            await cluster.bus.send(
                coordinator, 0, auth.seal(protocol.encode(request), topic_dest(coordinator, 0))
            )
            await cluster.bus.drain()
            return cluster, replies

    cluster, replies = run(scenario())
    assert replies == [] and not cluster.tables["groups"]  # unanswered, no member added


def test_direct_path_requests_and_answers_are_unreadable_on_the_wire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The direct path is plaintext TCP: under ``hmac`` its requests are encrypted to the
    workers' key and its answers sealed to the member's, so a reader of the connection learns
    neither member ids, tickets nor offsets."""
    from inprocess_helpers import direct_cluster

    from queueflow.member import direct
    from queueflow.protocol import framing
    from queueflow.server import endpoint

    frames: list[bytes] = []
    write = framing.write_frame

    def tapped(writer: Any, frame: bytes) -> None:
        frames.append(frame)
        write(writer, frame)

    monkeypatch.setattr(endpoint.framing, "write_frame", tapped)
    monkeypatch.setattr(direct.framing, "write_frame", tapped)

    async def scenario() -> Any:
        async with direct_cluster(records=4, **HMAC) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            records = await consumer.poll(timeout_ms=3_000)
            member_id = consumer.member_id or ""
            await consumer.close()
            return [r.offset for r in records], member_id

    offsets, member_id = run(scenario())
    assert offsets == [0, 1, 2, 3] and member_id
    answers = [f for f in frames if f[0] == SEALED_FORMAT]
    requests = [f for f in frames if f[0] != SEALED_FORMAT]
    assert answers and requests
    for frame in frames:
        assert member_id.encode() not in frame and b"fetch" not in frame


def test_credentials_of_one_secret_are_stable_and_secrets_differ() -> None:
    other = Credentials.from_secret(secrets.token_urlsafe(32), "app")
    assert Credentials.from_secret(SECRET, "app").workers_public == WORKERS.workers_public
    assert other.workers_public != WORKERS.workers_public
    assert Credentials.from_secret(SECRET, "app2").member_key != WORKERS.member_key


def test_a_heartbeat_for_a_live_member_id_from_another_key_is_a_refused_takeover() -> None:
    """Another member credential holder that learnt a victim's member id heartbeats under it
    with its own key (naming its own key as reply key, so the envelope check passes): the
    coordinator bound the id to the victim's key at its first heartbeat, so it is refused
    (``wrong_member``), and the victim keeps its assignment and fetches on."""
    from inprocess_helpers import events
    from structlog.testing import capture_logs

    async def scenario() -> Any:
        async with cluster_with(4, **HMAC) as cluster:
            victim = ShareFetchSession(cluster.member_context, "g", [TOPIC], "victim")
            await victim.start()
            epoch = victim._membership.member_epoch
            auth = ControlAuth(Credentials.from_secret(SECRET, cluster.app_id), role="member")
            assert auth.reply_key is not None
            takeover = protocol.HeartbeatRequest(
                group="g",
                member_id=victim.member_id,
                member_epoch=0,
                subscribed_topics=[TOPIC],
                reply_partition=0,
                request_id=1,
                reply_key=auth.reply_key.public,
            )
            coordinator = topics.coordinator_topic(cluster.app_id)
            sealed = auth.seal(protocol.encode(takeover), topic_dest(coordinator, 0))
            await cluster.bus.send(coordinator, 0, sealed)
            await cluster.bus.drain()
            got = await victim.fetch(TP0, 4)
            after = victim._membership.member_epoch
            await victim.close()
            return epoch, after, got

    with capture_logs() as logs:
        epoch, after, got = run(scenario())
    assert got.error is None and got.acquired == 4
    assert after == epoch  # no rejoin at epoch 0 took its place
    reasons = [e["reason"] for e in events(logs, "undecodable_coordinator_request")]
    assert reasons == ["wrong_member"]


def test_member_keys_bind_first_and_unbind_on_leave() -> None:
    from queueflow.server.coordinator.member_keys import MemberKeys

    keys = MemberKeys(max_members=2)
    assert keys.bind("g", "m", b"k1") and keys.bind("g", "m", b"k1")
    assert not keys.bind("g", "m", b"k2")  # a takeover
    assert not keys.bind("g", "m", b"k2", leaving=True)  # nor can another key make it leave
    assert keys.bind("g", "m", b"k1", leaving=True) and keys.bind("g", "m", b"k2")
    keys.bind("g", "a", b"x")
    keys.bind("g", "b", b"y")  # bounded: the least recently used is forgotten
    assert len(keys) == 2


def test_a_member_whose_requests_get_no_answer_names_its_key_id() -> None:
    """Item 8: a member with a credential the workers refuse (another app's or secret's key)
    waits in vain; its error says a refused credential is one cause and names its key id, to
    match with the workers' ``wrong_key`` log lines."""
    import asyncio

    from queueflow.member.transport import Requester
    from queueflow.protocol.credentials import member_credential

    class Silent:
        reply_partition = 0

        async def start(self, on_reply: Any) -> None:
            pass

        async def send(self, topic: str, partition: int, payload: bytes) -> None:
            pass

        async def close(self) -> None:
            pass

    creds = Credentials.from_member_credential(member_credential(SECRET, "app"), "app")
    requester = Requester(Silent(), "app", 20, ControlAuth(creds, role="member"))

    async def call() -> None:
        await requester.call("app-share-coordinator", 0, 1, b"{}")

    with pytest.raises(ShareGroupError) as info:
        asyncio.run(call())
    assert "credential" in str(info.value) and creds.member_key_id.hex() in str(info.value)
    assert "wrong_key" in str(info.value)
