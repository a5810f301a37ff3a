"""Members prove who they are (issue #12 item 2): the coordinator's assignment tickets and the
leaders' check of them (queueflow.server.tickets), on the pure gate and through the in-process
cluster with the real coordinator, leaders and members.

Each refusal leaves the share-partition's state as it was, is counted in
``queueflow_ticket_refusals`` and logged (``share_fetch_refused``)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, RawMember, cluster_with, events, run
from structlog.testing import capture_logs

from queueflow.engine.group import ShareGroup
from queueflow.errors import ErrorCode
from queueflow.kafka.config import KafkaClientConfig
from queueflow.member.session import ShareFetchSession
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import issue_ticket, ticket_key, verify_ticket
from queueflow.protocol.credentials import Credentials
from queueflow.protocol.envelope import topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.server import tickets as tickets_module
from queueflow.server.tickets import TicketGate
from queueflow.structs import AcknowledgeType, TopicPartition
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

KEY = ticket_key("hmac", "s3cret", "app")
NOW = 1_700_000_000_000
ACCEPT = int(AcknowledgeType.ACCEPT)
SECRET = "tK5-tickets-secret-8Wq_Ze3Rx7Vn2Bm9Lc4Hj6Pf1"
HMAC = {"auth_mode": "hmac", "auth_secret": SECRET}


def ticket(
    member: str = "m",
    epoch: int = 3,
    partitions: tuple[tuple[str, int], ...] = (("t", 0),),
    group: str = "g",
    ttl_ms: int = 45_000,
    key: bytes = KEY,
) -> bytes:
    return issue_ticket(
        key,
        group=group,
        member_id=member,
        member_epoch=epoch,
        partitions=partitions,
        ttl_ms=ttl_ms,
        now_ms=NOW,
    )


def check(gate: TicketGate, raw: bytes, *, member: str = "m", partition: int = 0, **kw: Any) -> Any:
    kw.setdefault("acquiring", True)
    refusal = gate.check(
        kw.pop("group", "g"), member, raw, kw.pop("now", NOW), topic="t", partition=partition, **kw
    )
    return None if refusal is None else (refusal.code, refusal.reason)


# -- the gate, pure --------------------------------------------------------------------------


def test_a_valid_ticket_passes_and_is_verified_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = tickets_module.verify_ticket

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tickets_module, "verify_ticket", counting)
    gate = TicketGate(KEY)
    raw = ticket()
    for _ in range(1000):
        assert check(gate, raw) is None
    assert len(calls) == 1 and gate.cached == 1


@pytest.mark.parametrize(
    ("raw", "member", "group", "expected"),
    [
        (b"", "m", "g", (ErrorCode.UNKNOWN_MEMBER_ID, "missing")),
        (ticket(key=ticket_key("hmac", "guess", "app")), "m", "g", "bad_ticket"),
        (ticket(key=ticket_key("none", "", "app")), "m", "g", "bad_ticket"),
        (ticket(key=ticket_key("hmac", "s3cret", "other-app")), "m", "g", "bad_ticket"),
        (b"\x00" * 10, "m", "g", "bad_ticket"),
        (ticket(member="victim"), "m", "g", "wrong_member"),
        (ticket(group="other"), "m", "g", "wrong_group"),
    ],
    ids=["missing", "guessed-secret", "none-key", "other-app", "short", "member", "group"],
)
def test_membership_refusals_refuse_acknowledgements_too(
    raw: bytes, member: str, group: str, expected: Any
) -> None:
    if isinstance(expected, str):
        expected = (ErrorCode.UNKNOWN_MEMBER_ID, expected)
    gate = TicketGate(KEY)
    assert check(gate, raw, member=member, group=group) == expected
    assert check(gate, raw, member=member, group=group, acquiring=False) == expected


def test_an_altered_ticket_is_refused() -> None:
    raw = bytearray(ticket(partitions=(("t", 0),)))
    body = msgspec.msgpack.decode(bytes(raw[32:]))
    body[3] = [["t", 0], ["t", 1]]  # grant itself another share-partition
    forged = bytes(raw[:32]) + msgspec.msgpack.encode(body)
    assert check(TicketGate(KEY), forged, partition=1) == (
        ErrorCode.UNKNOWN_MEMBER_ID,
        "bad_ticket",
    )


def test_optional_tickets_let_requests_without_one_through_but_check_the_others() -> None:
    gate = TicketGate(KEY, required=False)
    assert check(gate, b"") is None
    assert check(gate, ticket(member="victim")) == (ErrorCode.UNKNOWN_MEMBER_ID, "wrong_member")


def test_an_expired_ticket_acquires_nothing_but_its_member_may_still_acknowledge() -> None:
    gate = TicketGate(KEY)
    raw = ticket(ttl_ms=10_000)
    later = NOW + 10_000
    assert check(gate, raw, now=later) == (ErrorCode.UNKNOWN_MEMBER_ID, "expired")
    assert check(gate, raw, now=later, acquiring=False) is None
    assert check(gate, raw, now=later - 1) is None


def test_an_older_epoch_is_fenced_for_acquisition_once_a_newer_one_was_seen() -> None:
    gate = TicketGate(KEY)
    old, new = ticket(epoch=3), ticket(epoch=4)
    assert check(gate, old) is None
    assert check(gate, new) is None
    assert check(gate, old) == (ErrorCode.FENCED_MEMBER_EPOCH, "fenced_epoch")
    # An acknowledgement sent with the older ticket (in flight when the epoch moved) applies.
    assert check(gate, old, acquiring=False) is None
    # Another member's epochs are its own.
    assert check(gate, ticket(member="n", epoch=1), member="n") is None


def test_a_share_partition_not_in_the_ticket_acquires_nothing_but_held_records_acknowledge() -> (
    None
):
    gate = TicketGate(KEY)
    raw = ticket(partitions=(("t", 0),))
    assert check(gate, raw, partition=1) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "not_assigned")
    assert check(gate, raw, partition=1, acquiring=False) is None


def test_a_removed_member_is_refused_until_it_rejoins_at_a_higher_epoch() -> None:
    gate = TicketGate(KEY)
    assert check(gate, ticket(epoch=3)) is None
    gate.remove("g", "m", 0, 4)
    removed = (ErrorCode.UNKNOWN_MEMBER_ID, "removed")
    assert check(gate, ticket(epoch=3)) == removed
    assert check(gate, ticket(epoch=4), acquiring=False) == removed
    assert check(gate, ticket(epoch=3, partitions=(("t", 0), ("t", 1))), partition=1) is None
    assert check(gate, ticket(epoch=5)) is None  # rejoined
    gate.remove("g", "m", 0, -1)  # epoch unknown: fences nothing more
    assert check(gate, ticket(epoch=5)) is None


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_never_pass_the_gate(data: bytes) -> None:
    refusal = TicketGate(KEY).check("g", "m", data, NOW, topic="t", partition=0, acquiring=True)
    assert refusal is not None and refusal.code is ErrorCode.UNKNOWN_MEMBER_ID


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_no_single_byte_change_of_a_ticket_passes(data: st.DataObject) -> None:
    raw = bytearray(ticket())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    refusal = TicketGate(KEY).check(
        "g", "m", bytes(raw), NOW, topic="t", partition=0, acquiring=False
    )
    assert refusal is not None and refusal.reason == "bad_ticket"


def test_group_epochs_never_go_back_after_a_coordinator_lost_its_last_writes() -> None:
    group = ShareGroup("g", 45_000, 100)
    group.heartbeat("a", 0, ["t"], 0, {"t": 2})
    assert group.group_epoch == 1
    # The durable copy said epoch 1, but the previous coordinator had issued 7.
    result = group.heartbeat("a", 7, ["t"], 1, {"t": 2})
    assert result.member_epoch == 8 and group.group_epoch == 8
    # An absurd epoch is not believed.
    assert group.heartbeat("a", 2**40, ["t"], 2, {"t": 2}).member_epoch == 8


# -- through the in-process cluster ----------------------------------------------------------


def refusals(cluster: InProcessCluster, reason: str) -> float:
    value = cluster.metrics.registry.get_sample_value(
        "queueflow_ticket_refusals_total", {"topic": TOPIC, "reason": reason}
    )
    return value or 0.0


async def raw_fetch(
    member: RawMember, partition: int, max_records: int, ticket: bytes, **kw: Any
) -> protocol.ShareFetchResponse:
    request = member.fetch_request(partition, max_records, **kw)
    request.ticket = ticket
    request_topic = topics.request_topic(member.cluster.app_id, TOPIC)
    reply = await member.call(request_topic, partition, request)
    assert isinstance(reply, protocol.ShareFetchResponse)
    return reply


def test_the_coordinator_issues_a_ticket_of_the_members_epoch_and_assignment() -> None:
    async def scenario() -> Any:
        async with cluster_with(0, partitions=2) as cluster:
            a = RawMember(cluster, "a")
            joined = await a.heartbeat(0)
            return cluster, joined

    cluster, joined = run(scenario())
    t = verify_ticket(cluster.coordinator.ticket_key, joined.ticket, now_ms=cluster.clock.now_ms())
    assert (t.group, t.member_id, t.member_epoch) == ("g", "a", joined.member_epoch)
    assert t.partitions == ((TOPIC, 0), (TOPIC, 1))
    assert t.expires_ms == cluster.clock.now_ms() + cluster.settings.session_timeout_ms


def test_a_member_id_that_never_joined_acquires_nothing_and_creates_no_state() -> None:
    """Attack matrix row 4 (issue #12: 495 records acquired, then ACCEPTed, by an id that
    never joined)."""

    async def scenario() -> Any:
        async with cluster_with(5) as cluster:
            stranger = RawMember(cluster, "m-never-joined")
            plain = await raw_fetch(stranger, 0, 100, b"")
            # a ticket it made up: right shape, wrong key (none mode: anyone with the app id
            # could compute it; hmac mode: see the test below)
            made_up = issue_ticket(
                ticket_key("hmac", "guess", cluster.app_id),
                group="g",
                member_id="m-never-joined",
                member_epoch=1,
                partitions=[(TOPIC, 0)],
                ttl_ms=60_000,
                now_ms=cluster.clock.now_ms(),
            )
            acked = await raw_fetch(stranger, 0, 100, made_up, acks=[(0, 4, (ACCEPT,))])
            return cluster, plain, acked

    with capture_logs() as logs:
        cluster, plain, acked = run(scenario())
    assert plain.error == ErrorCode.UNKNOWN_MEMBER_ID.value and plain.acquired == []
    assert "no assignment ticket" in plain.error_message
    assert acked.error == acked.ack_error == ErrorCode.UNKNOWN_MEMBER_ID.value
    assert cluster.share_partition("g", TOPIC, 0) is None  # nothing loaded or created
    assert not cluster.tables[TOPIC]
    assert refusals(cluster, "missing") == 1 and refusals(cluster, "bad_ticket") == 1
    assert [e["reason"] for e in events(logs, "share_fetch_refused")] == ["missing", "bad_ticket"]


def test_forged_acknowledgements_under_a_live_members_id_change_nothing() -> None:
    """Attack matrix row 5 under hmac, from a key holder (the envelope is signed as the victim,
    so only the ticket can tell): with another member's ticket, or the victim's ticket
    altered, ACCEPT and REJECT are refused; the victim's own acknowledgements then apply."""

    async def scenario() -> Any:
        async with cluster_with(4, **HMAC) as cluster:
            victim = ShareFetchSession(cluster.member_context, "g", [TOPIC], "victim")
            await victim.start()
            tp = TopicPartition(TOPIC, 0)
            got = await victim.fetch(tp, 4)
            assert got.acquired == 4
            ns = cluster.app_id
            request_topic = topics.request_topic(ns, TOPIC)
            # another holder of the member key: its own key pair, the victim's member id
            as_victim = ControlAuth(Credentials.from_secret(SECRET, ns), role="member")
            other_ticket = cluster.ticket("g", "m-attacker")  # valid, but not the victim's
            real = bytearray(victim._membership.ticket)
            real[-1] ^= 1  # altered
            for forged_ticket in (b"", other_ticket, bytes(real)):
                forged = protocol.ShareFetchRequest(
                    group="g",
                    topic=TOPIC,
                    partition=0,
                    member_id=victim.member_id,
                    request_id=10_000,
                    reply_partition=1,  # its answers go where the victim doesn't look
                    max_records=0,
                    acks=[(0, 1, (int(AcknowledgeType.REJECT),)), (2, 3, (ACCEPT,))],
                    deadline_ms=cluster.clock.now_ms() + 60_000,
                    ticket=forged_ticket,
                )
                await cluster.bus.send(
                    request_topic,
                    0,
                    as_victim.seal(protocol.encode(forged), topic_dest(request_topic, 0)),
                    b"attacker",
                )
            await cluster.bus.drain()
            engine = cluster.share_partition("g", TOPIC, 0)
            held = engine.acquired_count
            for offset in range(4):
                victim.acknowledge(tp, offset, AcknowledgeType.ACCEPT)
            error = await victim.flush(tp)
            start = engine.start_offset
            await victim.close()
            return cluster, held, error, start

    with capture_logs() as logs:
        _cluster, held, error, start = run(scenario())
    assert held == 4  # the forgeries changed nothing
    assert error is None and start == 4  # the victim's own ACCEPTs applied
    # Without a ticket, or with another member's: the key they came with is not the one the
    # coordinator bound to the victim's id (refused unread); an altered ticket: by the gate.
    reasons = sorted(e["reason"] for e in events(logs, "share_fetch_refused"))
    assert reasons == ["bad_ticket"]
    refused = sorted(e["reason"] for e in events(logs, "undecodable_request"))
    assert refused == ["wrong_member", "wrong_member"]


