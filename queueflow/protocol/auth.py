"""Authentication of control messages: a signed, versioned envelope and assignment tickets.

Threat model (docs/operations.md "Threat model and attack matrix"): an attacker can
read and write queueflow's internal topics (and may reach a leader's direct TCP port) but is not a
worker of the app. The app's workers are trusted and share one secret
(``queueflow.auth.secret``). Everything here is pure (stdlib :mod:`hmac` and msgspec), so the
leader, the coordinator and members use the same code, and it is tested without Kafka.

Envelope
--------
:meth:`Signer.seal` wraps the encoded bytes of one message (JSON or binary, see
:mod:`queueflow.protocol.messages`) as::

    0xA1 | HMAC-SHA256(key, header || body) (32 bytes) | MessagePack [v, sender, ts_ms, nonce, body]

* ``0xA1`` is the envelope format byte (version 1). It is neither ``{`` (a JSON message) nor the
  binary message format byte, so an unsigned message is recognised and refused, not mis-parsed;
* ``key`` is :func:`derive_key` of the secret and the Faust app id: two apps sharing a secret by
  mistake still can't drive each other;
* the MAC covers the sender member id, the timestamp (ms since the epoch), a 16-byte random nonce
  and the body: a member id can't be moved onto another member's message, a message can't be
  altered, and :class:`Verifier` refuses one outside the freshness window or seen before in it.

Assignment tickets
------------------
:func:`issue_ticket` is what a coordinator hands a member in its heartbeat answer: its group,
member id, member epoch, assigned share-partitions and an expiry, MAC'd under a key of its own
purpose (a sealed message can't pass as a ticket). A leader checks it with :func:`verify_ticket`
without asking anyone (KIP-932 checks membership, epoch and assignment on every ShareFetch; here
the proof travels with the request).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

import msgspec

from queueflow.errors import InvalidRequestError

__all__ = [
    "DEFAULT_WINDOW_MS",
    "ENVELOPE_FORMAT",
    "AssignmentTicket",
    "AuthenticationError",
    "Opened",
    "Signer",
    "Verifier",
    "derive_key",
    "issue_ticket",
    "ticket_key",
    "verify_ticket",
]

#: The envelope's format byte (version 1 of the signed envelope).
ENVELOPE_FORMAT: Final = 0xA1
#: How far a message's timestamp may be from the receiver's clock (either way), in ms.
DEFAULT_WINDOW_MS: Final = 60_000
_MAC_BYTES: Final = 32
_NONCE_BYTES: Final = 16
_ENVELOPE_VERSION: Final = 1
# A single bound on what an authenticated sender can make a receiver remember: past it the
# oldest nonces are forgotten early, and messages of that age are refused as stale instead.
_MAX_NONCES: Final = 1_000_000


class AuthenticationError(InvalidRequestError):
    """A message is unsigned, wrongly signed, stale, replayed or its envelope is malformed.

    A subclass of :class:`~queueflow.errors.InvalidRequestError` (``INVALID_REQUEST``), so every
    place that already drops malformed control messages drops these too. ``reason`` is one of
    ``"unsigned"``, ``"malformed"``, ``"bad_signature"``, ``"stale"``, ``"replay"``; the message
    never contains key material.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"unauthenticated control message ({reason}): {detail}")
        self.reason = reason


def derive_key(secret: str | bytes, app_id: str, purpose: str = "messages") -> bytes:
    """The 32-byte HMAC key of ``app_id`` for ``purpose`` (``"messages"`` or ``"tickets"``).

    HMAC-SHA256 keyed with the secret over a label naming queueflow, the envelope version, the
    purpose and the app id (the extract-and-expand step of HKDF with one output block).

    Raises:
        ValueError: the secret is empty.
    """
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not raw:
        raise ValueError("queueflow.auth.secret is empty")
    label = f"queueflow/v{_ENVELOPE_VERSION}/{purpose}/{app_id}".encode()
    return hmac.new(raw, label, hashlib.sha256).digest()


class _Header(msgspec.Struct, array_like=True, frozen=True):
    v: int
    sender: str
    ts_ms: int
    nonce: bytes
    body: bytes


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_Header)


