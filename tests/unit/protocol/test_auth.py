"""The envelopes of ``queueflow.auth.mode=hmac`` (v2), role keys, member credentials, weak
secrets, absurd values and assignment tickets (queueflow.protocol.auth, .envelope, .roles,
.credentials).

Each refusal reason is a test: unsigned, v1, another key (``wrong_key``), altered
(``bad_signature``), sent elsewhere (``wrong_destination``), a worker message from a member
(``wrong_role``), a member acting for another (``wrong_member``), stale, replayed, re-wrapped
ciphertext (``bad_seal``) and absurd epochs (``absurd_value``); random and truncated bytes are
refused with exactly :class:`AuthenticationError`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.errors import ConfigurationError, InvalidRequestError
from queueflow.protocol import messages as m
from queueflow.protocol.auth import (
    MAX_EPOCH,
    AuthenticationError,
    ReplayGuard,
    derive_key,
    issue_ticket,
    key_id,
    verify_ticket,
)
from queueflow.protocol.credentials import (
    Credentials,
    member_credential,
    parse_member_credential,
)
from queueflow.protocol.envelope import (
    MEMBER_FORMAT,
    V1_FORMAT,
    WORKER_FORMAT,
    EnvelopeOpener,
    direct_dest,
    reply_dest,
    topic_dest,
)
from queueflow.protocol.roles import ControlAuth, check_values, refusal_labels
from queueflow.settings import ShareGroupSettings, secret_problem

SECRET = "pR4-auth-unit-secret-9Xq_Lm2Vb7Nc5Zr8Kw3Hy6Jd"
OTHER = "oT7-another-app-secret-3Wq_Ze8Rx2Vn5Bm9Lc4Hj"
APP = "app"
NOW = 1_700_000_000_000
DEST = topic_dest("app-share-fetch-jobs", 0)


class Clock:
    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def worker(secret: str = SECRET, clock: Clock | None = None, window_ms: int = 1_000) -> ControlAuth:
    return ControlAuth(
        Credentials.from_secret(secret, APP), "w", window_ms=window_ms, clock=clock or Clock()
    )


def member(secret: str = SECRET, clock: Clock | None = None) -> ControlAuth:
    creds = Credentials.from_member_credential(member_credential(secret, APP), APP)
    return ControlAuth(creds, role="member", clock=clock or Clock())


def fetch(member_id: str = "m-1", ticket: bytes = b"") -> m.ShareFetchRequest:
    return m.ShareFetchRequest(
        group="g",
        topic="t",
        partition=0,
        member_id=member_id,
        reply_partition=0,
        request_id=1,
        max_records=10,
        ticket=ticket,
    )


def refused(call: Any, *args: Any) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as info:
        call(*args)
    return info.value


# -- envelopes ---------------------------------------------------------------------------------


def test_worker_and_member_envelopes_round_trip_json_and_binary() -> None:
    w, mem = worker(), member()
    for body, dec in ((m.encode(fetch()), m.decode), (m.encode_binary(fetch()), m.decode_binary)):
        sealed = mem.seal(body, DEST)
        assert sealed[0] == MEMBER_FORMAT and body not in sealed and b"m-1" not in sealed
        assert dec(w.open(sealed, DEST)) == fetch()
        assert w.last is not None and w.last.role == "member"
        assert mem.reply_key is not None and w.last.member_pub == mem.reply_key.public
        sealed = worker().seal(body, DEST)
        assert sealed[0] == WORKER_FORMAT
        assert dec(w.open(sealed, DEST)) == fetch()
        assert w.last.role == "worker" and w.last.sender == "w"


def test_keys_depend_on_secret_app_and_purpose_and_have_ids() -> None:
    purposes = ("worker", "member", "tickets", "worker-x25519")
    keys = {derive_key(SECRET, APP, p) for p in purposes}
    keys |= {derive_key(OTHER, APP, "worker"), derive_key(SECRET, "app2", "worker")}
    assert len(keys) == 6
    assert len({key_id(k) for k in keys}) == 6 and all(len(key_id(k)) == 4 for k in keys)
    with pytest.raises(ValueError):
        derive_key("", APP)


def test_unsigned_and_v1_envelopes_are_refused_by_name() -> None:
    w = worker()
    assert refused(w.open, m.encode(fetch()), DEST).reason == "unsigned"
    v1 = bytes((V1_FORMAT,)) + bytes(32) + b"\x95\x01"
    error = refused(w.open, v1, DEST)
    assert error.reason == "envelope_v1" and "earlier release" in str(error)
    assert w._opener is not None and w._opener.guard.remembered == 0


def test_another_key_is_told_apart_from_an_altered_message() -> None:
    w = worker()
    error = refused(w.open, worker(OTHER).seal(b"x", DEST), DEST)
    assert error.reason == "wrong_key" and error.key_id_matches is False
    assert error.key_id == key_id(derive_key(OTHER, APP, "worker")).hex()
    assert key_id(derive_key(SECRET, APP, "worker")).hex() in str(error)
    error = refused(w.open, member(OTHER).seal(b"x", DEST), DEST)
    assert error.reason == "wrong_key" and refusal_labels(error) == ("wrong_key", False)
    for sealed in (worker().seal(b"body", DEST), member().seal(b"body", DEST)):
        altered = bytearray(sealed)
        altered[-1] ^= 1
        error = refused(w.open, bytes(altered), DEST)
        assert error.reason == "bad_signature" and error.key_id_matches is True


def test_a_copy_sent_to_another_destination_is_refused() -> None:
    """Attack matrix: the cross-topic replay. A member's request copied to another request
    topic, partition, the coordinator topic or a direct endpoint is refused there."""
    mem, w = member(), worker()
    sealed = mem.seal(m.encode(fetch()), DEST)
    for elsewhere in (
        topic_dest("app-share-fetch-other", 0),
        topic_dest("app-share-fetch-jobs", 1),
        topic_dest("app-share-coordinator", 0),
        direct_dest("10.0.0.1:9100"),
        reply_dest("app-share-replies", 0, "r-1"),
    ):
        assert refused(w.open, sealed, elsewhere).reason == "wrong_destination"
    fence = worker().seal(m.encode(m.Fence(leader_epoch=3)), DEST)
    assert refused(w.open, fence, topic_dest("app-share-fetch-jobs", 1)).reason == (
        "wrong_destination"
    )
    assert m.decode(w.open(sealed, DEST)) == fetch()  # where it was sent, it opens


def test_a_member_cannot_rewrap_another_members_request_for_elsewhere() -> None:
    """An insider holds the member key: it can recompute the outer MAC after changing the
    destination, but the ciphertext's associated data is the clear header: ``bad_seal``."""
    victim, w = member(), worker()
    sealed = victim.seal(m.encode(fetch()), DEST)
    n = int.from_bytes(sealed[37:39], "big")
    head = m.msgspec.msgpack.decode(sealed[39 : 39 + n])
    head[1] = topic_dest("app-share-fetch-other", 0)
    new_head = m.msgspec.msgpack.encode(head)
    rest = len(new_head).to_bytes(2, "big") + new_head + sealed[39 + n :]
    prefix = sealed[:5]
    mac = hmac.new(derive_key(SECRET, APP, "member"), prefix + rest, hashlib.sha256).digest()
    rewrapped = prefix + mac + rest
    assert refused(w.open, rewrapped, head[1]).reason == "bad_seal"