def test_a_stale_epoch_ticket_acquires_nothing_but_its_acknowledgements_apply() -> None:
    async def scenario() -> Any:
        async with cluster_with(6, partitions=1) as cluster:
            a = RawMember(cluster, "a")
            first = await a.heartbeat(0)
            old = first.ticket
            taken = await raw_fetch(a, 0, 2, old)
            b = RawMember(cluster, "b")
            await b.heartbeat(0)  # the group epoch moves on
            newer = await a.heartbeat(first.member_epoch)
            assert newer.member_epoch > first.member_epoch
            fresh = await raw_fetch(a, 0, 1, newer.ticket)
            stale = await raw_fetch(a, 0, 3, old, acks=[(0, 1, (ACCEPT,))])
            engine = cluster.share_partition("g", TOPIC, 0)
            return cluster, taken, fresh, stale, engine.start_offset, engine.acquired_count

    cluster, taken, fresh, stale, spso, acquired = run(scenario())
    assert taken.acquired == [(0, 1, 1)] and fresh.acquired == [(2, 2, 1)]
    assert stale.error == ErrorCode.FENCED_MEMBER_EPOCH.value and stale.acquired == []
    assert stale.ack_error == ErrorCode.NONE.value  # records it holds: acknowledged
    assert (spso, acquired) == (2, 1)
    assert refusals(cluster, "fenced_epoch") == 1


