"""The signed envelopes of control messages (version 2): one per role, bound to where they go.

Worker envelope (fences, ticks, releases, resets and their results, leader announcements, admin
requests and answers; only holders of the worker secret can make one)::

    0xA2 | key id (4) | HMAC-SHA256(worker key, 0xA2 | key id | rest) (32) | rest
    rest = MessagePack [v, sender, dest, ts_ms, nonce (16), body]

Member envelope (heartbeats, ShareFetches, cancels; any holder of the member key)::

    0xA3 | key id (4) | HMAC-SHA256(member key, 0xA3 | key id | rest) (32) | rest
    rest = u16 length | head | AES-256-GCM(request key, nonce, body,
                                           aad = 0xA3 | key id | u16 length | head)
    head = MessagePack [v, dest, ts_ms, nonce (12), member public key (32)]

* ``dest`` is what the sender addressed: :func:`topic_dest` (``"<topic>/<partition>"``) for
  records of the request and coordinator topics, :func:`direct_dest` for frames to a leader's
  direct endpoint; a receiver opens with the destination it received on, so a copy sent
  anywhere else is refused (``wrong_destination``);
* the key id (:func:`~queueflow.protocol.auth.key_id`) lets the receiver tell a message signed
  with another app's or secret's key (``wrong_key``) from an altered one (``bad_signature``),
  after reading 5 bytes: junk costs one HMAC at most, no X25519 and no AES;
* a member's body is encrypted to the workers' static X25519 key with the member's ephemeral
  key (:class:`~queueflow.protocol.sealed_replies.PeerCiphers`): nobody but the workers reads
  what a member sends (member ids, tickets, offsets), and the request is bound to the member's
  key, which the coordinator bound to its member id (the assignment ticket's reply key);
* a member envelope carries only member kinds (:data:`MEMBER_KINDS`; the caller checks the
  decoded kind: ``wrong_role``);
* envelopes of version 1 (``0xA1``, an earlier release) are refused (``envelope_v1``).
"""

from __future__ import annotations

import hmac
import os
import struct
import time
from collections.abc import Callable
from typing import Final

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from queueflow.protocol.auth import AuthenticationError, ReplayGuard, key_id
from queueflow.protocol.sealed_replies import PeerCiphers

__all__ = [
    "ENVELOPE_PREFIX",
    "MEMBER_FORMAT",
    "MEMBER_KINDS",
    "V1_FORMAT",
    "WORKER_FORMAT",
    "EnvelopeOpener",
    "Opened",
    "claimed_sender",
    "direct_dest",
    "direct_reply_dest",
    "reply_dest",
    "seal_member",
    "seal_worker",
    "sender_label",
    "topic_dest",
]

#: Format byte of version-1 envelopes (refused).
V1_FORMAT: Final = 0xA1
#: Format byte of a worker envelope.
WORKER_FORMAT: Final = 0xA2
#: Format byte of a member envelope.
MEMBER_FORMAT: Final = 0xA3
#: The message kinds a member envelope may carry.
MEMBER_KINDS: Final = frozenset({"fetch", "heartbeat", "fetch_cancel"})
_VERSION: Final = 2
_KEY_ID: Final = 4
_MAC: Final = 32
#: Format byte, key id and MAC: what an envelope starts with.
ENVELOPE_PREFIX: Final = 1 + _KEY_ID + _MAC
_PREFIX: Final = ENVELOPE_PREFIX
_WORKER_NONCE: Final = 16
_MEMBER_NONCE: Final = 12


def topic_dest(topic: str, partition: int) -> str:
    """The destination of a record of ``topic`` partition ``partition``."""
    return f"{topic}/{partition}"


def direct_dest(address: str) -> str:
    """The destination of a frame to the leader endpoint at ``address`` (``host:port``, as
    the leader announces it)."""
    return f"direct/{address}"


def direct_reply_dest(address: str) -> str:
    """The destination of an answer on a connection to the leader endpoint at ``address``."""
    return f"direct/{address}/reply"


def reply_dest(reply_topic: str, partition: int, route: str) -> str:
    """The destination of a reply: the reply topic partition and the record key (the
    member's reply route, or an admin's id) it is sent to."""
    return f"{reply_topic}/{partition}/{route}"