def test_stale_future_and_replayed_messages_are_refused() -> None:
    clock = Clock()
    w = worker(clock=clock)
    for send in (worker(), member()):
        sealed = send.seal(b"x", DEST)
        assert w.open(sealed, DEST) == b"x"
        assert refused(w.open, sealed, DEST).reason == "replay"
    clock.now = NOW + 1_001
    assert refused(w.open, member().seal(b"x", DEST), DEST).reason == "stale"
    clock.now = NOW - 1_001
    assert refused(w.open, worker().seal(b"x", DEST), DEST).reason == "stale"


def test_replay_guard_forgets_after_two_windows_and_its_bound_refuses_older() -> None:
    clock = Clock()
    guard = ReplayGuard(window_ms=1_000, clock=clock, max_nonces=2)
    guard.admit(b"a", NOW)
    guard.admit(b"b", NOW + 1)
    guard.admit(b"c", NOW + 2)  # past the bound: "a" forgotten, messages of its age refused
    assert refused(guard.fresh, NOW).reason == "stale"
    clock.now = NOW + 3_000
    guard.admit(b"d", NOW + 3_000)
    assert guard.remembered == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_refused(data: bytes) -> None:
    w = worker()
    with pytest.raises(AuthenticationError):
        w.open(data, DEST)
    with pytest.raises(AuthenticationError):
        w.open(bytes((MEMBER_FORMAT,)) + data, DEST)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_truncated_or_extended_envelopes_are_refused(data: st.DataObject) -> None:
    sealed = data.draw(st.sampled_from([member(), worker()])).seal(b"body", DEST)
    cut = data.draw(st.integers(0, len(sealed) - 1))
    extra = data.draw(st.binary(min_size=1, max_size=8))
    w = worker()
    for variant in (sealed[:cut], sealed + extra):
        with pytest.raises(AuthenticationError):
            w.open(variant, DEST)