def test_an_unassigned_share_partition_acquires_nothing_but_records_held_there_acknowledge() -> (
    None
):
    """KIP-932: a member may acknowledge what it acquired until the lock ends, even after its
    share-partition moved to another member."""

    async def scenario() -> Any:
        async with cluster_with(8, partitions=2) as cluster:
            a = RawMember(cluster, "a")
            first = await a.heartbeat(0)  # alone: both share-partitions
            held = [await raw_fetch(a, p, 2, first.ticket) for p in (0, 1)]
            b = RawMember(cluster, "b")
            b_joined = await b.heartbeat(0)
            a_now = await a.heartbeat(first.member_epoch)
            mine = set(a_now.assignment.get(TOPIC, []))
            theirs = set(b_joined.assignment.get(TOPIC, []))
            assert mine and theirs and not mine & theirs
            lost = theirs.pop()
            refused = await raw_fetch(a, lost, 5, a_now.ticket)
            acks = await raw_fetch(a, lost, 0, a_now.ticket, acks=[(0, 1, (ACCEPT,))])
            return cluster, held, refused, acks, lost

    cluster, held, refused, acks, lost = run(scenario())
    assert [h.acquired for h in held] == [[(0, 1, 1)], [(0, 1, 1)]]
    assert refused.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.value and refused.acquired == []
    assert f"{TOPIC}[{lost}] is not assigned" in refused.error_message
    assert acks.ack_error == ErrorCode.NONE.value
    assert cluster.share_partition("g", TOPIC, lost).start_offset == 2
    assert refusals(cluster, "not_assigned") == 1


