"""The signed envelope and assignment tickets (queueflow.protocol.auth, issue #12 items 2-3).

Each attack on the envelope is a test: unsigned, forged (wrong key), tampered body, member id
moved to another message, stale, replayed, and random or truncated bytes (Hypothesis), which must
be refused with exactly :class:`AuthenticationError` and leave the replay cache unchanged.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.errors import InvalidRequestError
from queueflow.protocol.auth import (
    ENVELOPE_FORMAT,
    AuthenticationError,
    Signer,
    Verifier,
    derive_key,
    issue_ticket,
    verify_ticket,
)
from queueflow.protocol.messages import (
    Fence,
    ShareFetchRequest,
    decode,
    decode_binary,
    encode,
    encode_binary,
)

KEY = derive_key("s3cret", "app")
NOW = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def pair(window_ms: int = 1_000) -> tuple[Signer, Verifier, Clock]:
    clock = Clock()
    return Signer(KEY, "m-1", clock), Verifier(KEY, window_ms=window_ms, clock=clock), clock


def fetch() -> ShareFetchRequest:
    return ShareFetchRequest(
        group="g",
        topic="t",
        partition=0,
        member_id="m-1",
        reply_partition=0,
        request_id=1,
        max_records=10,
    )


def test_round_trip_json_and_binary() -> None:
    signer, verifier, _ = pair()
    for body, dec in ((encode(fetch()), decode), (encode_binary(fetch()), decode_binary)):
        opened = verifier.open(signer.seal(body))
        assert opened.sender == "m-1" and opened.ts_ms == NOW
        assert dec(opened.body) == fetch()


def test_key_depends_on_secret_app_and_purpose() -> None:
    keys = {
        derive_key("s3cret", "app"),
        derive_key("other", "app"),
        derive_key("s3cret", "app2"),
        derive_key("s3cret", "app", "tickets"),
    }
    assert len(keys) == 4
    with pytest.raises(ValueError):
        derive_key("", "app")


def test_unsigned_message_is_refused() -> None:
    _, verifier, _ = pair()
    for raw in (encode(fetch()), encode_binary(fetch()), b""):
        with pytest.raises(AuthenticationError) as info:
            verifier.open(raw)
        assert info.value.reason == "unsigned"
        assert isinstance(info.value, InvalidRequestError)


def test_forged_with_another_key_is_refused() -> None:
    _, verifier, clock = pair()
    forger = Signer(derive_key("guess", "app"), "m-1", clock)
    with pytest.raises(AuthenticationError) as info:
        verifier.open(forger.seal(encode(Fence(leader_epoch=999999))))
    assert info.value.reason == "bad_signature"
    assert verifier.remembered == 0


def test_tampered_body_or_sender_is_refused() -> None:
    signer, verifier, _ = pair()
    sealed = bytearray(signer.seal(encode(fetch())))
    for i in (1, 40, len(sealed) - 1):  # MAC, header (sender/timestamp/nonce), body
        bad = bytearray(sealed)
        bad[i] ^= 0x01
        with pytest.raises(AuthenticationError) as info:
            verifier.open(bytes(bad))
        assert info.value.reason == "bad_signature"
    sealed_by_other = Signer(KEY, "m-2", signer._clock).seal(encode(fetch()))
    # Valid envelope, but the sender bound in it is m-2: callers compare it with the body's id.
    assert verifier.open(sealed_by_other).sender == "m-2"


def test_stale_and_future_messages_are_refused() -> None:
    signer, verifier, clock = pair(window_ms=1_000)
    old = signer.seal(b"x")
    clock.now += 1_001
    with pytest.raises(AuthenticationError) as info:
        verifier.open(old)
    assert info.value.reason == "stale"
    future = Signer(KEY, "m-1", Clock(clock.now + 1_001)).seal(b"x")
    with pytest.raises(AuthenticationError):
        verifier.open(future)


def test_replay_is_refused_and_nonces_are_forgotten_after_two_windows() -> None:
    signer, verifier, clock = pair(window_ms=1_000)
    sealed = signer.seal(b"x")
    verifier.open(sealed)
    with pytest.raises(AuthenticationError) as info:
        verifier.open(sealed)
    assert info.value.reason == "replay"
    clock.now += 2_001
    verifier.open(signer.seal(b"y"))
    assert verifier.remembered == 1  # the first nonce is gone; its message is stale by now
    with pytest.raises(AuthenticationError) as info:
        verifier.open(sealed)
    assert info.value.reason == "stale"


def test_nonce_cache_bound_refuses_older_messages_instead_of_forgetting_them() -> None:
    clock = Clock()
    signer = Signer(KEY, "m-1", clock)
    verifier = Verifier(KEY, window_ms=10_000, clock=clock, max_nonces=2)
    first = signer.seal(b"a")
    verifier.open(first)
    clock.now += 1
    verifier.open(signer.seal(b"b"))
    clock.now += 1
    verifier.open(signer.seal(b"c"))  # evicts the first nonce
    assert verifier.remembered == 2
    with pytest.raises(AuthenticationError) as info:
        verifier.open(first)  # would be a replay: refused by the floor, not accepted
    assert info.value.reason == "stale"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_refused(data: bytes) -> None:
    _, verifier, _ = pair()
    with pytest.raises(AuthenticationError):
        verifier.open(data)
    assert verifier.remembered == 0


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_truncated_or_extended_envelopes_are_refused(data: st.DataObject) -> None:
    signer, verifier, _ = pair()
    sealed = signer.seal(encode(fetch()))
    cut = data.draw(st.integers(0, len(sealed) - 1))
    with pytest.raises(AuthenticationError):
        verifier.open(sealed[:cut])
    with pytest.raises(AuthenticationError):
        verifier.open(sealed + data.draw(st.binary(min_size=1, max_size=8)))
    assert verifier.remembered == 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_signed_garbage_headers_are_refused_as_malformed(header: bytes) -> None:
    """An insider bug (or a key holder) sending a bad header is refused, not crashed on."""
    import hashlib
    import hmac

    _, verifier, _ = pair()
    mac = hmac.new(KEY, header, hashlib.sha256).digest()
    raw = bytes((ENVELOPE_FORMAT,)) + mac + header
    try:
        verifier.open(raw)
    except AuthenticationError as exc:
        assert exc.reason in {"malformed", "stale"}


TICKET_KEY = derive_key("s3cret", "app", "tickets")


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
        verify_ticket(KEY, raw, now_ms=NOW)  # a message key is not a ticket key
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
