"""Security settings of queueflow's own aiokafka clients: SASL (PLAIN, SCRAM, GSSAPI,
OAUTHBEARER), SSL/TLS and mutual TLS.

Two ways in, both producing aiokafka keyword arguments for :attr:`KafkaClientConfig.extra`:

* :func:`credentials_to_kwargs` converts Faust's ``broker_credentials`` (``faust.SASLCredentials``,
  ``faust.SSLCredentials``, ``faust.GSSAPICredentials``, ``faust.OAuthCredentials``, as Faust
  normalises them; an ``ssl.SSLContext`` given as credentials becomes ``SSLCredentials``) and
  Faust's ``ssl_context`` setting, the same way Faust configures its own clients. The objects are
  read by their attributes, so this layer does not import Faust.
* :func:`security_kwargs` checks aiokafka-named keyword arguments (``security_protocol``,
  ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``, ``ssl_context``) as
  :class:`queueflow.ShareConsumer` takes them.

Invalid combinations raise :class:`~queueflow.errors.ConfigurationError` naming the setting and
what to do.
"""

from __future__ import annotations

import ssl
from typing import Any, Final

from queueflow.errors import ConfigurationError

__all__ = ["SASL_MECHANISMS", "SECURITY_PROTOCOLS", "credentials_to_kwargs", "security_kwargs"]

#: Security protocols aiokafka supports (Kafka's names).
SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: SASL mechanisms aiokafka supports.
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
#: Mechanisms that authenticate with ``sasl_plain_username`` / ``sasl_plain_password``.
_PASSWORD_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _name(value: Any) -> str:
    """The string of a Faust ``AuthProtocol``/``SASLMechanism`` enum member or a plain string."""
    return str(getattr(value, "value", value))


def credentials_to_kwargs(credentials: Any = None, ssl_context: Any = None) -> dict[str, Any]:
    """aiokafka keyword arguments for Faust's ``broker_credentials`` and ``ssl_context``.

    Args:
        credentials: ``app.conf.broker_credentials``: None, a Faust ``SASLCredentials``
            (``username``, ``password``, ``mechanism``, optional ``ssl_context`` making it
            SASL_SSL), ``SSLCredentials`` (``context``; mTLS when the context holds a client
            certificate), ``GSSAPICredentials``, ``OAuthCredentials``, or an ``ssl.SSLContext``.
        ssl_context: ``app.conf.ssl_context``: used (protocol SSL) only when ``credentials`` is
            None, as Faust does.

    Returns:
        ``{}`` for a plaintext cluster, else ``security_protocol`` and the matching ``sasl_*`` /
        ``ssl_context`` arguments.

    Raises:
        ConfigurationError: an unsupported credentials object, a SASL PLAIN/SCRAM username or
            password missing, or ``ssl_context`` set next to SASL credentials without one (which
            Faust would silently ignore, connecting without TLS).
    """
    if credentials is None:
        if ssl_context is None:
            return {}
        return security_kwargs(security_protocol="SSL", ssl_context=ssl_context)
    if isinstance(credentials, ssl.SSLContext):
        return security_kwargs(security_protocol="SSL", ssl_context=credentials)
    kind = type(credentials).__name__
    if hasattr(credentials, "context") and not hasattr(credentials, "mechanism"):  # SSLCredentials
        return security_kwargs(security_protocol="SSL", ssl_context=credentials.context)
    if not hasattr(credentials, "mechanism") or not hasattr(credentials, "protocol"):
        raise ConfigurationError(
            f"broker_credentials={credentials!r} ({kind}) is not supported for queueflow's Kafka "
            "clients; use faust.SASLCredentials, faust.SSLCredentials, faust.GSSAPICredentials, "
            "faust.OAuthCredentials or an ssl.SSLContext"
        )
    own_context = getattr(credentials, "ssl_context", None)
    if own_context is None and ssl_context is not None:
        raise ConfigurationError(
            f"broker_credentials={kind}(...) has no ssl_context but the app's ssl_context is set; "
            f"Faust would connect with SASL_PLAINTEXT and ignore it. For SASL over TLS pass it "
            f"to the credentials: {kind}(..., ssl_context=context); otherwise drop ssl_context"
        )
    kwargs: dict[str, Any] = {
        "security_protocol": _name(credentials.protocol),
        "sasl_mechanism": _name(credentials.mechanism),
        "ssl_context": own_context,
    }
    if hasattr(credentials, "username"):
        kwargs["sasl_plain_username"] = credentials.username
        kwargs["sasl_plain_password"] = credentials.password
    if hasattr(credentials, "kerberos_service_name"):
        kwargs["sasl_kerberos_service_name"] = credentials.kerberos_service_name
        kwargs["sasl_kerberos_domain_name"] = credentials.kerberos_domain_name
    if hasattr(credentials, "oauth_cb"):
        kwargs["sasl_oauth_token_provider"] = credentials.oauth_cb
    return security_kwargs(**kwargs)