class _WorkerRest(msgspec.Struct, array_like=True, frozen=True):
    v: int
    sender: str
    dest: str
    ts_ms: int
    nonce: bytes
    body: bytes


class _MemberHead(msgspec.Struct, array_like=True, frozen=True):
    v: int
    dest: str
    ts_ms: int
    nonce: bytes
    member_pub: bytes


_encoder = msgspec.msgpack.Encoder()
_worker_decoder = msgspec.msgpack.Decoder(_WorkerRest)
_head_decoder = msgspec.msgpack.Decoder(_MemberHead)


class Opened(msgspec.Struct, frozen=True):
    """A verified message: its ``role`` (``"worker"`` or ``"member"``), the ``sender`` a worker
    named (``""`` for members), ``member_pub`` (the member's key; ``b""`` for workers), when
    it was sent (``ts_ms``, ms since the epoch) and the message ``body``."""

    role: str
    sender: str
    member_pub: bytes
    ts_ms: int
    body: bytes


def sender_label(role: str, sender: str, member_pub: bytes) -> str:
    """Who sent a message, as one string: a worker's sender id, or ``member:<hex key>`` (a
    member is known by its key; its member id is inside the encrypted body)."""
    return sender if role == "worker" else "member:" + member_pub.hex()


def claimed_sender(raw: bytes | bytearray | memoryview) -> str | None:
    """The sender a v2 envelope *claims* (:func:`sender_label`; its header unverified), or
    ``None`` when ``raw`` is not shaped as one (junk, v1, a header that doesn't decode).
    Never raises; reads at most the clear header."""
    data = bytes(raw)
    if len(data) < _PREFIX + 2 or data[0] not in (WORKER_FORMAT, MEMBER_FORMAT):
        return None
    rest = data[_PREFIX:]
    try:
        if data[0] == WORKER_FORMAT:
            return sender_label("worker", _worker_decoder.decode(rest).sender, b"")
        (n,) = struct.unpack_from(">H", rest)
        return sender_label("member", "", _head_decoder.decode(rest[2 : 2 + n]).member_pub)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, struct.error):
        return None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def seal_worker(key: bytes, sender: str, dest: str, body: bytes, now_ms: int) -> bytes:
    """A worker envelope of ``body`` for ``dest`` signed with the worker ``key``."""
    rest = _encoder.encode(
        _WorkerRest(_VERSION, sender, dest, now_ms, os.urandom(_WORKER_NONCE), body)
    )
    prefix = bytes((WORKER_FORMAT,)) + key_id(key)
    return prefix + hmac.digest(key, prefix + rest, "sha256") + rest


def seal_member(
    key: bytes, cipher: AESGCM, member_pub: bytes, dest: str, body: bytes, now_ms: int
) -> bytes:
    """A member envelope of ``body`` for ``dest``: encrypted with ``cipher`` (the member's
    request cipher with the workers' key) and signed with the ``key`` (the member key)."""
    nonce = os.urandom(_MEMBER_NONCE)
    head = _encoder.encode(_MemberHead(_VERSION, dest, now_ms, nonce, member_pub))
    prefix = bytes((MEMBER_FORMAT,)) + key_id(key)
    clear = struct.pack(">H", len(head)) + head
    rest = clear + cipher.encrypt(nonce, body, prefix + clear)
    return prefix + hmac.digest(key, prefix + rest, "sha256") + rest