def test_an_expired_ticket_acquires_nothing() -> None:
    clock = FakeClock()

    async def scenario() -> Any:
        async with cluster_with(3, clock=clock) as cluster:
            a = RawMember(cluster, "a")
            joined = await a.heartbeat(0)
            clock.advance(cluster.settings.session_timeout_ms)
            return cluster, await raw_fetch(a, 0, 3, joined.ticket)

    cluster, response = run(scenario())
    assert response.error == ErrorCode.UNKNOWN_MEMBER_ID.value and response.acquired == []
    assert "expired" in response.error_message and "heartbeat" in response.error_message
    assert refusals(cluster, "expired") == 1


def test_a_member_that_left_acquires_nothing_more_with_its_old_ticket() -> None:
    """The records of a removed member are released once: its tickets issued before the
    release are refused afterwards, so nothing is acquired for it again."""

    async def scenario() -> Any:
        async with cluster_with(6) as cluster:
            a = RawMember(cluster, "a")
            joined = await a.heartbeat(0)
            held = await raw_fetch(a, 0, 2, joined.ticket)
            await a.heartbeat(-1)  # leaves: the coordinator has its records released
            await cluster.bus.drain()
            engine = cluster.share_partition("g", TOPIC, 0)
            released = engine.acquired_count
            after = await raw_fetch(a, 0, 6, joined.ticket, acks=[(0, 1, (ACCEPT,))])
            return cluster, held, released, after, engine.acquired_count

    with capture_logs() as logs:
        cluster, held, released, after, acquired = run(scenario())
    assert held.acquired == [(0, 1, 1)] and released == 0
    assert after.error == after.ack_error == ErrorCode.UNKNOWN_MEMBER_ID.value
    assert after.acquired == [] and acquired == 0
    assert "rejoin" in after.error_message
    assert len(events(logs, "member_records_released")) == 1
    assert refusals(cluster, "removed") == 1