# -- roles -------------------------------------------------------------------------------------

WORKER_KINDS = [
    m.Fence(leader_epoch=1),
    m.Tick(),
    m.ReleaseMember(group="g", topic="t", partition=0, member_id="m-1"),
    m.ResetSharePartition(group="g", topic="t", partition=0, admin_id="a", request_id=1),
    m.ResetSharePartitionResult(group="g", topic="t", partition=0, admin_id="a", request_id=1),
    m.LeaderAnnouncement(topic="t", partitions=[0], leader_epoch=1, address="x:1"),
    m.DeleteShareGroupRequest(group="g", admin_id="a", request_id=1, reply_partition=0),
]


@pytest.mark.parametrize("message", WORKER_KINDS, ids=lambda x: x.kind)
def test_a_member_credential_cannot_send_worker_messages(message: Any) -> None:
    w = worker()
    w.open(member().seal(m.encode(message), DEST), DEST)
    error = refused(w.check_sender, message)
    assert error.reason == "wrong_role"
    w.open(worker().seal(m.encode(message), DEST), DEST)
    w.check_sender(message)  # a worker may send it


def test_a_member_credential_cannot_sign_as_a_worker_or_issue_tickets() -> None:
    creds = Credentials.from_member_credential(member_credential(SECRET, APP), APP)
    assert not creds.is_worker and creds.worker_key is None and creds.tickets_key is None
    assert creds.workers_private is None
    with pytest.raises(ConfigurationError, match=r"queueflow\.auth\.secret"):
        ControlAuth(creds, "admin")  # role worker (admins, leaders, coordinators)
    assert member().seal(b"x", DEST)[0] == MEMBER_FORMAT  # it can only make member envelopes
    opener = EnvelopeOpener(worker_key=None, member_key=None, ciphers=None, window_ms=1000)
    assert refused(opener.open, worker().seal(b"x", DEST), DEST).reason == "wrong_role"


def test_a_member_cannot_act_for_another_member_id() -> None:
    """Sealed with its own key while naming the victim: a heartbeat naming the victim's reply
    key, or a ShareFetch carrying the victim's ticket (bound to the victim's key)."""
    victim, attacker, w = member(), member(), worker()
    assert victim.reply_key is not None and attacker.reply_key is not None
    heartbeat = m.HeartbeatRequest(
        group="g",
        member_id="victim",
        member_epoch=3,
        subscribed_topics=["t"],
        reply_partition=0,
        request_id=1,
        reply_key=victim.reply_key.public,
    )
    w.open(attacker.seal(m.encode(heartbeat), DEST), DEST)
    assert refused(w.check_sender, heartbeat).reason == "wrong_member"
    ticket = b"victim's ticket"
    bound = {ticket: victim.reply_key.public}
    w.open(attacker.seal(m.encode(fetch("victim", ticket)), DEST), DEST)
    assert refused(w.check_sender, fetch("victim", ticket), bound.get).reason == "wrong_member"
    w.open(attacker.seal(m.encode(fetch("victim")), DEST), DEST)  # no ticket at all
    assert refused(w.check_sender, fetch("victim"), bound.get).reason == "wrong_member"
    # the victim itself passes
    w.open(victim.seal(m.encode(fetch("victim", ticket)), DEST), DEST)
    w.check_sender(fetch("victim", ticket), bound.get)


