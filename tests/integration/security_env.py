"""The secured broker of the security tests and the minimal ACLs of docs/operations.md.

* ``secured_broker`` (session): a second :class:`LocalBroker` in secured mode (SASL_SSL with
  SCRAM-SHA-512 and PLAIN, an mTLS listener, StandardAuthorizer, no ACL = denied), started only
  when a test asks for it and stopped at the end of the session. Its users are
  :data:`USERS`; ``admin`` is a super user.
* :func:`role_acls`: exactly the ACLs of the "Secured clusters" section of docs/operations.md,
  per role, for an app id, source topics and share groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from queueflow.devtools.broker import LocalBroker, find_free_ports
from queueflow.devtools.broker.acls import AclBinding
from queueflow.devtools.broker.secure import BrokerSecurity
from queueflow.protocol import topics as qf_topics

#: SASL users of the secured broker, ``{name: password}``.
USERS = {
    "admin": "admin-secret",
    "qf-all": "all-secret",
    "qf-leader": "leader-secret",
    "qf-member": "member-secret",
    "qf-consumer": "consumer-secret",
    "qf-nobody": "nobody-secret",
}
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
        base / "certs", sasl_port, ssl_port, USERS, admin="admin", client_certs=["qf-mtls"]
    )
    broker = LocalBroker(base / "data", port, controller_port, security=security, jvm_opts=JVM_OPTS)
    broker.start(timeout_s=START_TIMEOUT_S)
    try:
        yield broker
    finally:
        broker.stop()


def role_acls(role: str, principal: str, app_id: str, sources: Iterable[str]) -> list[AclBinding]:
    """The minimal ALLOW ACLs of ``role`` for app ``app_id`` on source topics ``sources``: exactly
    the table of docs/operations.md ("Secured clusters"). DESCRIBE is never listed: Kafka implies
    it from READ and WRITE.

    Args:
        role: ``all``, ``leader``, ``member``, or ``consumer`` (a ShareConsumer).
        principal: e.g. ``"User:alice"`` or ``"User:CN=alice"``.
        app_id: the queueflow app id (Faust app id).
        sources: the source topics.

    Raises:
        ValueError: an unknown role.
    """
    if role not in ("all", "leader", "member", "consumer"):
        raise ValueError(f"unknown role {role!r}")
    serves = role in ("all", "leader")
    handles = role in ("all", "member", "consumer")
    topic_ops: dict[str, set[str]] = {}

    def grant(topic: str, *ops: str) -> None:
        topic_ops.setdefault(topic, set()).update(ops)

    coordinator, replies = qf_topics.coordinator_topic(app_id), qf_topics.reply_topic(app_id)
    for source in sources:
        grant(source, "read")
        fetch = qf_topics.request_topic(app_id, source)
        if serves:
            grant(fetch, "create", "read", "write")
            grant(f"{app_id}-{qf_topics.state_table(source)}-changelog", "create", "read", "write")
        if handles:
            grant(fetch, "write")
    if serves:
        grant(coordinator, "create", "read", "write")
        grant(replies, "create", "write")
        grant(f"{app_id}-share-groups-changelog", "create", "read", "write")
        grant(f"{app_id}-__assignor-__leader", "create", "read")
    if handles:
        grant(coordinator, "write")
        grant(replies, "create", "read")
    acls = [
        AclBinding(principal, "topic", topic, op)
        for topic, ops in topic_ops.items()
        for op in sorted(ops)
    ]
    if serves:
        acls.append(AclBinding(principal, "group", app_id, "read"))
    return acls


__all__ = ["JVM_OPTS", "USERS", "role_acls", "secured_broker"]


def cafile(broker: LocalBroker) -> Path:
    """The CA certificate clients of ``broker`` trust."""
    assert broker.security is not None
    return broker.security.ca_path