def test_a_direct_request_without_a_ticket_is_refused() -> None:
    from inprocess_helpers import direct_cluster, fetch

    async def scenario() -> Any:
        async with direct_cluster(records=2) as cluster:
            leader = cluster.leaders[TOPIC]
            refused = await leader.serve(fetch("m1", 1, ticket=b"", max_wait_ms=5_000))
            served = await leader.serve(fetch("m1", 2))
            return refused, served

    refused, served = run(scenario())
    assert refused.error == ErrorCode.UNKNOWN_MEMBER_ID.value and refused.acquired == []
    assert served.acquired == [(0, 1, 1)]


def test_members_keep_working_under_hmac_and_a_reassignment() -> None:
    """Two real members, hmac, tickets required: every record is handled once."""

    async def scenario() -> Any:
        async with cluster_with(40, partitions=2, **HMAC) as cluster:
            seen: list[int] = []

            async def handler(record: Any) -> None:
                seen.append(record.offset * 10 + record.partition)

            await cluster.agent(handler, TOPIC, "g", concurrency=2)
            await cluster.agent(handler, TOPIC, "g", concurrency=2)
            # a wall-clock bound, not a count of polls: under load (two JVMs and workers on
            # two cores) the first key agreements and joins alone can take seconds
            deadline = asyncio.get_running_loop().time() + 30
            while len(seen) < 40 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            return cluster, sorted(seen)

    with capture_logs() as logs:
        _cluster, seen = run(scenario())
    assert len(seen) == 40 and len(set(seen)) == 40
    assert not [e for e in events(logs, "share_fetch_refused") if e["reason"] != "not_assigned"]


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(forged=st.lists(st.binary(max_size=120), min_size=1, max_size=6))
def test_random_tickets_on_the_request_topic_never_acquire_nor_create_state(
    forged: list[bytes],
) -> None:
    async def scenario() -> Any:
        async with cluster_with(3) as cluster:
            stranger = RawMember(cluster, "m-forged")
            answers = [await raw_fetch(stranger, 0, 100, t or b"\x01") for t in forged]
            return cluster, answers

    cluster, answers = run(scenario())
    assert all(a.error == ErrorCode.UNKNOWN_MEMBER_ID.value and not a.acquired for a in answers)
    assert cluster.share_partition("g", TOPIC, 0) is None and not cluster.tables[TOPIC]