class Opened(msgspec.Struct, frozen=True):
    """A verified message: who sent it (member or process id), when (ms since the epoch), and
    the message bytes for :func:`~queueflow.protocol.messages.decode` or ``decode_binary``."""

    sender: str
    ts_ms: int
    body: bytes


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Signer:
    """Seals the messages one process sends.

    Args:
        key: from :func:`derive_key` (``purpose="messages"``).
        sender: the member id (members) or process id (leaders, coordinators) bound into every
            signature; receivers compare it with the member id the message names.
        clock: milliseconds since the epoch (injectable for tests).
    """

    def __init__(self, key: bytes, sender: str, clock: Callable[[], int] = _now_ms) -> None:
        self._key = key
        self.sender = sender
        self._clock = clock

    def seal(self, body: bytes) -> bytes:
        """The envelope of ``body`` (the encoded message), signed now with a fresh nonce."""
        header = _encoder.encode(
            _Header(_ENVELOPE_VERSION, self.sender, self._clock(), os.urandom(_NONCE_BYTES), body)
        )
        mac = hmac.new(self._key, header, hashlib.sha256).digest()
        return bytes((ENVELOPE_FORMAT,)) + mac + header


class Verifier:
    """Opens envelopes: checks the signature, the freshness window and replays.

    Args:
        key: the same key the senders' :class:`Signer` uses.
        window_ms: largest allowed distance between a message's timestamp and this clock (ms);
            nonces are remembered for twice that, so a replay is refused as long as it is fresh.
        clock: milliseconds since the epoch (injectable for tests).

    Not thread-safe; one per receiving agent or connection handler (all on one event loop).
    """

    def __init__(
        self,
        key: bytes,
        *,
        window_ms: int = DEFAULT_WINDOW_MS,
        clock: Callable[[], int] = _now_ms,
        max_nonces: int = _MAX_NONCES,
    ) -> None:
        if window_ms <= 0:
            raise ValueError(f"window_ms must be positive, not {window_ms}")
        self._key = key
        self._window = window_ms
        self._clock = clock
        self._max = max_nonces
        self._seen: OrderedDict[bytes, int] = OrderedDict()
        # Messages at or before this time are refused: their nonces may have been forgotten.
        self._floor = -(2**63)

    def open(self, data: bytes | bytearray | memoryview) -> Opened:
        """Verify ``data`` and return what it carries.

        Raises:
            AuthenticationError: unsigned, malformed, bad signature, outside the freshness
                window, or a nonce already seen (a replay).
        """
        raw = bytes(data)
        if not raw or raw[0] != ENVELOPE_FORMAT:
            raise AuthenticationError("unsigned", "not a signed envelope")
        if len(raw) < 1 + _MAC_BYTES + 1:
            raise AuthenticationError("malformed", f"envelope of {len(raw)} bytes")
        mac, header = raw[1 : 1 + _MAC_BYTES], raw[1 + _MAC_BYTES :]
        # Check the MAC before parsing anything: an attacker's bytes reach no decoder.
        if not hmac.compare_digest(mac, hmac.new(self._key, header, hashlib.sha256).digest()):
            raise AuthenticationError("bad_signature", "signature does not match")
        try:
            h = _header_decoder.decode(header)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise AuthenticationError("malformed", str(exc)) from None
        if h.v != _ENVELOPE_VERSION or len(h.nonce) != _NONCE_BYTES:
            raise AuthenticationError("malformed", f"envelope version {h.v}")
        now = self._clock()
        if abs(now - h.ts_ms) > self._window or h.ts_ms <= self._floor:
            raise AuthenticationError(
                "stale", f"sent at {h.ts_ms} ms, now {now} ms (window {self._window} ms)"
            )
        self._forget(now)
        if h.nonce in self._seen:
            raise AuthenticationError("replay", f"nonce already seen from {h.sender!r}")
        self._seen[h.nonce] = h.ts_ms
        if len(self._seen) > self._max:
            _, ts = self._seen.popitem(last=False)
            self._floor = max(self._floor, ts)
        return Opened(h.sender, h.ts_ms, h.body)

    def _forget(self, now: int) -> None:
        # Nonces are inserted in arrival order; timestamps are within the window of arrival,
        # so anything inserted more than two windows ago can no longer be fresh.
        horizon = now - 2 * self._window
        while self._seen:
            nonce, ts = next(iter(self._seen.items()))
            if ts >= horizon:
                break
            del self._seen[nonce]

    @property
    def remembered(self) -> int:
        """How many nonces are remembered now (for tests and metrics)."""
        return len(self._seen)


