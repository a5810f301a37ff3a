"""One process's view of ``queueflow.auth.mode``: what it may sign and what it accepts.

:class:`ControlAuth` is built per receiving loop (a leader, the coordinator, the ticker, the
direct endpoint, a member's reply reader, a direct connection), each with its own replay guard:

* a worker (``role="worker"``, needs the worker secret) seals worker envelopes, opens worker and
  member envelopes, and seals replies to members (:class:`~queueflow.protocol.sealed_replies.
  ReplySealer`, the workers' static key);
* a member (``role="member"``, the secret or a member credential) seals member envelopes
  encrypted to the workers' key and opens only replies sealed by the workers to its reply key.

After decoding an opened message, a worker calls :meth:`ControlAuth.check_sender`: a member
envelope may carry only member kinds (``wrong_role``), and binds the message to the member's key
(a heartbeat's reply key, a ShareFetch's ticket's reply key: ``wrong_member``); every message's
epochs and versions are bounded (:func:`check_values`, ``absurd_value``).

With ``queueflow.auth.mode=none`` everything passes through unchanged.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Final

from queueflow.errors import ConfigurationError
from queueflow.protocol.auth import DEFAULT_WINDOW_MS, AuthenticationError, ReplayGuard, check_bound
from queueflow.protocol.credentials import Credentials
from queueflow.protocol.envelope import (
    MEMBER_KINDS,
    EnvelopeOpener,
    Opened,
    seal_member,
    seal_worker,
    sender_label,
)
from queueflow.protocol.sealed_replies import ReplyKey, ReplySealer
from queueflow.settings import AuthMode, ShareGroupSettings

__all__ = ["BOUNDED_FIELDS", "ControlAuth", "check_values", "refusal_labels"]

#: The fields of control messages bounded by :data:`~queueflow.protocol.auth.MAX_EPOCH`.
BOUNDED_FIELDS: Final = (
    "member_epoch",
    "coordinator_epoch",
    "leader_epoch",
    "group_epoch",
    "config_version",
)


def check_values(message: object) -> None:
    """Refuse a message whose epochs or versions are absurd (:data:`BOUNDED_FIELDS` above
    :data:`~queueflow.protocol.auth.MAX_EPOCH`), whoever signed it.

    Raises:
        AuthenticationError: ``absurd_value``.
    """
    for name in BOUNDED_FIELDS:
        value = getattr(message, name, None)
        if isinstance(value, int):
            check_bound(f"{getattr(message, 'kind', '?')} {name}", value)


def refusal_labels(exc: BaseException) -> tuple[str, bool | None]:
    """``(reason, key id matched)`` of a refused control message, for metrics and logs:
    the :class:`~queueflow.protocol.auth.AuthenticationError` reason (``"undecodable"`` for
    any other error) and whether the envelope's key id was this app's (``None``: unknown)."""
    if isinstance(exc, AuthenticationError):
        return exc.reason, exc.key_id_matches
    return "undecodable", None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@functools.lru_cache(maxsize=16)
def _sealer(creds: Credentials) -> ReplySealer:
    # One per process and app: the opener's and the sealer's ECDH results are shared.
    assert creds.workers_private is not None
    return ReplySealer(creds.workers_private)


def credentials(settings: ShareGroupSettings, app_id: str) -> Credentials | None:
    """The credentials ``settings`` give for ``app_id`` (``None``: mode ``none``).

    Raises:
        ConfigurationError: hmac without a usable secret or credential (weak secret, a
            credential of another app, not a credential).
    """
    if settings.control_auth_mode is not AuthMode.HMAC:
        return None
    return Credentials.resolve(settings.auth_secret, settings.auth_member_credential, app_id)


class ControlAuth:
    """Seals what one loop sends and opens what it receives (see the module docstring).

    Args:
        creds: the process's credentials (``None``: ``queueflow.auth.mode=none``).
        sender: what a worker names itself in its envelopes (a server id or admin id).
        role: ``"worker"`` (needs the worker secret) or ``"member"``.
        window_ms / clock: the freshness window and clock (ms).

    Raises:
        ConfigurationError: ``role="worker"`` with only a member credential.
    """

    def __init__(
        self,
        creds: Credentials | None,
        sender: str = "",
        *,
        role: str = "worker",
        window_ms: int = DEFAULT_WINDOW_MS,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        if role not in ("worker", "member"):
            raise ValueError(f"role {role!r}: worker or member")
        if creds is not None and role == "worker" and not creds.is_worker:
            raise ConfigurationError(
                "this process has only a member credential (queueflow.auth.member.credential) "
                "but runs as a worker or admin: workers and admins need queueflow.auth.secret"
            )
        self.creds = creds
        self.enabled = creds is not None
        self.sender = sender
        self.role = role
        self._window = window_ms
        self._clock = clock
        #: The last message :meth:`open` verified (``None``: none yet, or mode ``none``).
        self.last: Opened | None = None
        self.reply_key: ReplyKey | None = None
        self._opener: EnvelopeOpener | None = None
        self._guard = ReplayGuard(window_ms=window_ms, clock=clock)
        if creds is None:
            return
        if role == "member":
            self.reply_key = ReplyKey(creds.workers_public)
        else:
            self._opener = self._new_opener(creds)

    @classmethod
    def from_settings(
        cls, settings: ShareGroupSettings, app_id: str, sender: str = "", *, role: str = "worker"
    ) -> ControlAuth:
        """The :class:`ControlAuth` of ``settings`` (mode, secret, credential) for ``app_id``.

        Raises:
            ConfigurationError: as :func:`credentials`, or a worker without the secret.
        """
        return cls(credentials(settings, app_id), sender, role=role)

    def receiver(self) -> ControlAuth:
        """A copy with the same keys (and member reply key) and a replay guard of its own."""
        twin = ControlAuth.__new__(ControlAuth)
        twin.__dict__.update(self.__dict__)
        twin.last = None
        twin._guard = ReplayGuard(window_ms=self._window, clock=self._clock)
        if self._opener is not None and self.creds is not None:
            twin._opener = self._new_opener(self.creds)
        return twin

    def _new_opener(self, creds: Credentials) -> EnvelopeOpener:
        """An envelope opener with these keys and a replay guard of its own."""
        return EnvelopeOpener(
            worker_key=creds.worker_key,
            member_key=creds.member_key,
            ciphers=_sealer(creds).ciphers,
            window_ms=self._window,
            clock=self._clock,
        )

    @property
    def last_sender(self) -> str:
        """Who sent the message :meth:`open` verified last
        (:func:`~queueflow.protocol.envelope.sender_label`; ``""``: none, or mode ``none``)."""
        last = self.last
        return "" if last is None else sender_label(last.role, last.sender, last.member_pub)

    @property
    def key_id(self) -> str:
        """The hex id of the key this process signs member messages with (``""``: none), for
        error messages an operator matches with the workers' ``wrong_key`` log lines."""
        return "" if self.creds is None else self.creds.member_key_id.hex()

    # -- sending ---------------------------------------------------------------------------
    def seal(self, body: bytes, dest: str) -> bytes:
        """``body`` in this role's envelope for ``dest`` (``hmac``) or unchanged (``none``)."""
        creds = self.creds
        if creds is None:
            return body
        if self.reply_key is not None:
            return seal_member(
                creds.member_key,
                self.reply_key.request_cipher,
                self.reply_key.public,
                dest,
                body,
                self._clock(),
            )
        assert creds.worker_key is not None
        return seal_worker(creds.worker_key, self.sender, dest, body, self._clock())

    def seal_reply(self, recipient: bytes, body: bytes, dest: str) -> bytes:
        """``body`` sealed by the workers to the member key ``recipient`` for ``dest``
        (``hmac``), or unchanged (``none``).

        Raises:
            ValueError: ``recipient`` is not a valid X25519 public key.
        """
        if self.creds is None:
            return body
        return _sealer(self.creds).seal(recipient, body, dest)

    # -- receiving -------------------------------------------------------------------------
    def open(self, data: bytes | bytearray | memoryview, dest: str) -> bytes:
        """The message bytes of ``data`` received on ``dest`` once verified (a worker: worker
        or member envelopes; a member: replies sealed to it), or ``data`` (``none``).

        Raises:
            AuthenticationError: see :meth:`~queueflow.protocol.envelope.EnvelopeOpener.open`
                and :meth:`~queueflow.protocol.sealed_replies.ReplyKey.open`.
        """
        if self.creds is None:
            return bytes(data)
        if self.reply_key is not None:
            return self.reply_key.open(data, dest, self._guard)
        assert self._opener is not None
        self.last = self._opener.open(data, dest)
        return self.last.body

    def check_sender(
        self, message: object, ticket_reply_key: Callable[[bytes], bytes | None] | None = None
    ) -> None:
        """Checks of a decoded message after :meth:`open`: bounded epochs and versions
        (every message); a member envelope carries a member kind, and a heartbeat's reply key
        (or, with ``ticket_reply_key``, a ShareFetch's ticket's reply key) is the key that
        encrypted it: one member can't act for another.

        Args:
            message: the decoded message.
            ticket_reply_key: the member key a ticket binds (``None``: an invalid ticket,
                which the ticket check refuses later, answered).

        Raises:
            AuthenticationError: ``absurd_value``, ``wrong_role`` or ``wrong_member``.
        """
        check_values(message)
        opened = self.last
        if opened is None or opened.role != "member":
            return
        kind = getattr(message, "kind", "?")
        if kind not in MEMBER_KINDS:
            raise AuthenticationError(
                "wrong_role", f"a {kind!r} message in a member envelope (workers only)"
            )
        bound: bytes | None
        if kind == "heartbeat":
            bound = getattr(message, "reply_key", b"")
        elif kind == "fetch" and ticket_reply_key is not None:
            ticket = getattr(message, "ticket", b"")
            bound = ticket_reply_key(ticket) if ticket else b""
            if bound is None:
                return  # an invalid ticket: refused by the ticket check, answered
        else:
            return
        if bound != opened.member_pub:
            raise AuthenticationError(
                "wrong_member",
                f"member {getattr(message, 'member_id', '?')!r} is bound to another key than "
                "the one this message was sent with",
            )