@pytest.mark.parametrize(
    "auth",
    [{}, {"auth_mode": "hmac", "auth_secret": "eX5-expired-ticket-8Kq_Wm3Zb6Nr2Vt9Lc4Hy7"}],
    ids=["none", "hmac"],
)
def test_a_member_whose_ticket_expired_heartbeats_and_resends_once(auth: dict[str, str]) -> None:
    """A member that had no heartbeat answer for a session timeout (here the clock jumps; in
    life a coordinator outage) is refused once, heartbeats at once and gets its records with
    the new ticket. Under ``hmac`` the refusal, whose ticket binds no key any more, is sealed to
    the key the request came with, so the member reads it (not a request timeout)."""
    clock = FakeClock()

    async def scenario() -> Any:
        async with cluster_with(4, clock=clock, **auth) as cluster:
            session = ShareFetchSession(cluster.member_context, "g", [TOPIC], "test")
            await session.start()
            tp = TopicPartition(TOPIC, 0)
            first = await session.fetch(tp, 2)
            for record in first.records:
                session.acknowledge(tp, record.offset, AcknowledgeType.ACCEPT)
            clock.advance(cluster.settings.session_timeout_ms + 1)
            second = await session.fetch(tp, 2)  # carries the ACCEPTs of the first two
            spso = cluster.share_partition("g", TOPIC, 0).start_offset
            await session.close()
            return cluster, first, second, spso

    with capture_logs() as logs:
        cluster, first, second, spso = run(scenario())
    assert [r.offset for r in first.records] == [0, 1]
    assert second.error is None and [r.offset for r in second.records] == [2, 3]
    assert spso == 2  # the ACCEPTs were applied once (the resend went without them)
    assert refusals(cluster, "expired") == 1
    assert len(events(logs, "share_fetch_refused")) == 1


def test_with_optional_tickets_a_member_without_one_is_served_and_a_bad_one_is_not() -> None:
    """``queueflow.auth.tickets=optional`` (a rolling upgrade from members without tickets)."""

    async def scenario() -> Any:
        async with cluster_with(4, auth_tickets="optional") as cluster:
            old_member = RawMember(cluster, "m-old")
            served = await raw_fetch(old_member, 0, 2, b"")
            forged = await raw_fetch(old_member, 0, 2, cluster.ticket("g", "someone-else"))
            return served, forged

    served, forged = run(scenario())
    assert served.error == ErrorCode.NONE.value and served.acquired == [(0, 1, 1)]
    assert forged.error == ErrorCode.UNKNOWN_MEMBER_ID.value and forged.acquired == []


def test_the_members_sasl_principal_is_bound_into_its_ticket_and_named_in_refusals() -> None:
    """Where the member's Kafka connection uses SASL its principal goes into its heartbeats; the
    coordinator binds it into the ticket, and a leader's refusal of that ticket names it."""
    clock = FakeClock()

    async def scenario() -> Any:
        async with cluster_with(4, clock=clock) as cluster:
            cluster.member_context.io.principal = "User:alice"  # type: ignore[attr-defined]
            session = ShareFetchSession(cluster.member_context, "g", [TOPIC], "test")
            await session.start()
            tp = TopicPartition(TOPIC, 0)
            await session.fetch(tp, 2)
            ticket = session._membership.ticket
            clock.advance(cluster.settings.session_timeout_ms + 1)
            await session.fetch(tp, 2)  # refused once as expired, then resent
            await session.close()
            return cluster, ticket

    with capture_logs() as logs:
        cluster, ticket = run(scenario())
    key = ticket_key("none", "", cluster.app_id)
    assert verify_ticket(key, ticket, now_ms=0).principal == "User:alice"
    [refused] = events(logs, "share_fetch_refused")
    assert refused["reason"] == "expired" and refused["principal"] == "User:alice"


def test_the_principal_of_a_kafka_config_is_the_sasl_user_only() -> None:
    sasl = {"security_protocol": "SASL_SSL", "sasl_plain_username": "alice"}
    assert KafkaClientConfig(["b:9092"], extra=sasl).principal == "User:alice"
    assert KafkaClientConfig(["b:9092"], extra={"security_protocol": "SSL"}).principal == ""
    assert KafkaClientConfig(["b:9092"]).principal == ""
