"""The keys of an app's two roles: workers (the worker secret) and members (a member credential).

``queueflow.auth.secret`` is the worker secret: every key of the app is derived from it and the
Faust app id (:func:`~queueflow.protocol.auth.derive_key`, one purpose each):

* ``worker`` — the HMAC key of worker envelopes (fences, ticks, releases, resets, leader
  announcements, admin requests and answers);
* ``member`` — the HMAC key of member envelopes (heartbeats, ShareFetches, cancels);
* ``tickets`` — the key of assignment tickets;
* ``worker-x25519`` — the private key of the workers' static X25519 key pair: members encrypt
  their requests to its public key, and the workers seal their replies to members with it
  (:mod:`queueflow.protocol.envelope`, :mod:`queueflow.protocol.sealed_replies`).

A member credential (:func:`member_credential`) holds only the app id, the ``member`` key and
the workers' public X25519 key: ``qfm1.`` + base64url(member key (32) | workers' public key
(32) | app id (UTF-8)). A process given only that (``queueflow.auth.member.credential``) can send
member messages and read the replies sealed to it, but can sign no worker message, issue no
ticket and read no other member's requests (docs/operations.md "Threat model and attack
matrix").
"""

from __future__ import annotations

import base64
import binascii
import functools
from dataclasses import dataclass, field
from typing import Final

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from queueflow.errors import ConfigurationError
from queueflow.protocol.auth import derive_key, key_id
from queueflow.settings import secret_problem

__all__ = [
    "CREDENTIAL_PREFIX",
    "Credentials",
    "member_credential",
    "parse_member_credential",
]

#: The prefix of a member credential (version 1 of the format).
CREDENTIAL_PREFIX: Final = "qfm1."
_KEY_BYTES: Final = 32


@dataclass(frozen=True)
class Credentials:
    """What one process holds: the member side always, the worker side with the secret.

    Attributes:
        app_id: the Faust app id the keys are for.
        member_key: HMAC key of member envelopes.
        workers_public: the workers' static X25519 public key (32 bytes).
        worker_key: HMAC key of worker envelopes (``None``: a member credential only).
        tickets_key: the ticket key (``None``: a member credential only).
        workers_private: the workers' static X25519 private key (``None``: member only).
    """

    app_id: str
    member_key: bytes
    workers_public: bytes
    worker_key: bytes | None = None
    tickets_key: bytes | None = None
    workers_private: X25519PrivateKey | None = field(default=None, repr=False)

    @property
    def is_worker(self) -> bool:
        """Whether this process holds the worker secret (may act as worker and as member)."""
        return self.worker_key is not None

    @property
    def member_key_id(self) -> bytes:
        """The 4-byte id of the member key (:func:`~queueflow.protocol.auth.key_id`)."""
        return key_id(self.member_key)

    @property
    def worker_key_id(self) -> bytes:
        """The 4-byte id of the worker key (``b""``: not held)."""
        return b"" if self.worker_key is None else key_id(self.worker_key)

    def __repr__(self) -> str:  # never key material
        role = "worker" if self.is_worker else "member"
        return (
            f"Credentials(app_id={self.app_id!r}, role={role}, key_id={self.member_key_id.hex()})"
        )

    @staticmethod
    def from_secret(secret: str, app_id: str) -> Credentials:
        """Every key of ``app_id`` derived from the worker secret (cached per pair).

        Raises:
            ValueError: the secret is empty.
        """
        return _from_secret(secret, app_id)

    @staticmethod
    def from_member_credential(credential: str, app_id: str) -> Credentials:
        """The member side from a credential made by :func:`member_credential`.

        Raises:
            ConfigurationError: not a member credential, or one for another app id.
        """
        cred_app, member_key, public = parse_member_credential(credential)
        if cred_app != app_id:
            raise ConfigurationError(
                f"queueflow.auth.member.credential is for app {cred_app!r}, but this is app "
                f"{app_id!r}: generate one for this app with `queueflow auth member-credential "
                f"--app-id {app_id}` (on a machine holding queueflow.auth.secret)"
            )
        return Credentials(app_id, member_key, public)

    @staticmethod
    def resolve(secret: str, credential: str, app_id: str) -> Credentials:
        """The credentials of a process given ``secret`` and/or ``credential`` (the settings
        ``queueflow.auth.secret`` / ``queueflow.auth.member.credential``): the secret wins;
        a credential given too must be this app's.

        Raises:
            ConfigurationError: neither is set, the secret is weak, or the credential is bad
                or for another app.
        """
        if secret:
            problem = secret_problem(secret)
            if problem:
                raise ConfigurationError(problem)
            creds = Credentials.from_secret(secret, app_id)
            if credential:
                other = Credentials.from_member_credential(credential, app_id)
                if other.member_key != creds.member_key:
                    raise ConfigurationError(
                        "queueflow.auth.member.credential was not made from this "
                        "queueflow.auth.secret: unset one of them, or make the credential anew "
                        f"(`queueflow auth member-credential --app-id {app_id}`)"
                    )
            return creds
        if credential:
            return Credentials.from_member_credential(credential, app_id)
        raise ConfigurationError(
            "queueflow.auth.mode=hmac needs queueflow.auth.secret (workers) or "
            "queueflow.auth.member.credential (members)"
        )


def _public(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


@functools.lru_cache(maxsize=16)
def _from_secret(secret: str, app_id: str) -> Credentials:
    private = X25519PrivateKey.from_private_bytes(derive_key(secret, app_id, "worker-x25519"))
    return Credentials(
        app_id,
        derive_key(secret, app_id, "member"),
        _public(private),
        worker_key=derive_key(secret, app_id, "worker"),
        tickets_key=derive_key(secret, app_id, "tickets"),
        workers_private=private,
    )


def member_credential(secret: str, app_id: str) -> str:
    """The member credential of ``app_id`` (give it to member processes instead of the
    secret): ``qfm1.`` + base64url of the member key, the workers' public key and the app id.

    Raises:
        ConfigurationError: the secret is empty or weak.
    """
    problem = secret_problem(secret)
    if problem:
        raise ConfigurationError(problem)
    creds = Credentials.from_secret(secret, app_id)
    raw = creds.member_key + creds.workers_public + app_id.encode()
    return CREDENTIAL_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_member_credential(credential: str) -> tuple[str, bytes, bytes]:
    """``(app id, member key, workers' public key)`` of a member credential.

    Raises:
        ConfigurationError: not a ``qfm1.`` credential, or truncated.
    """
    text = credential.strip()
    bad = ConfigurationError(
        "queueflow.auth.member.credential is not a member credential (it starts with "
        f"{CREDENTIAL_PREFIX!r}): copy the whole output of `queueflow auth member-credential "
        "--app-id APP`"
    )
    if not text.startswith(CREDENTIAL_PREFIX):
        raise bad
    body = text[len(CREDENTIAL_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        app_id = raw[2 * _KEY_BYTES :].decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if len(raw) <= 2 * _KEY_BYTES:
        raise bad
    return app_id, raw[:_KEY_BYTES], raw[_KEY_BYTES : 2 * _KEY_BYTES]
