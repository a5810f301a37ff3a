"""Replies only their member can read: what a reply reveals is limited to what the receiving
member needs (docs/operations.md "Who can read the replies").

Every member reads the app's one reply topic, so a signed reply (:mod:`queueflow.protocol.auth`)
is still readable by every other member and by anyone with READ on that topic: member ids,
tickets, acquired offset ranges. With ``queueflow.auth.mode=hmac`` each member therefore makes an
ephemeral X25519 key pair when it starts (:class:`ReplyKey`; the private key never leaves the
process) and sends the public key in every ShareGroupHeartbeat. The coordinator encrypts its
heartbeat answer to that key and binds it into the member's assignment ticket
(:class:`~queueflow.protocol.auth.AssignmentTicket.reply_key`), so the leaders encrypt the
member's ShareFetch answers to the key the coordinator saw, not to one a request names.

Format of a sealed reply (:class:`ReplySealer`)::

    0xE1 | sender public key (32) | nonce (12) | AES-256-GCM(key, nonce, reply, aad=recipient)

where ``key`` is HKDF-SHA256 of the X25519 shared secret of the sender's and the member's keys
(info names queueflow and this format), and the associated data is the member's public key
(a reply sealed for one member is not accepted as another's). Each server process has one key
pair (:class:`ReplySealer`), and both ends cache the derived AES key per peer key, so a reply
costs one AES-GCM operation, not a key exchange; the envelope adds 61 bytes.

The record key of a sealed reply is not the member id but :func:`reply_route` of the member's
reply key (a pseudonym: a reader of the reply topic can tell replies of one member from
another's, not whose they are); the member reads replies keyed by its member id too (answers
that could not be sealed: a refusal of a request without a valid ticket).

What the sealed reply carries inside is the signed envelope of ``hmac`` mode (sign, then
encrypt); a member accepts unsealed replies too (from servers of an earlier release, during a
rolling upgrade), which are still authenticated.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from queueflow.protocol.auth import AuthenticationError

__all__ = [
    "PUBLIC_KEY_BYTES",
    "SEALED_FORMAT",
    "SEALED_OVERHEAD",
    "ReplyKey",
    "ReplySealer",
    "is_sealed",
    "reply_route",
]

#: First byte of a sealed reply (version 1). Neither ``{`` (JSON), the binary format byte nor the
#: signed envelope's ``0xA1``.
SEALED_FORMAT: Final = 0xE1
#: Length of an X25519 public key on the wire.
PUBLIC_KEY_BYTES: Final = 32
_NONCE_BYTES: Final = 12
_TAG_BYTES: Final = 16
#: Bytes a sealed reply adds to the reply it carries.
SEALED_OVERHEAD: Final = 1 + PUBLIC_KEY_BYTES + _NONCE_BYTES + _TAG_BYTES
_INFO: Final = b"queueflow/v1/sealed-replies"
#: The field prime of X25519 (RFC 7748): canonical public keys are below it.
_X25519_P: Final = 2**255 - 19
#: Peer keys whose derived AES keys are cached at most (per sealer or member key).
_MAX_CACHED: Final = 100_000


def _raw(public: X25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _derive(private: X25519PrivateKey, peer: bytes) -> AESGCM:
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer))
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(shared)
    return AESGCM(key)


class _Cache:
    """Derived AES-GCM ciphers by peer public key, bounded (LRU)."""

    def __init__(self, private: X25519PrivateKey) -> None:
        self._private = private
        self._ciphers: OrderedDict[bytes, AESGCM] = OrderedDict()

    def get(self, peer: bytes) -> AESGCM:
        cipher = self._ciphers.get(peer)
        if cipher is None:
            cipher = self._ciphers[peer] = _derive(self._private, peer)
            if len(self._ciphers) > _MAX_CACHED:
                self._ciphers.popitem(last=False)
        else:
            self._ciphers.move_to_end(peer)
        return cipher


def reply_route(public: bytes) -> str:
    """The record key of the replies sealed to the reply key ``public`` (and of its member's
    requests): ``r-`` and 24 hex digits of its SHA-256."""
    return "r-" + hashlib.sha256(public).hexdigest()[:24]


def is_sealed(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` is a sealed reply (by its first byte)."""
    return len(data) > 0 and data[0] == SEALED_FORMAT


class ReplyKey:
    """A member's ephemeral reply key pair: its public key goes into every heartbeat, its
    private key opens the replies sealed to it. One per member (not persisted: a restarted
    member makes a new one and rejoins)."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        #: The 32-byte X25519 public key the member sends.
        self.public: bytes = _raw(self._private.public_key())
        self._ciphers = _Cache(self._private)

    def open(self, data: bytes | bytearray | memoryview) -> bytes:
        """The reply a sealed reply carries; an unsealed one is returned unchanged.

        Raises:
            AuthenticationError: ``malformed`` (too short), or ``bad_seal``: not sealed to this
                key, or altered.
        """
        raw = bytes(data)
        if not is_sealed(raw):
            return raw
        if len(raw) < SEALED_OVERHEAD:
            raise AuthenticationError("malformed", f"sealed reply of {len(raw)} bytes")
        sender = raw[1 : 1 + PUBLIC_KEY_BYTES]
        if int.from_bytes(sender, "little") >= _X25519_P:
            # X25519 ignores the top bit of a public key (RFC 7748, section 5), and a value of
            # p or more stands for the same point as its remainder: such an encoding was
            # never written by a sealer, only altered on the way.
            raise AuthenticationError(
                "bad_seal", "reply not sealed to this member's key, or altered"
            )
        nonce = raw[1 + PUBLIC_KEY_BYTES : 1 + PUBLIC_KEY_BYTES + _NONCE_BYTES]
        try:
            cipher = self._ciphers.get(sender)
            return cipher.decrypt(nonce, raw[1 + PUBLIC_KEY_BYTES + _NONCE_BYTES :], self.public)
        except (InvalidTag, ValueError):
            raise AuthenticationError(
                "bad_seal", "reply not sealed to this member's key, or altered"
            ) from None


class ReplySealer:
    """Seals replies to members' reply keys: one X25519 key pair per server process."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        self.public: bytes = _raw(self._private.public_key())
        self._ciphers = _Cache(self._private)

    def seal(self, recipient: bytes, reply: bytes) -> bytes:
        """``reply`` sealed to the member whose reply key is ``recipient`` (32 bytes).

        Raises:
            ValueError: ``recipient`` is not a valid X25519 public key.
        """
        if len(recipient) != PUBLIC_KEY_BYTES:
            raise ValueError(
                f"a reply key is {PUBLIC_KEY_BYTES} bytes (X25519), got {len(recipient)}"
            )
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers.get(recipient).encrypt(nonce, reply, recipient)
        return bytes((SEALED_FORMAT,)) + self.public + nonce + sealed