# -- absurd values -----------------------------------------------------------------------------

ABSURD = 2**62
ABSURD_MESSAGES = {
    "fence leader_epoch": m.Fence(leader_epoch=ABSURD),
    "announcement leader_epoch": m.LeaderAnnouncement(
        topic="t", partitions=[0], leader_epoch=ABSURD, address="black.hole:1"
    ),
    "release member_epoch": m.ReleaseMember(
        group="g", topic="t", partition=0, member_id="m", member_epoch=ABSURD
    ),
    "release coordinator_epoch": m.ReleaseMember(
        group="g", topic="t", partition=0, member_id="m", coordinator_epoch=ABSURD
    ),
    "reset coordinator_epoch": m.ResetSharePartition(
        group="g", topic="t", partition=0, admin_id="a", request_id=1, coordinator_epoch=ABSURD
    ),
    "heartbeat answer member_epoch": m.HeartbeatResponse(
        member_id="m", request_id=1, member_epoch=ABSURD
    ),
    "heartbeat answer coordinator_epoch": m.HeartbeatResponse(
        member_id="m", request_id=1, coordinator_epoch=ABSURD
    ),
}


@pytest.mark.parametrize("name", list(ABSURD_MESSAGES))
def test_absurd_epochs_are_refused_whoever_signed_them(name: str) -> None:
    message = ABSURD_MESSAGES[name]
    error = refused(check_values, message)
    assert error.reason == "absurd_value" and str(ABSURD) in str(error)
    w = worker()
    w.open(worker().seal(m.encode(message), DEST), DEST)  # even a worker's
    assert refused(w.check_sender, message).reason == "absurd_value"
    check_values(m.msgspec.structs.replace(message, **{name.split()[-1]: MAX_EPOCH}))


@pytest.mark.parametrize("field", ["member_epoch", "coordinator_epoch", "config_version"])
def test_tickets_with_absurd_epochs_or_config_versions_are_refused(field: str) -> None:
    key = derive_key(SECRET, APP, "tickets")
    values = {"member_epoch": 1, "coordinator_epoch": 1, "config_version": 1, field: ABSURD}
    raw = issue_ticket(
        key, group="g", member_id="m", partitions=[], ttl_ms=1_000, now_ms=NOW, **values
    )
    assert refused(verify_ticket, key, raw).reason == "absurd_value"


# -- secrets and credentials -------------------------------------------------------------------


@pytest.mark.parametrize(
    "weak",
    [
        "changeme",
        "hunter2",
        "short-but-random-9Xq",
        "changeme" * 5,
        "CHANGEME-CHANGEME-CHANGEME-CHANGEME",
        "password123456789012345678901234567",
        "a" * 64,
        "abcdefghijklmnopabcdefghijklmnop",
        "0101010101010101010101010101010101010101",
        "test-secret-test-secret-test-secret",
    ],
)
def test_weak_secrets_are_refused_at_start_saying_how_to_make_one(weak: str) -> None:
    assert secret_problem(weak)
    with pytest.raises(ConfigurationError) as info:
        ShareGroupSettings.load({"queueflow.auth.secret": weak})
    assert "secrets.token_urlsafe(32)" in str(info.value) and weak not in str(info.value)


def test_generated_secrets_are_accepted() -> None:
    for _ in range(200):
        assert secret_problem(secrets.token_urlsafe(32)) == ""
        assert secret_problem(secrets.token_hex(32)) == ""
    assert ShareGroupSettings.load({"queueflow.auth.secret": SECRET}).auth_secret == SECRET


