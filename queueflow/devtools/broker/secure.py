"""The local broker's optional secured mode: TLS certificates, SASL users and the authorizer.

:class:`BrokerSecurity` describes it; :class:`~queueflow.devtools.broker.local.LocalBroker`
takes one (``security=``) and then serves, next to its PLAINTEXT listener (used by the readiness
probe; its principal ``User:ANONYMOUS`` gets no ACLs, so it can do nothing but ApiVersions and
cluster metadata):

* a ``SASL_SSL`` listener on ``sasl_port`` with SCRAM-SHA-512 and PLAIN, for :attr:`users`;
* an ``SSL`` listener on ``ssl_port`` that requires a client certificate (mTLS; principal
  ``User:CN=<common name>``), also the inter-broker listener;
* the controller listener over mTLS too, so the broker's own principal is
  ``User:CN=queueflow-broker``, the only super user besides :attr:`admin`;
* ``authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer`` and
  ``allow.everyone.if.no.acl.found=false``.

Certificates (a CA, the broker's, and one per client common name) are generated with the
``cryptography`` package (a queueflow dependency) as PEM files, which Kafka reads
directly (``ssl.keystore.type=PEM``).
"""

from __future__ import annotations

import dataclasses
import datetime
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from queueflow.errors import BrokerError

__all__ = ["BROKER_CN", "BrokerSecurity", "CertificateAuthority"]

#: Common name (and so ``User:CN=...`` principal) of the broker's own certificate.
BROKER_CN: Final = "queueflow-broker"
_DAYS: Final = 7


def _crypto() -> Any:
    try:
        from cryptography import x509
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BrokerError(
            "the secured local broker generates its certificates with the 'cryptography' "
            "package: pip install 'queueflow[test]' (or pip install cryptography)"
        ) from exc
    return x509


class CertificateAuthority:
    """A throwaway CA in ``directory``, issuing PEM certificates for 127.0.0.1.

    Files: ``ca.pem`` (the CA certificate: the trust store of broker and clients), and per
    issued name ``<name>.pem`` (certificate), ``<name>.key`` (unencrypted PKCS#8 key) and
    ``<name>.keystore.pem`` (key + certificate, Kafka's PEM key store).

    Args:
        directory: where the files go (created).
    """

    def __init__(self, directory: Path) -> None:
        x509 = _crypto()
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "queueflow-test-ca")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._name = name
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_path.write_bytes(self._pem(self._cert))

    @property
    def ca_path(self) -> Path:
        """The CA certificate (PEM)."""
        return self.directory / "ca.pem"

    @staticmethod
    def _pem(cert: Any) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding

        return bytes(cert.public_bytes(Encoding.PEM))

    def issue(self, common_name: str) -> tuple[Path, Path]:
        """Issue a certificate for ``common_name``, valid for server (127.0.0.1, localhost) and
        client use.

        Returns:
            ``(certificate path, key path)``, PEM.
        """
        x509 = _crypto()
        import ipaddress

        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=_DAYS))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        cert_path = self.directory / f"{common_name}.pem"
        key_path = self.directory / f"{common_name}.key"
        cert_path.write_bytes(self._pem(cert))
        key_path.write_bytes(key_pem)
        key_path.chmod(0o600)
        keystore = self.directory / f"{common_name}.keystore.pem"
        keystore.write_bytes(key_pem + self._pem(cert))
        keystore.chmod(0o600)
        return cert_path, key_path


@dataclasses.dataclass
class BrokerSecurity:
    """The secured mode of a :class:`~queueflow.devtools.broker.local.LocalBroker`.

    Args:
        directory: where certificates are generated (at the broker's first start).
        sasl_port: the SASL_SSL listener's port on 127.0.0.1.
        ssl_port: the mTLS (SSL, client certificate required) listener's port on 127.0.0.1.
        users: SASL users, ``{name: password}``; each can log in with SCRAM-SHA-512 and PLAIN
            (principal ``User:<name>``).
        admin: the SASL user that is a super user (creates topics and ACLs in tests); must be
            in ``users``.
        client_certs: common names to issue client certificates for (mTLS principals
            ``User:CN=<name>``).
    """

    directory: Path
    sasl_port: int
    ssl_port: int
    users: Mapping[str, str]
    admin: str = "admin"
    client_certs: Iterable[str] = ()
    _ca: CertificateAuthority | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.admin not in self.users:
            raise BrokerError(f"admin user {self.admin!r} is not in users={list(self.users)}")
        for name, password in self.users.items():
            if not name or any(c in name + password for c in ",=[]\"' \n"):
                raise BrokerError(f"SASL user {name!r}: names and passwords must be plain words")
        self.client_certs = tuple(self.client_certs)

    @property
    def ca_path(self) -> Path:
        """The CA certificate clients trust (PEM)."""
        return Path(self.directory) / "ca.pem"

    def client_cert(self, common_name: str) -> tuple[Path, Path]:
        """``(certificate, key)`` PEM paths of an issued client certificate."""
        return (
            Path(self.directory) / f"{common_name}.pem",
            Path(self.directory) / f"{common_name}.key",
        )

    def generate(self) -> None:
        """Generate the CA, the broker's certificate and the client certificates (again)."""
        self._ca = CertificateAuthority(Path(self.directory))
        self._ca.issue(BROKER_CN)
        for name in self.client_certs:
            self._ca.issue(name)

    def ssl_context(self, client_cert: str | None = None) -> ssl.SSLContext:
        """A client TLS context trusting the CA; with ``client_cert``'s certificate for mTLS."""
        context = ssl.create_default_context(cafile=str(self.ca_path))
        if client_cert is not None:
            cert, key = self.client_cert(client_cert)
            context.load_cert_chain(str(cert), str(key))
        return context

    def sasl_kwargs(self, user: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
        """aiokafka client arguments for ``user`` on the SASL_SSL listener (no bootstrap)."""
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": mechanism,
            "sasl_plain_username": user,
            "sasl_plain_password": self.users[user],
            "ssl_context": self.ssl_context(),
        }

    def broker_config(self, port: int, controller_port: int) -> dict[str, str]:
        """The ``server.properties`` overrides of the secured mode."""
        keystore = Path(self.directory) / f"{BROKER_CN}.keystore.pem"
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in self.users.items())
        admin_pw = self.users[self.admin]
        listeners = (
            f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{self.sasl_port},"
            f"SSL://127.0.0.1:{self.ssl_port},CONTROLLER://127.0.0.1:{controller_port}"
        )
        return {
            "listeners": listeners,
            "advertised.listeners": listeners,
            "listener.security.protocol.map": (
                "CONTROLLER:SSL,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL"
            ),
            "inter.broker.listener.name": "SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_path),
            "ssl.endpoint.identification.algorithm": "https",
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.controller.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{self.admin}" password="{admin_pw}" {plain_users};'
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:CN={BROKER_CN};User:{self.admin}",
        }

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments adding every user's SCRAM-SHA-512 credential."""
        args: list[str] = []
        for user, password in self.users.items():
            args += ["--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]"]
        return args
