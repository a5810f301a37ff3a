"""The monitor that tells a worker its key differs from its peers'
(:mod:`queueflow.server.auth_health`): it fires on well-formed messages from other processes
all refused for their signature with none verified, and never on junk, on a worker that
verified one message from another process, or on messages of its own."""

from __future__ import annotations

import os

import pytest

from queueflow.protocol.auth import AuthenticationError
from queueflow.protocol.credentials import Credentials
from queueflow.protocol.envelope import claimed_sender, topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.server.auth_health import AuthHealth

APP = "app"
OURS = "oU7-our-secret-3Wq_Ze8Rx2Vn5Bm9Lc4Hj-0a1b2c"
THEIRS = "tH9-their-secret-6Kp_Yd3Qw8Mn2Bv7Xc5Lf-4e5f6g"
DEST = topic_dest("app-share-fetch-t", 0)


def envelope(secret: str, sender: str) -> bytes:
    """A worker envelope signed with ``secret``'s key, naming ``sender``."""
    auth = ControlAuth(Credentials.from_secret(secret, APP), sender)
    return auth.seal(b'{"kind":"tick","sent_ms":1}', DEST)


def reason_of(raw: bytes) -> str | None:
    """Open ``raw`` with our key: None if it verified, else the refusal's reason."""
    try:
        ControlAuth(Credentials.from_secret(OURS, APP), f"{APP}/leader").open(raw, DEST)
    except AuthenticationError as exc:
        return exc.reason
    return None


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def monitor(clock: Clock, fired: list[str], local: set[str] | None = None) -> AuthHealth:
    return AuthHealth(
        f"{APP}/",
        is_local=lambda sender: sender in (local or set()),
        clock=clock,
        on_mismatch=fired.append,
        window_ms=10_000,
        threshold=20,
    )


def test_it_fires_once_on_peers_messages_all_refused_for_their_signature() -> None:
    clock, fired = Clock(), []
    health = monitor(clock, fired)
    verdicts = []
    for i in range(25):
        raw = envelope(THEIRS, f"member-{i % 3}")
        reason = reason_of(raw)
        assert reason == "wrong_key"
        verdicts.append(health.refused(raw, reason))
        clock.now += 100
    assert verdicts.index(True) == 19 and verdicts.count(True) == 1
    assert len(fired) == 1 and "none verified" in fired[0] and "member-" in fired[0]


def test_one_verified_message_from_another_process_disarms_it_for_good() -> None:
    clock, fired = Clock(), []
    health = monitor(clock, fired)
    health.verified("member-1")
    for _ in range(100):
        raw = envelope(THEIRS, "member-2")
        assert not health.refused(raw, "bad_signature")
    assert not fired and health.proven


def test_its_own_messages_prove_nothing_and_server_senders_count_for_nothing() -> None:
    clock, fired = Clock(), []
    health = monitor(clock, fired, local={"our-member"})
    health.verified(f"{APP}/leader")  # any worker signs as that: not proof
    health.verified("our-member")  # this process's own member: not proof
    assert not health.proven
    for _ in range(50):  # another worker's server loops, wrongly keyed: not counted
        assert not health.refused(envelope(THEIRS, f"{APP}/coordinator"), "bad_signature")
    assert not fired
    for _ in range(20):
        health.refused(envelope(THEIRS, "their-member"), "bad_signature")
    assert len(fired) == 1


def test_refusals_spread_over_more_than_the_window_do_not_fire() -> None:
    clock, fired = Clock(), []
    health = monitor(clock, fired)
    for _ in range(200):
        health.refused(envelope(THEIRS, "member-1"), "bad_signature")
        clock.now += 600  # 17 per 10 s window
    assert not fired


def test_wrong_key_counts_and_other_reasons_never_do() -> None:
    clock, fired = Clock(), []
    health = monitor(clock, fired)
    raw = envelope(THEIRS, "member-1")
    for reason in ("unsigned", "malformed", "stale", "replay", "bad_sender", ""):
        for _ in range(30):
            assert not health.refused(raw, reason)
    assert not fired
    for _ in range(20):
        health.refused(raw, "wrong_key")
    assert len(fired) == 1


@pytest.mark.parametrize("prefix", [b"", b"\xa1", b"\xa2", b"\xa3"])
def test_a_flood_of_junk_never_fires(prefix: bytes) -> None:
    clock, fired = Clock(), []
    health = monitor(clock, fired)
    for i in range(20_000):
        junk = prefix + os.urandom(10 + i % 200)
        reason = reason_of(junk)
        assert reason is not None
        health.refused(junk, reason)
    assert not fired


def test_the_defaults_fire_on_one_member_retrying_every_twenty_seconds() -> None:
    clock, fired = Clock(), []
    health = AuthHealth(f"{APP}/", clock=clock, on_mismatch=fired.append)
    for _ in range(5):
        health.refused(envelope(THEIRS, "member-1"), "bad_signature")
        clock.now += 20_000
    assert len(fired) == 1


def test_claimed_sender_of_envelopes_and_junk() -> None:
    assert claimed_sender(envelope(THEIRS, "member-7")) == "member-7"
    member = ControlAuth(Credentials.from_secret(THEIRS, APP), role="member")
    sealed = member.seal(b'{"kind":"tick"}', DEST)
    assert member.reply_key is not None
    assert claimed_sender(sealed) == "member:" + member.reply_key.public.hex()
    for junk in (b"", b"{}", b"\xa1" * 40, b"\xa2" * 40, b"\xa2" + bytes(36) + b"\x92\x01\x02"):
        assert claimed_sender(junk) is None


def test_a_worker_alone_never_stops_and_one_with_peers_does() -> None:
    clock, fired = Clock(), []
    peers = {"present": False}
    health = AuthHealth(
        f"{APP}/", clock=clock, on_mismatch=fired.append, has_peers=lambda: peers["present"]
    )
    for _ in range(50):  # a lone worker: there is nobody to give its partitions to
        health.refused(envelope(THEIRS, "member-1"), "bad_signature")
    assert not fired
    peers["present"] = True
    assert health.refused(envelope(THEIRS, "member-1"), "bad_signature")
    assert len(fired) == 1