class AssignmentTicket(msgspec.Struct, array_like=True, frozen=True):
    """A coordinator's proof of membership (KIP-932 ShareGroupHeartbeat's assignment).

    Fields: ``group``, ``member_id``, ``member_epoch``, ``partitions`` (sorted
    ``(topic, partition)`` pairs assigned to the member), ``expires_ms`` (ms since the epoch),
    ``coordinator_epoch`` (the issuing coordinator's epoch, -1: unknown; leaders refuse
    acquisitions with a ticket of a coordinator older than one they have seen for the group),
    ``reply_key`` (the member's X25519 reply key from its heartbeat, empty: none; leaders seal
    the member's answers to it, :mod:`queueflow.protocol.sealed_replies`).
    ``config_version`` and ``configs``: the group's configs that leaders apply (sorted
    ``(name, value)`` pairs that differ from the broker-level settings; docs/operations.md
    "Group configs") and their version, so that a leader learns them from the same unforgeable
    proof;
    ``added_partitions``: ``(topic, first partition added at runtime)`` pairs of the group's
    topics that grew (those share-partitions start at the log start). The last three are
    optional trailing fields: tickets without them decode with none.
    """

    group: str
    member_id: str
    member_epoch: int
    partitions: tuple[tuple[str, int], ...]
    expires_ms: int
    coordinator_epoch: int = -1
    reply_key: bytes = b""
    config_version: int = 0
    configs: tuple[tuple[str, str], ...] = ()
    added_partitions: tuple[tuple[str, int], ...] = ()

    def covers(self, topic: str, partition: int) -> bool:
        """Whether the ticket assigns ``topic``-``partition`` to its member."""
        return (topic, partition) in self.partitions


_ticket_decoder = msgspec.msgpack.Decoder(AssignmentTicket)


def issue_ticket(
    key: bytes,
    *,
    group: str,
    member_id: str,
    member_epoch: int,
    partitions: Iterable[tuple[str, int]],
    ttl_ms: int,
    now_ms: int | None = None,
    coordinator_epoch: int = -1,
    reply_key: bytes = b"",
    config_version: int = 0,
    configs: Iterable[tuple[str, str]] = (),
    added_partitions: Iterable[tuple[str, int]] = (),
) -> bytes:
    """Sign an :class:`AssignmentTicket` valid for ``ttl_ms`` (about the session timeout).

    Args:
        key: :func:`derive_key` with ``purpose="tickets"``.
        coordinator_epoch: the issuing coordinator's epoch (-1: unknown).
        reply_key: the member's reply key (32 bytes, or empty), bound into the ticket.
        config_version / configs / added_partitions: for the group's leaders (see the ticket).
    """
    now = _now_ms() if now_ms is None else now_ms
    body = _encoder.encode(
        AssignmentTicket(
            group,
            member_id,
            member_epoch,
            tuple(sorted(partitions)),
            now + ttl_ms,
            coordinator_epoch,
            reply_key,
            config_version,
            tuple(sorted(configs)),
            tuple(sorted(added_partitions)),
        )
    )
    return hmac.new(key, body, hashlib.sha256).digest() + body


def verify_ticket(key: bytes, data: bytes, *, now_ms: int | None = None) -> AssignmentTicket:
    """Check a ticket's MAC and expiry and return it.

    The caller still compares the ticket's group, member id and epoch with the request's and
    keeps the highest epoch seen per member (a newer ticket fences the older ones).

    Raises:
        AuthenticationError: ``bad_signature``, ``malformed`` or ``stale`` (expired).
    """
    raw = bytes(data)
    if len(raw) <= _MAC_BYTES:
        raise AuthenticationError("malformed", f"ticket of {len(raw)} bytes")
    mac, body = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
    if not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).digest()):
        raise AuthenticationError("bad_signature", "ticket signature does not match")
    try:
        ticket = _ticket_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise AuthenticationError("malformed", str(exc)) from None
    now = _now_ms() if now_ms is None else now_ms
    if now >= ticket.expires_ms:
        raise AuthenticationError("stale", f"ticket expired at {ticket.expires_ms} ms")
    return ticket