def test_a_member_credential_round_trips_and_holds_only_member_keys() -> None:
    credential = member_credential(SECRET, APP)
    assert credential.startswith("qfm1.") and SECRET not in credential
    app, member_key, public = parse_member_credential(credential)
    full = Credentials.from_secret(SECRET, APP)
    assert (app, member_key, public) == (APP, full.member_key, full.workers_public)
    settings_ = ShareGroupSettings.load({"queueflow.auth.member.credential": credential})
    assert settings_.control_auth_mode == "hmac"
    assert credential not in repr(settings_) and credential not in str(settings_.as_kip_names())
    # a member with only the credential and a worker with the secret talk to each other
    w = worker()
    assert w.open(member().seal(b"hello", DEST), DEST) == b"hello"


def test_a_credential_for_another_app_or_not_a_credential_is_refused_at_start() -> None:
    with pytest.raises(ConfigurationError, match="for app 'other'"):
        Credentials.from_member_credential(member_credential(SECRET, "other"), APP)
    for bad in ("", "qfm1.", "qfm1.!!!", SECRET, "qfm2." + member_credential(SECRET, APP)[5:]):
        with pytest.raises(ConfigurationError, match="not a member credential"):
            parse_member_credential(bad)
    with pytest.raises(ConfigurationError, match="not made from this"):
        Credentials.resolve(SECRET, member_credential(OTHER, APP), APP)
    with pytest.raises(ConfigurationError, match=r"needs queueflow\.auth\.secret"):
        Credentials.resolve("", "", APP)


def test_the_member_credential_command_prints_a_credential() -> None:
    from click.testing import CliRunner

    from queueflow.devtools.cli import cli

    result = CliRunner().invoke(
        cli, ["auth", "member-credential", "--app-id", APP], env={"QUEUEFLOW_AUTH_SECRET": SECRET}
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == member_credential(SECRET, APP)
    weak = CliRunner().invoke(
        cli, ["auth", "member-credential", "--app-id", APP], env={"QUEUEFLOW_AUTH_SECRET": "x"}
    )
    assert weak.exit_code != 0 and "token_urlsafe" in weak.output


def test_refusals_are_invalid_requests_and_labelled() -> None:
    error = AuthenticationError("replay", "x")
    assert isinstance(error, InvalidRequestError)
    assert refusal_labels(error) == ("replay", None)
    assert refusal_labels(ValueError()) == ("undecodable", None)


# -- tickets -----------------------------------------------------------------------------------

TICKET_KEY = derive_key(SECRET, APP, "tickets")


def test_ticket_round_trip_and_checks() -> None:
    raw = issue_ticket(
        TICKET_KEY,
        group="g",
        member_id="m-1",
        member_epoch=3,
        partitions=[("t", 1), ("t", 0)],
        ttl_ms=45_000,
        now_ms=NOW,
    )
    ticket = verify_ticket(TICKET_KEY, raw, now_ms=NOW + 44_999)
    assert (ticket.group, ticket.member_id, ticket.member_epoch) == ("g", "m-1", 3)
    assert ticket.covers("t", 0) and ticket.covers("t", 1) and not ticket.covers("t", 2)
    with pytest.raises(AuthenticationError) as info:
        verify_ticket(TICKET_KEY, raw, now_ms=NOW + 45_000)
    assert info.value.reason == "stale"
    with pytest.raises(AuthenticationError) as info:
        verify_ticket(derive_key(SECRET, APP, "member"), raw, now_ms=NOW)  # not a ticket key
    assert info.value.reason == "bad_signature"
    forged = bytearray(raw)
    forged[-3] ^= 1
    with pytest.raises(AuthenticationError):
        verify_ticket(TICKET_KEY, bytes(forged), now_ms=NOW)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_tickets_are_refused(data: bytes) -> None:
    with pytest.raises(AuthenticationError):
        verify_ticket(TICKET_KEY, data, now_ms=NOW)


def test_skip_log_limiter_admits_a_burst_per_period_and_counts_the_rest() -> None:
    from queueflow.logging import SkipLogLimiter

    clock = Clock(0)
    limiter = SkipLogLimiter(clock, burst=3, period_ms=1_000)
    assert [limiter.admit() for _ in range(5)] == [0, 0, 0, None, None]
    clock.now = 1_000
    assert limiter.admit() == 2  # the first line of the next period says 2 were suppressed
    assert limiter.admit() == 0 and limiter.total == 7