class EnvelopeOpener:
    """Opens the envelopes one receiving loop gets: checks key id, MAC, destination,
    freshness, replay and (member envelopes) decrypts.

    Args:
        worker_key: accept worker envelopes signed with it (``None``: refuse them).
        member_key / ciphers: accept member envelopes signed with ``member_key``, decrypted
            with ``ciphers`` (the workers' static key pair's; ``None``: refuse them).
        window_ms / clock: as for :class:`~queueflow.protocol.auth.ReplayGuard`.
    """

    def __init__(
        self,
        *,
        worker_key: bytes | None,
        member_key: bytes | None,
        ciphers: PeerCiphers | None,
        window_ms: int,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self._keys: dict[int, tuple[bytes, bytes]] = {}
        if worker_key is not None:
            self._keys[WORKER_FORMAT] = (worker_key, key_id(worker_key))
        if member_key is not None and ciphers is not None:
            self._keys[MEMBER_FORMAT] = (member_key, key_id(member_key))
        self._ciphers = ciphers
        self.guard = ReplayGuard(window_ms=window_ms, clock=clock)

    def open(self, data: bytes | bytearray | memoryview, dest: str) -> Opened:
        """Verify ``data`` received on ``dest`` and return what it carries.

        Raises:
            AuthenticationError: ``envelope_v1``, ``unsigned``, ``malformed``, ``wrong_role``
                (a worker envelope where only members send, or vice versa), ``wrong_key``,
                ``bad_signature``, ``wrong_destination``, ``stale``, ``replay``, ``bad_seal``.
        """
        raw = bytes(data)
        fmt = raw[0] if raw else -1
        if fmt == V1_FORMAT:
            raise AuthenticationError("envelope_v1", "envelope v1 from an earlier release")
        if fmt not in (WORKER_FORMAT, MEMBER_FORMAT):
            raise AuthenticationError("unsigned", "not a signed envelope")
        held = self._keys.get(fmt)
        role = "worker" if fmt == WORKER_FORMAT else "member"
        if held is None:
            raise AuthenticationError("wrong_role", f"a {role} envelope is not accepted here")
        if len(raw) < _PREFIX + 2:
            raise AuthenticationError("malformed", f"envelope of {len(raw)} bytes")
        key, kid = held
        got = raw[1 : 1 + _KEY_ID]
        if got != kid:
            raise AuthenticationError(
                "wrong_key",
                f"signed with another key (id {got.hex()}; this app's {role} key is "
                f"{kid.hex()}): another app id or secret, or an outdated member credential",
                key_id_matches=False,
                key_id=got.hex(),
            )
        rest = raw[_PREFIX:]
        mac = hmac.digest(key, raw[: 1 + _KEY_ID] + rest, "sha256")
        if not hmac.compare_digest(raw[1 + _KEY_ID : _PREFIX], mac):
            raise AuthenticationError(
                "bad_signature",
                "signature does not match (altered)",
                key_id_matches=True,
                key_id=got.hex(),
            )
        if fmt == WORKER_FORMAT:
            return self._open_worker(rest, dest)
        return self._open_member(raw, rest, dest)

    def _check(self, sent_to: str, dest: str, ts_ms: int) -> None:
        if sent_to != dest:
            raise AuthenticationError(
                "wrong_destination", f"signed for {sent_to!r}, received on {dest!r}"
            )
        self.guard.fresh(ts_ms)

    def _open_worker(self, rest: bytes, dest: str) -> Opened:
        try:
            r = _worker_decoder.decode(rest)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise AuthenticationError("malformed", str(exc)) from None
        if r.v != _VERSION or len(r.nonce) != _WORKER_NONCE:
            raise AuthenticationError("malformed", f"envelope version {r.v}")
        self._check(r.dest, dest, r.ts_ms)
        self.guard.admit(r.nonce, r.ts_ms)
        return Opened("worker", r.sender, b"", r.ts_ms, r.body)

    def _open_member(self, raw: bytes, rest: bytes, dest: str) -> Opened:
        (n,) = struct.unpack_from(">H", rest)
        try:
            h = _head_decoder.decode(rest[2 : 2 + n])
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise AuthenticationError("malformed", str(exc)) from None
        if h.v != _VERSION or len(h.nonce) != _MEMBER_NONCE:
            raise AuthenticationError("malformed", f"envelope version {h.v}")
        self._check(h.dest, dest, h.ts_ms)
        assert self._ciphers is not None  # a member key is held only with the ciphers
        aad = raw[: 1 + _KEY_ID] + rest[: 2 + n]
        try:  # a non-canonical or low-order member key raises ValueError: never derived
            body = self._ciphers.get(h.member_pub)[0].decrypt(h.nonce, rest[2 + n :], aad)
        except (InvalidTag, ValueError):
            raise AuthenticationError(
                "bad_seal", "request not encrypted to this app's workers, or altered"
            ) from None
        self.guard.admit(h.nonce, h.ts_ms)
        return Opened("member", "", h.member_pub, h.ts_ms, body)
