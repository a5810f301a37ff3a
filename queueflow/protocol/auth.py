"""Authentication of control messages: keys, the replay guard and assignment tickets.

Threat model (docs/operations.md "Threat model and attack matrix"): an attacker can read and
write queueflow's internal topics (and may reach a leader's direct TCP port) but holds no key of
the app. Workers hold the worker secret (``queueflow.auth.secret``); members hold either it or a
member credential (:mod:`queueflow.protocol.credentials`), which signs member messages only.
Everything here is pure (stdlib :mod:`hmac`, msgspec), so leaders, coordinators and members use
the same code, and it is tested without Kafka.

* :func:`derive_key` derives every key of an app from the worker secret, one per purpose;
  :func:`key_id` names a key (4 bytes, in the clear header of every envelope, so a receiver can
  tell "signed with another key" from "altered");
* :class:`ReplayGuard` refuses messages outside the freshness window or seen before in it;
* the envelopes themselves are :mod:`queueflow.protocol.envelope`; the per-role view of them is
  :class:`queueflow.protocol.roles.ControlAuth`.

Assignment tickets
------------------
:func:`issue_ticket` is what a coordinator hands a member in its heartbeat answer: its group,
member id, member epoch, assigned share-partitions, its reply key and an expiry, MAC'd under a
key of its own purpose (only workers hold it: a member credential can't issue a ticket). A
leader checks it with :func:`verify_ticket` without asking anyone (KIP-932 checks membership,
epoch and assignment on every ShareFetch; here the proof travels with the request).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

import msgspec

from queueflow.errors import InvalidRequestError

__all__ = [
    "DEFAULT_WINDOW_MS",
    "MAX_EPOCH",
    "AssignmentTicket",
    "AuthenticationError",
    "ReplayGuard",
    "check_bound",
    "derive_key",
    "issue_ticket",
    "key_id",
    "ticket_configs",
    "ticket_key",
    "verify_ticket",
]

#: How far a message's timestamp may be from the receiver's clock (either way), in ms.
DEFAULT_WINDOW_MS: Final = 60_000
#: The largest member, group, coordinator or leader epoch and group config version a receiver
#: accepts, whatever the signature (docs/operations.md "Threat model and attack matrix"): one
#: rebalance a second for 68 years; a value above it can only come from a forger or a bug, and
#: would fence every honest sender for good.
MAX_EPOCH: Final = 2**31
_MAC_BYTES: Final = 32
#: Key derivation label version (the envelope version that introduced the labels).
_KEY_VERSION: Final = 2
# A single bound on what an authenticated sender can make a receiver remember: past it the
# oldest nonces are forgotten early, and messages of that age are refused as stale instead.
_MAX_NONCES: Final = 1_000_000


class AuthenticationError(InvalidRequestError):
    """A message is unsigned, wrongly signed, misaddressed, stale, replayed or malformed.

    A subclass of :class:`~queueflow.errors.InvalidRequestError` (``INVALID_REQUEST``), so every
    place that already drops malformed control messages drops these too. ``reason`` is one of
    ``"unsigned"``, ``"malformed"``, ``"envelope_v1"``, ``"wrong_key"`` (signed with a key of
    another app or secret: its key id differs), ``"bad_signature"`` (this app's key id, but the
    MAC does not match: altered), ``"wrong_destination"``, ``"wrong_role"`` (a worker message
    in a member envelope), ``"wrong_member"`` (a member acting for another member id),
    ``"stale"``, ``"replay"``, ``"bad_seal"`` (a reply not sealed by this app's workers),
    ``"absurd_value"`` (an epoch or version above :data:`MAX_EPOCH`).

    ``key_id_matches``: whether the envelope's key id was this app's (``None``: not known, the
    check did not get that far). ``key_id``: the envelope's key id (hex, ``""``: unknown). The
    message never contains key material.
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        key_id_matches: bool | None = None,
        key_id: str = "",
    ) -> None:
        super().__init__(f"unauthenticated control message ({reason}): {detail}")
        self.reason = reason
        self.key_id_matches = key_id_matches
        self.key_id = key_id


def derive_key(secret: str | bytes, app_id: str, purpose: str = "worker") -> bytes:
    """The 32-byte key of ``app_id`` for ``purpose`` (``"worker"``, ``"member"``,
    ``"tickets"``, ``"worker-x25519"``...).

    HMAC-SHA256 keyed with the secret over a label naming queueflow, the key version, the
    purpose and the app id (the extract-and-expand step of HKDF with one output block).

    Raises:
        ValueError: the secret is empty.
    """
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not raw:
        raise ValueError("queueflow.auth.secret is empty")
    label = f"queueflow/v{_KEY_VERSION}/{purpose}/{app_id}".encode()
    return hmac.new(raw, label, hashlib.sha256).digest()


