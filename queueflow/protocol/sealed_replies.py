"""Replies only their member can read, and only the app's workers can write (docs/operations.md
"Who can read the replies").

Each member makes an ephemeral X25519 key pair when it starts (:class:`ReplyKey`; the private
key never leaves the process). The app's workers share one static X25519 key pair derived from
the worker secret (:mod:`queueflow.protocol.credentials`); members know its public key (from the
secret or from their member credential). The X25519 shared secret of the two gives, through
HKDF-SHA256 with distinct labels, two AES-256-GCM keys (:class:`PeerCiphers`):

* the *request* key: a member encrypts its requests with it (the member envelope,
  :mod:`queueflow.protocol.envelope`), so only workers read them;
* the *reply* key: workers seal their answers to the member with it (:class:`ReplySealer`), so
  only that member reads them, and a reply sealed by anyone else (another member sealing to the
  victim's public key with its own key pair) does not open: members pin the workers' key.

Format of a sealed reply (version 2)::

    0xE2 | nonce (12) | AES-256-GCM(reply key, nonce, MessagePack [v, dest, ts_ms, body],
                                    aad = 0xE2 | member's public key)

The member checks ``dest`` (the reply topic partition and route it reads, or the direct
connection it sent on), the freshness window and the nonce (a :class:`~queueflow.protocol.
auth.ReplayGuard`). A reply costs one AES-GCM operation each way: the derived keys are cached
per peer key (bounded). Version 1 sealed replies (``0xE1``, of an earlier release) are refused.

The record key of a sealed reply is :func:`reply_route` of the member's reply key (a pseudonym:
a reader of the reply topic can tell replies of one member from another's, not whose they
are; the member id travels only encrypted).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from queueflow.protocol.auth import AuthenticationError, ReplayGuard

__all__ = [
    "PUBLIC_KEY_BYTES",
    "SEALED_FORMAT",
    "SEALED_OVERHEAD",
    "PeerCiphers",
    "ReplyKey",
    "ReplySealer",
    "canonical_public_key",
    "is_sealed",
    "reply_route",
]

#: First byte of a sealed reply (version 2).
SEALED_FORMAT: Final = 0xE2
#: First byte of a version-1 sealed reply (refused).
SEALED_FORMAT_V1: Final = 0xE1
#: Length of an X25519 public key on the wire.
PUBLIC_KEY_BYTES: Final = 32
_NONCE_BYTES: Final = 12
_TAG_BYTES: Final = 16
_VERSION: Final = 2
#: Bytes a sealed reply adds to the reply it carries, besides its small header.
SEALED_OVERHEAD: Final = 1 + _NONCE_BYTES + _TAG_BYTES
_REQUEST_INFO: Final = b"queueflow/v2/member-requests"
_REPLY_INFO: Final = b"queueflow/v2/worker-replies"
#: The field prime of X25519 (RFC 7748): canonical public keys are below it.
_X25519_P: Final = 2**255 - 19
#: Peer keys whose derived AES keys are cached at most (per key pair).
_MAX_CACHED: Final = 100_000


class _Inner(msgspec.Struct, array_like=True, frozen=True):
    v: int
    dest: str
    ts_ms: int
    body: bytes


_encoder = msgspec.msgpack.Encoder()
_inner_decoder = msgspec.msgpack.Decoder(_Inner)


def _raw(public: X25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def canonical_public_key(public: bytes) -> bool:
    """Whether ``public`` is a 32-byte X25519 public key in canonical form: X25519 ignores the
    top bit (RFC 7748, section 5) and a value of p or more stands for its remainder, so other
    encodings alias a key and were never written by a ReplyKey."""
    return len(public) == PUBLIC_KEY_BYTES and int.from_bytes(public, "little") < _X25519_P


def _derive(private: X25519PrivateKey, peer: bytes) -> tuple[AESGCM, AESGCM]:
    """(request cipher, reply cipher) of ``private`` and ``peer``.

    Raises:
        ValueError: ``peer`` is not a usable X25519 public key (a low-order point).
    """
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer))
    pair = []
    for info in (_REQUEST_INFO, _REPLY_INFO):
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)
        pair.append(AESGCM(key))
    return pair[0], pair[1]


class PeerCiphers:
    """The request and reply AES-GCM ciphers of one key pair with each peer public key,
    derived once per peer (X25519 + HKDF) and cached (bounded, least recently used out).

    Args:
        private: this side's X25519 private key (the workers' static one, or a member's).
    """

    def __init__(self, private: X25519PrivateKey) -> None:
        self._private = private
        self._ciphers: OrderedDict[bytes, tuple[AESGCM, AESGCM]] = OrderedDict()

    def get(self, peer: bytes) -> tuple[AESGCM, AESGCM]:
        """``(request cipher, reply cipher)`` with ``peer``.

        Raises:
            ValueError: ``peer`` is not a canonical, usable X25519 public key.
        """
        pair = self._ciphers.get(peer)
        if pair is None:
            if not canonical_public_key(peer):
                raise ValueError("not a canonical 32-byte X25519 public key")
            pair = self._ciphers[peer] = _derive(self._private, peer)
            if len(self._ciphers) > _MAX_CACHED:
                self._ciphers.popitem(last=False)
        else:
            self._ciphers.move_to_end(peer)
        return pair


def reply_route(public: bytes) -> str:
    """The record key of the replies sealed to the reply key ``public``: ``r-`` and 24 hex
    digits of its SHA-256."""
    return "r-" + hashlib.sha256(public).hexdigest()[:24]


def is_sealed(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` is a sealed reply (by its first byte)."""
    return len(data) > 0 and data[0] == SEALED_FORMAT


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplyKey:
    """A member's ephemeral reply key pair, pinned to the workers' static public key.

    Its public key goes into every heartbeat and every member envelope; its private key opens
    the replies the workers sealed to it. One per member (not persisted: a restarted member
    makes a new one and rejoins).

    Args:
        workers_public: the workers' static X25519 public key (from the secret or the member
            credential); replies sealed with any other key are refused.

    Raises:
        ValueError: ``workers_public`` is not a valid X25519 public key.
    """

    def __init__(self, workers_public: bytes) -> None:
        self._private = X25519PrivateKey.generate()
        #: The 32-byte X25519 public key the member sends.
        self.public: bytes = _raw(self._private.public_key())
        self.workers_public = workers_public
        #: The cipher the member encrypts its requests with, and the one replies open with.
        self.request_cipher, self._reply_cipher = PeerCiphers(self._private).get(workers_public)
        self._aad = bytes((SEALED_FORMAT,)) + self.public

    def open(self, data: bytes | bytearray | memoryview, dest: str, guard: ReplayGuard) -> bytes:
        """The reply a sealed reply carries, checked for destination, freshness and replay.

        Args:
            data: the record value or frame.
            dest: where it was received (:func:`~queueflow.protocol.envelope.reply_dest` or
                :func:`~queueflow.protocol.envelope.direct_dest`).
            guard: the replay guard of that receiver.

        Raises:
            AuthenticationError: ``envelope_v1``, ``unsigned`` (not a sealed reply),
                ``malformed``, ``bad_seal`` (not sealed by the app's workers to this key, or
                altered), ``wrong_destination``, ``stale``, ``replay``.
        """
        raw = bytes(data)
        if raw[:1] == bytes((SEALED_FORMAT_V1,)):
            raise AuthenticationError("envelope_v1", "sealed reply v1 from an earlier release")
        if not is_sealed(raw):
            raise AuthenticationError("unsigned", "not a sealed reply")
        if len(raw) < SEALED_OVERHEAD:
            raise AuthenticationError("malformed", f"sealed reply of {len(raw)} bytes")
        nonce = raw[1 : 1 + _NONCE_BYTES]
        try:
            plain = self._reply_cipher.decrypt(nonce, raw[1 + _NONCE_BYTES :], self._aad)
        except (InvalidTag, ValueError):
            raise AuthenticationError(
                "bad_seal", "reply not sealed by this app's workers to this member, or altered"
            ) from None
        try:
            inner = _inner_decoder.decode(plain)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise AuthenticationError("malformed", str(exc)) from None
        if inner.v != _VERSION:
            raise AuthenticationError("malformed", f"sealed reply version {inner.v}")
        if inner.dest != dest:
            raise AuthenticationError(
                "wrong_destination", f"sealed for {inner.dest!r}, received on {dest!r}"
            )
        guard.fresh(inner.ts_ms)
        guard.admit(nonce, inner.ts_ms)
        return inner.body


