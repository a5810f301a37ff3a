"""Junk refused after a look at a few bytes, before anything decodes, locks or logs it.

Anyone who may write an internal topic can flood it (docs/operations.md "Threat model and attack
matrix"). Whatever a receiver (a leader, a coordinator, a member's reply reader) then does per
record bounds how fast it drains the flood, so the first thing it does with a record is
:meth:`Prefilter.reject`: the first byte must be a format the receiver reads in its
``queueflow.auth.mode``, and the record at least as long as the shortest message of that format.
Only what passes goes on to the MAC check (:mod:`queueflow.protocol.auth`), the decryption
(:mod:`queueflow.protocol.sealed_replies`) and the decoder.

Pure: no I/O, no clock; the receivers count and log what is rejected (rate-limited).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from queueflow.protocol.envelope import ENVELOPE_PREFIX, MEMBER_FORMAT, V1_FORMAT, WORKER_FORMAT
from queueflow.protocol.sealed_replies import (
    PUBLIC_KEY_BYTES,
    SEALED_FORMAT,
    SEALED_FORMAT_V1,
    SEALED_OVERHEAD,
)

__all__ = [
    "JSON_FORMAT",
    "JSON_MIN_BYTES",
    "MEMBER_MIN_BYTES",
    "WORKER_MIN_BYTES",
    "Prefilter",
    "reply_prefilter",
    "request_prefilter",
]

#: The first byte of a JSON control message (:func:`queueflow.protocol.messages.encode`).
JSON_FORMAT: Final = ord("{")
#: The shortest JSON message: ``{}`` (which the decoder then refuses, but cheaply).
JSON_MIN_BYTES: Final = 2
#: The shortest worker envelope: format byte, key id and MAC, then a MessagePack header of an
#: empty sender, destination and body with its 16-byte nonce.
WORKER_MIN_BYTES: Final = ENVELOPE_PREFIX + 24
#: The shortest member envelope: format byte, key id and MAC, the header length, a header
#: holding the member's 32-byte key and a 12-byte nonce, and the AES-GCM tag.
MEMBER_MIN_BYTES: Final = ENVELOPE_PREFIX + 2 + PUBLIC_KEY_BYTES + 12 + 4 + 16
#: The shortest sealed reply: its overhead plus one byte of what it carries.
SEALED_MIN_BYTES: Final = SEALED_OVERHEAD + 1

#: Reasons :meth:`Prefilter.reject` gives (the ``reason`` label of
#: ``queueflow_control_messages_dropped_total``).
REASONS: Final = ("empty", "unknown_format", "too_short", "envelope_v1")


class Prefilter:
    """Which first bytes a receiver reads, and the shortest record of each.

    Args:
        min_bytes: format byte -> minimum length in bytes of a record starting with it.
    """

    __slots__ = ("_min", "_named")

    def __init__(
        self, min_bytes: Mapping[int, int], named: Mapping[int, str] | None = None
    ) -> None:
        self._min = dict(min_bytes)
        self._named = dict(named or {})

    @property
    def formats(self) -> frozenset[int]:
        """The first bytes this receiver reads."""
        return frozenset(self._min)

    def reject(self, data: bytes | bytearray | memoryview | None) -> str | None:
        """Why ``data`` is junk (``"empty"``, ``"unknown_format"``, ``"too_short"``), or None
        when it may be a message (it still has to pass the MAC check and the decoder).

        Reads the first byte and the length only: constant cost, whatever ``data`` holds.
        """
        if not data:
            return "empty"
        need = self._min.get(data[0])
        if need is None:
            return self._named.get(data[0], "unknown_format")
        if len(data) < need:
            return "too_short"
        return None


def request_prefilter(signed: bool) -> Prefilter:
    """What a leader or coordinator reads on its topic: signed envelopes only when ``signed``
    (``queueflow.auth.mode=hmac``), else JSON messages only."""
    if signed:
        return Prefilter(
            {WORKER_FORMAT: WORKER_MIN_BYTES, MEMBER_FORMAT: MEMBER_MIN_BYTES},
            {V1_FORMAT: "envelope_v1"},
        )
    return Prefilter({JSON_FORMAT: JSON_MIN_BYTES})


def reply_prefilter(signed: bool) -> Prefilter:
    """What a member reads on the reply topic: replies sealed to it by the workers when
    ``signed`` (``queueflow.auth.mode=hmac``; every answer to a member is sealed), else JSON."""
    if signed:
        return Prefilter(
            {SEALED_FORMAT: SEALED_MIN_BYTES},
            {V1_FORMAT: "envelope_v1", SEALED_FORMAT_V1: "envelope_v1"},
        )
    return Prefilter({JSON_FORMAT: JSON_MIN_BYTES})