@functools.lru_cache(maxsize=64)
def key_id(key: bytes) -> bytes:
    """The 4-byte id of ``key``: the first bytes of HMAC-SHA256(key, ``b"key-id"``). Sent in
    the clear: it tells receivers which key signed, not the key."""
    return hmac.new(key, b"key-id", hashlib.sha256).digest()[:4]


def check_bound(what: str, value: int) -> None:
    """Refuse an epoch or version above :data:`MAX_EPOCH`, whoever signed it.

    Raises:
        AuthenticationError: reason ``absurd_value``, naming ``what``.
    """
    if value > MAX_EPOCH:
        raise AuthenticationError(
            "absurd_value", f"{what} {value} is above {MAX_EPOCH}: refused whoever signed it"
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplayGuard:
    """Refuses messages outside the freshness window or whose nonce was seen in it.

    Args:
        window_ms: largest allowed distance between a message's timestamp and this clock (ms);
            nonces are remembered for twice that, so a replay is refused as long as it is fresh.
        clock: milliseconds since the epoch (injectable for tests).
        max_nonces: nonces remembered at most (past it the oldest are forgotten and messages
            of their age refused as stale).

    Not thread-safe; one per receiving loop (all on one event loop).
    """

    def __init__(
        self,
        *,
        window_ms: int = DEFAULT_WINDOW_MS,
        clock: Callable[[], int] = _now_ms,
        max_nonces: int = _MAX_NONCES,
    ) -> None:
        if window_ms <= 0:
            raise ValueError(f"window_ms must be positive, not {window_ms}")
        self.window = window_ms
        self.clock = clock
        self._max = max_nonces
        self._seen: OrderedDict[bytes, int] = OrderedDict()
        # Messages at or before this time are refused: their nonces may have been forgotten.
        self._floor = -(2**63)

    def fresh(self, ts_ms: int) -> None:
        """Refuse a message sent at ``ts_ms`` outside the window (``stale``).

        Raises:
            AuthenticationError: ``stale``.
        """
        now = self.clock()
        if abs(now - ts_ms) > self.window or ts_ms <= self._floor:
            raise AuthenticationError(
                "stale", f"sent at {ts_ms} ms, now {now} ms (window {self.window} ms)"
            )

    def admit(self, nonce: bytes, ts_ms: int) -> None:
        """Remember ``nonce`` (call after :meth:`fresh` and every other check passed).

        Raises:
            AuthenticationError: ``replay`` (seen before).
        """
        self._forget(self.clock())
        if nonce in self._seen:
            raise AuthenticationError("replay", "nonce already seen")
        self._seen[nonce] = ts_ms
        if len(self._seen) > self._max:
            _, ts = self._seen.popitem(last=False)
            self._floor = max(self._floor, ts)

    def _forget(self, now: int) -> None:
        # Nonces are inserted in arrival order; timestamps are within the window of arrival,
        # so anything inserted more than two windows ago can no longer be fresh.
        horizon = now - 2 * self.window
        while self._seen:
            nonce, ts = next(iter(self._seen.items()))
            if ts >= horizon:
                break
            del self._seen[nonce]

    @property
    def remembered(self) -> int:
        """How many nonces are remembered now (for tests and metrics)."""
        return len(self._seen)


_encoder = msgspec.msgpack.Encoder()


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
    topics that grew (those share-partitions start at the log start);
    ``principal``: the Kafka principal the member declared in its heartbeat (``User:<name>``
    with SASL; empty: not known), authenticated by its member credential, not checked against
    the broker. The trailing optional fields decode with their defaults when absent.
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
    principal: str = ""

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
    principal: str = "",
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
            principal,
        )
    )
    return hmac.new(key, body, hashlib.sha256).digest() + body


def verify_ticket(key: bytes, data: bytes, *, now_ms: int | None = None) -> AssignmentTicket:
    """Check a ticket's MAC and expiry and return it.

    The caller still compares the ticket's group, member id and epoch with the request's and
    keeps the highest epoch seen per member (a newer ticket fences the older ones).

    Raises:
        AuthenticationError: ``bad_signature``, ``malformed``, ``stale`` (expired) or
            ``absurd_value`` (an epoch or config version above :data:`MAX_EPOCH`).
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
    check_bound("ticket member epoch", ticket.member_epoch)
    check_bound("ticket coordinator epoch", ticket.coordinator_epoch)
    check_bound("ticket group config version", ticket.config_version)
    now = _now_ms() if now_ms is None else now_ms
    if now >= ticket.expires_ms:
        raise AuthenticationError("stale", f"ticket expired at {ticket.expires_ms} ms")
    return ticket


def ticket_configs(data: bytes) -> dict[str, str]:
    """The group configs a ticket carries (those that differ from the broker-level settings),
    read without checking its MAC: for the member the ticket was issued to, which can't verify
    it and only reads what its group is configured with (``share.ordering``). ``{}`` for an
    empty or unreadable ticket."""
    try:
        return dict(_ticket_decoder.decode(bytes(data)[_MAC_BYTES:]).configs)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, ValueError):
        return {}


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