class ReplySealer:
    """Seals replies to members' reply keys with the workers' static key pair.

    Args:
        private: the workers' static X25519 private key
            (:attr:`~queueflow.protocol.credentials.Credentials.workers_private`).
        clock: milliseconds since the epoch (injectable for tests).
    """

    def __init__(self, private: X25519PrivateKey, clock: Callable[[], int] = _now_ms) -> None:
        self.public: bytes = _raw(private.public_key())
        #: The ciphers with each member's key (shared with the envelope opener).
        self.ciphers = PeerCiphers(private)
        self._clock = clock

    def seal(self, recipient: bytes, reply: bytes, dest: str) -> bytes:
        """``reply`` sealed to the member whose reply key is ``recipient`` (32 bytes), for
        ``dest`` (where it is sent).

        Raises:
            ValueError: ``recipient`` is not a valid X25519 public key.
        """
        if len(recipient) != PUBLIC_KEY_BYTES:
            raise ValueError(
                f"a reply key is {PUBLIC_KEY_BYTES} bytes (X25519), got {len(recipient)}"
            )
        nonce = os.urandom(_NONCE_BYTES)
        inner = _encoder.encode(_Inner(_VERSION, dest, self._clock(), reply))
        aad = bytes((SEALED_FORMAT,)) + recipient
        sealed = self.ciphers.get(recipient)[1].encrypt(nonce, inner, aad)
        return bytes((SEALED_FORMAT,)) + nonce + sealed
