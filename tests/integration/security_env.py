"""The secured broker of the security tests and the minimal ACLs of docs/operations.md.

* ``secured_broker`` (session): a second :class:`LocalBroker` in secured mode (SASL_SSL with
  SCRAM-SHA-512 and PLAIN, an mTLS listener, StandardAuthorizer, no ACL = denied), started only
  when a test asks for it and stopped at the end of the session. Its users are
  :data:`USERS`; ``admin`` is a super user.
* :func:`role_acls`: exactly the ACLs of the "Secured clusters" section of docs/operations.md,
  per role, for an app id, source topics and share groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from queueflow.devtools.broker import LocalBroker, find_free_ports
from queueflow.devtools.broker.acls import role_acls
from queueflow.devtools.broker.secure import BrokerSecurity

#: SASL users of the secured broker, ``{name: password}``.
USERS = {
    "admin": "admin-secret",
    "qf-all": "all-secret",
    "qf-leader": "leader-secret",
    "qf-member": "member-secret",
    "qf-consumer": "consumer-secret",
    "qf-nobody": "nobody-secret",
}
#: The certificate of the workers' direct endpoints (TLS on the direct path, for 127.0.0.1).
LEADER_CERT = "qf-leader-endpoint"
#: Seconds the secured broker may take to serve.
START_TIMEOUT_S = 120.0
#: A small heap: the plaintext session broker runs at the same time.
JVM_OPTS = ["-Xms128m", "-Xmx384m", "-XX:+UseSerialGC"]


@pytest.fixture(scope="session")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A started secured LocalBroker (see the module docstring); stopped after the session."""
    base = tmp_path_factory.mktemp("kafka-secured")
    port, controller_port, sasl_port, ssl_port = find_free_ports(4)
    security = BrokerSecurity(
        base / "certs",
        sasl_port,
        ssl_port,
        USERS,
        admin="admin",
        client_certs=["qf-mtls", LEADER_CERT],
    )
    broker = LocalBroker(
        base / "data",
        port,
        controller_port,
        security=security,
        jvm_opts=JVM_OPTS,
        die_with_parent=True,
    )
    broker.start(timeout_s=START_TIMEOUT_S)
    try:
        yield broker
    finally:
        broker.stop()


__all__ = ["JVM_OPTS", "LEADER_CERT", "USERS", "role_acls", "secured_broker"]


def cafile(broker: LocalBroker) -> Path:
    """The CA certificate clients of ``broker`` trust."""
    assert broker.security is not None
    return broker.security.ca_path