#: The stand-in secret of ``queueflow.auth.mode=none``: tickets are still MAC'd, so a ticket a
#: member altered by mistake, or a member id that never joined, is refused, but anyone who
#: knows the app id can compute this key. Not a security boundary (docs/operations.md).
UNAUTHENTICATED_TICKET_SECRET: Final = "queueflow/unauthenticated-tickets"


def ticket_key(mode: str, secret: str, app_id: str) -> bytes:
    """The key coordinators issue and leaders verify assignment tickets with.

    ``mode`` ``"hmac"``: :func:`derive_key` of ``secret`` (``purpose="tickets"``), so only the
    app's workers can issue a ticket. ``"none"``: derived from
    :data:`UNAUTHENTICATED_TICKET_SECRET` and the app id, so tickets catch mistakes (a member id
    that never joined, a stale epoch, a share-partition not assigned) but not an attacker.

    Raises:
        ValueError: ``mode`` is unknown, or ``"hmac"`` without a secret.
    """
    if mode == "hmac":
        return derive_key(secret, app_id, "tickets")
    if mode == "none":
        return derive_key(UNAUTHENTICATED_TICKET_SECRET, app_id, "tickets")
    raise ValueError(f"queueflow.auth.mode={mode!r}: choose hmac or none")


#: Messages a member sends: their signed sender must be the member id they name.
_MEMBER_KINDS: Final = frozenset({"fetch", "heartbeat", "fetch_cancel"})


class ControlAuth:
    """One sender's and receiver's view of ``queueflow.auth.mode`` (see the module docstring).

    Args:
        mode: ``"hmac"`` (sign and verify) or ``"none"`` (pass bytes through unchanged).
        secret: ``queueflow.auth.secret``; required for ``"hmac"``.
        app_id: the Faust app id (the internal topics' namespace).
        sender: what this process signs as: its member id (members) or a server id.
        window_ms / clock: as for :class:`Verifier`.

    Each receiving loop (a leader, a coordinator, a member's reply reader, a direct connection)
    has its own instance, so its replay cache sees each message once.

    Raises:
        ValueError: ``mode`` is unknown, or ``"hmac"`` without a secret.
    """

    def __init__(
        self,
        mode: str,
        secret: str,
        app_id: str,
        sender: str,
        *,
        window_ms: int = DEFAULT_WINDOW_MS,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        if mode not in ("none", "hmac"):
            raise ValueError(f"queueflow.auth.mode={mode!r}: choose hmac or none")
        self.enabled = mode == "hmac"
        self.sender = sender
        self._signer: Signer | None = None
        self._verifier: Verifier | None = None
        if self.enabled:
            key = derive_key(secret, app_id)
            self._signer = Signer(key, sender, clock)
            self._verifier = Verifier(key, window_ms=window_ms, clock=clock)

    def for_sender(self, sender: str) -> ControlAuth:
        """A copy signing as ``sender`` with the same key and its own replay cache."""
        twin = object.__new__(ControlAuth)
        twin.enabled, twin.sender = self.enabled, sender
        twin._signer = twin._verifier = None
        if self._signer is not None and self._verifier is not None:
            twin._signer = Signer(self._signer._key, sender, self._signer._clock)
            twin._verifier = Verifier(
                self._verifier._key, window_ms=self._verifier._window, clock=self._verifier._clock
            )
        return twin

    def seal(self, body: bytes) -> bytes:
        """``body`` signed (``hmac``) or unchanged (``none``)."""
        return body if self._signer is None else self._signer.seal(body)

    def open(self, data: bytes | bytearray | memoryview) -> bytes:
        """The message bytes of ``data`` once verified (``hmac``), or ``data`` (``none``).

        Raises:
            AuthenticationError: as :meth:`Verifier.open`.
        """
        if self._verifier is None:
            return bytes(data)
        opened = self._verifier.open(data)
        self.last_sender = opened.sender
        return opened.body

    def check_sender(self, message: object) -> None:
        """Refuse a member's message (fetch, heartbeat, cancel) whose signed sender is not the
        member id it names (one member can't act for another). Call right after :meth:`open`.

        Raises:
            AuthenticationError: reason ``bad_sender``.
        """
        if self._verifier is None or getattr(message, "kind", None) not in _MEMBER_KINDS:
            return
        member_id = getattr(message, "member_id", None)
        if member_id != self.last_sender:
            raise AuthenticationError(
                "bad_sender", f"signed by {self.last_sender!r} but names member {member_id!r}"
            )

    last_sender: str = ""