def security_kwargs(
    *,
    security_protocol: str | None = None,
    sasl_mechanism: str | None = None,
    sasl_plain_username: str | None = None,
    sasl_plain_password: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    **more: Any,
) -> dict[str, Any]:
    """Check aiokafka security keyword arguments and return the ones to pass (None dropped).

    Args:
        security_protocol: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL`` (any case);
            default ``SASL_SSL`` if a SASL setting is given with an ``ssl_context``,
            ``SASL_PLAINTEXT`` if given without one, ``SSL`` if only ``ssl_context`` is given,
            else ``PLAINTEXT``.
        sasl_mechanism: one of :data:`SASL_MECHANISMS` (default ``PLAIN`` for SASL protocols).
        sasl_plain_username: the SASL user (PLAIN/SCRAM).
        sasl_plain_password: its password (PLAIN/SCRAM).
        ssl_context: the TLS context (server CA, and a client certificate for mTLS); for
            ``SSL``/``SASL_SSL`` without one, the system's default trust store is used
            (``aiokafka.helpers.create_ssl_context()``).
        more: further ``sasl_*`` arguments of aiokafka (Kerberos, OAuth), passed as given.

    Returns:
        ``{}`` for ``PLAINTEXT`` without anything else, else the keyword arguments.

    Raises:
        ConfigurationError: an unknown protocol or mechanism, SASL settings with a non-SASL
            protocol, ``ssl_context`` with a plaintext protocol, or a PLAIN/SCRAM mechanism
            without username and password. The message names the setting and what to do.
    """
    sasl_given = {
        k: v
        for k, v in {
            "sasl_mechanism": sasl_mechanism,
            "sasl_plain_username": sasl_plain_username,
            "sasl_plain_password": sasl_plain_password,
            **more,
        }.items()
        if v is not None
    }
    if security_protocol is None:
        if sasl_given:
            security_protocol = "SASL_SSL" if ssl_context is not None else "SASL_PLAINTEXT"
        else:
            security_protocol = "SSL" if ssl_context is not None else "PLAINTEXT"
    protocol = str(security_protocol).upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigurationError(
            f"security_protocol={security_protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    if not protocol.startswith("SASL_") and sasl_given:
        raise ConfigurationError(
            f"{', '.join(sorted(sasl_given))} given with security_protocol={protocol}; use "
            f"security_protocol='SASL_SSL' (or 'SASL_PLAINTEXT') for SASL, or drop the sasl_* "
            f"settings"
        )
    if protocol in ("PLAINTEXT", "SASL_PLAINTEXT") and ssl_context is not None:
        raise ConfigurationError(
            f"ssl_context given with security_protocol={protocol}, which does not use TLS; use "
            f"security_protocol='{'SASL_SSL' if protocol.startswith('SASL') else 'SSL'}' or drop "
            f"ssl_context"
        )
    if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
        raise ConfigurationError(
            f"ssl_context={ssl_context!r} is not an ssl.SSLContext; build one with "
            f"aiokafka.helpers.create_ssl_context(cafile=..., certfile=..., keyfile=...)"
        )
    if protocol == "PLAINTEXT":
        return {}
    out: dict[str, Any] = {"security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        if ssl_context is None:
            from aiokafka.helpers import create_ssl_context

            ssl_context = create_ssl_context()
        out["ssl_context"] = ssl_context
    if protocol.startswith("SASL_"):
        mechanism = str(sasl_mechanism or "PLAIN").upper()
        if mechanism not in SASL_MECHANISMS:
            raise ConfigurationError(
                f"sasl_mechanism={sasl_mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
            )
        if mechanism in _PASSWORD_MECHANISMS and not (sasl_plain_username and sasl_plain_password):
            missing = "sasl_plain_username" if not sasl_plain_username else "sasl_plain_password"
            raise ConfigurationError(
                f"sasl_mechanism={mechanism} needs a username and password but {missing} is not "
                f"set; give both (faust.SASLCredentials(username=..., password=...), or "
                f"ShareConsumer(sasl_plain_username=..., sasl_plain_password=...))"
            )
        out["sasl_mechanism"] = mechanism
        if mechanism in _PASSWORD_MECHANISMS:
            out["sasl_plain_username"] = sasl_plain_username
            out["sasl_plain_password"] = sasl_plain_password
        out.update({k: v for k, v in more.items() if v is not None})
    return out
