"""queueflow.protocol.prefilter: junk refused by its first bytes, genuine messages let through."""

from __future__ import annotations

import os

import pytest

from queueflow.protocol import messages as protocol
from queueflow.protocol.credentials import Credentials
from queueflow.protocol.prefilter import (
    MEMBER_MIN_BYTES,
    WORKER_MIN_BYTES,
    reply_prefilter,
    request_prefilter,
)
from queueflow.protocol.roles import ControlAuth

SECRET = "pF6-prefilter-secret-3Wq_Ze8Rx2Vn5Bm9Lc4Hj"
FENCE = protocol.encode(protocol.Fence(leader_epoch=1, sent_ms=1))
CREDS = Credentials.from_secret(SECRET, "app")


def test_genuine_messages_pass_in_both_modes() -> None:
    worker = ControlAuth(CREDS, "app/leader")
    member = ControlAuth(CREDS, role="member")
    for auth in (worker, member):
        assert request_prefilter(True).reject(auth.seal(FENCE, "t/0")) is None
        assert request_prefilter(True).reject(auth.seal(b"", "")) is None  # the shortest
    assert len(worker.seal(b"", "")) >= WORKER_MIN_BYTES
    assert len(member.seal(b"", "")) >= MEMBER_MIN_BYTES
    assert request_prefilter(False).reject(FENCE) is None
    assert member.reply_key is not None
    sealed = worker.seal_reply(member.reply_key.public, FENCE, "r/0/x")
    assert reply_prefilter(True).reject(sealed) is None
    assert reply_prefilter(True).reject(worker.seal_reply(member.reply_key.public, b"", "")) is None
    assert reply_prefilter(False).reject(FENCE) is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (None, "empty"),
        (b"\x00garbage", "unknown_format"),
        (FENCE, "unknown_format"),  # unsigned under hmac
        (b"\x01" + b"x" * 100, "unknown_format"),  # the direct path's binary format
        (b"\xa2" + b"x" * (WORKER_MIN_BYTES - 2), "too_short"),
        (b"\xa3" + b"x" * (MEMBER_MIN_BYTES - 2), "too_short"),
        (b"\xa1" + b"x" * 100, "envelope_v1"),  # an earlier release's envelope
    ],
)
def test_junk_is_refused_with_its_reason_under_hmac(data: bytes | None, reason: str) -> None:
    assert request_prefilter(True).reject(data) == reason


def test_without_auth_only_json_passes() -> None:
    refuse = request_prefilter(False).reject
    assert refuse(b"{") == "too_short"
    assert refuse(b"\xa2" + os.urandom(100)) == "unknown_format"
    assert refuse(b"garbage") == "unknown_format"


def test_replies_refuse_short_seals_and_other_formats() -> None:
    refuse = reply_prefilter(True).reject
    assert refuse(b"\xe2" + os.urandom(20)) == "too_short"
    assert refuse(b"{" + os.urandom(100)) == "unknown_format"
    assert refuse(b"\xe1" + os.urandom(100)) == "envelope_v1"
    assert refuse(b"\xa2" + os.urandom(100)) == "unknown_format"  # members get sealed replies
    assert reply_prefilter(True).formats == {0xE2}
