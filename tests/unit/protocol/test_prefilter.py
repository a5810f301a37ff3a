"""queueflow.protocol.prefilter: junk refused by its first bytes, genuine messages let through."""

from __future__ import annotations

import os
import time

import pytest

from queueflow.protocol import messages as protocol
from queueflow.protocol.auth import ControlAuth
from queueflow.protocol.prefilter import (
    ENVELOPE_MIN_BYTES,
    reply_prefilter,
    request_prefilter,
)
from queueflow.protocol.sealed_replies import ReplyKey, ReplySealer

SECRET = "s" * 43
FENCE = protocol.encode(protocol.Fence(leader_epoch=1, sent_ms=1))


def test_genuine_messages_pass_in_both_modes() -> None:
    signed = ControlAuth("hmac", SECRET, "app", "m-1")
    assert request_prefilter(True).reject(signed.seal(FENCE)) is None
    assert request_prefilter(True).reject(signed.seal(b"")) is None  # shortest envelope
    assert request_prefilter(False).reject(FENCE) is None
    key = ReplyKey()
    sealed = ReplySealer().seal(key.public, signed.seal(FENCE))
    assert reply_prefilter(True).reject(sealed) is None
    assert reply_prefilter(True).reject(signed.seal(FENCE)) is None
    assert reply_prefilter(False).reject(FENCE) is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (None, "empty"),
        (b"\x00garbage", "unknown_format"),
        (FENCE, "unknown_format"),  # unsigned under hmac
        (b"\x01" + b"x" * 100, "unknown_format"),  # the direct path's binary format
        (b"\xa1" + b"x" * (ENVELOPE_MIN_BYTES - 2), "too_short"),
    ],
)
def test_junk_is_refused_with_its_reason_under_hmac(data: bytes | None, reason: str) -> None:
    assert request_prefilter(True).reject(data) == reason


def test_without_auth_only_json_passes() -> None:
    refuse = request_prefilter(False).reject
    assert refuse(b"{") == "too_short"
    assert refuse(b"\xa1" + os.urandom(100)) == "unknown_format"
    assert refuse(b"garbage") == "unknown_format"


def test_replies_refuse_short_seals_and_other_formats() -> None:
    refuse = reply_prefilter(True).reject
    assert refuse(b"\xe1" + os.urandom(40)) == "too_short"
    assert refuse(b"{" + os.urandom(100)) == "unknown_format"
    assert reply_prefilter(True).formats == {0xA1, 0xE1}


def test_the_check_costs_the_same_whatever_the_record_holds() -> None:
    """A look at the first byte and the length: 200k records of 1 MiB or 10 bytes alike in well
    under a second (nothing copies or parses them)."""
    refuse = request_prefilter(True).reject
    big, small = b"\x00" * (1 << 20), b"\x00" * 10
    start = time.perf_counter()
    for _ in range(100_000):
        refuse(big)
        refuse(small)
    assert time.perf_counter() - start < 2.0
