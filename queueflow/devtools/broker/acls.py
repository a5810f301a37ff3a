"""Creating ACLs with Kafka's CreateAcls API (v3), over an aiokafka admin connection.

aiokafka 0.14 has no ACL calls, so CreateAcls v3 (the flexible version every Kafka 4 broker
serves) is declared here with aiokafka's protocol building blocks, like :mod:`.api_versions`.
One request creates every binding, far faster than one ``AclCommand`` JVM per binding set.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import NoError, for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from queueflow._compat import admin_send_to_controller
from queueflow.devtools.broker.blocking import run_blocking
from queueflow.errors import BrokerError
from queueflow.protocol import topics as qf_topics

__all__ = ["OPERATIONS", "RESOURCE_TYPES", "AclBinding", "app_acls", "create_acls", "role_acls"]

_API_KEY: Final = 30  # CreateAcls
#: Kafka's ``ResourceType`` codes by name.
RESOURCE_TYPES: Final[Mapping[str, int]] = {
    "topic": 2,
    "group": 3,
    "cluster": 4,
    "transactional_id": 5,
}
#: Kafka's ``AclOperation`` codes by name.
OPERATIONS: Final[Mapping[str, int]] = {
    "all": 2,
    "read": 3,
    "write": 4,
    "create": 5,
    "delete": 6,
    "alter": 7,
    "describe": 8,
    "cluster_action": 9,
    "describe_configs": 10,
    "alter_configs": 11,
    "idempotent_write": 12,
}
_PATTERNS: Final = {"literal": 3, "prefixed": 4}
_ALLOW: Final = 3


@dataclasses.dataclass(frozen=True)
class AclBinding:
    """One ALLOW rule.

    Attributes:
        principal: e.g. ``"User:alice"`` or ``"User:CN=alice"`` (mTLS).
        resource_type: a key of :data:`RESOURCE_TYPES` (``"topic"``, ``"group"``, ``"cluster"``).
        resource_name: the topic or group name (``"kafka-cluster"`` for the cluster).
        operation: a key of :data:`OPERATIONS` (``"read"``, ``"write"``, ...).
        pattern: ``"literal"`` or ``"prefixed"``.
        host: the client host allowed, ``"*"`` for any.
    """

    principal: str
    resource_type: str
    resource_name: str
    operation: str
    pattern: str = "literal"
    host: str = "*"

    def row(self) -> tuple[Any, ...]:
        """The binding as a CreateAcls v3 ``creations`` entry.

        Raises:
            BrokerError: an unknown resource type, operation or pattern.
        """
        try:
            return (
                RESOURCE_TYPES[self.resource_type],
                self.resource_name,
                _PATTERNS[self.pattern],
                self.principal,
                self.host,
                OPERATIONS[self.operation],
                _ALLOW,
                {},
            )
        except KeyError as exc:
            raise BrokerError(f"invalid ACL binding {self}: unknown {exc}") from exc


class CreateAclsResponse_v3(Response):
    """CreateAcls v3 response: one result per creation, in order."""

    API_KEY = _API_KEY
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class CreateAclsRequest_v3(RequestStruct):
    """CreateAcls v3 request (flexible)."""

    FLEXIBLE_VERSION = True
    API_KEY = _API_KEY
    API_VERSION = 3
    RESPONSE_TYPE = CreateAclsResponse_v3
    SCHEMA = Schema(
        (
            "creations",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", CompactString("utf-8")),
                ("resource_pattern_type", Int8),
                ("principal", CompactString("utf-8")),
                ("host", CompactString("utf-8")),
                ("operation", Int8),
                ("permission_type", Int8),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class CreateAclsRequest(Request[CreateAclsRequest_v3]):
    """A CreateAcls request for :meth:`aiokafka.client.AIOKafkaClient.send`."""

    API_KEY: ClassVar[int] = _API_KEY

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def build(self, request_struct_class: type[CreateAclsRequest_v3]) -> CreateAclsRequest_v3:
        return request_struct_class(self.rows, {})


def create_acls(
    client_kwargs: Mapping[str, Any], bindings: Iterable[AclBinding], timeout_s: float = 30.0
) -> None:
    """Create ALLOW ACL ``bindings`` in one CreateAcls request (blocking).

    Args:
        client_kwargs: aiokafka admin client arguments of a principal allowed to alter ACLs
            (``bootstrap_servers``, ``security_protocol``, ``sasl_*``, ``ssl_context``).
        bindings: the rules.
        timeout_s: overall bound, seconds.

    Raises:
        BrokerError: the broker refused a binding (its error and message are given), or the
            call took longer than ``timeout_s``.
    """
    rows = [b.row() for b in bindings]
    if rows:
        run_blocking(asyncio.wait_for(_create(dict(client_kwargs), rows), timeout_s))


async def _create(client_kwargs: dict[str, Any], rows: list[tuple[Any, ...]]) -> None:
    admin = AIOKafkaAdminClient(**client_kwargs)
    try:
        await admin.start()
        response: Any = await admin_send_to_controller(admin, CreateAclsRequest(rows))
        for row, (code, message, _tags) in zip(rows, response.results, strict=True):
            error = for_code(code)
            if error is not NoError:
                raise BrokerError(f"CreateAcls refused {row[:7]}: {error.__name__}: {message}")
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def role_acls(
    role: str,
    principal: str,
    app_id: str,
    sources: Iterable[str],
    exactly_once: bool = False,
) -> list[AclBinding]:
    """The minimal ALLOW ACLs of ``role`` for app ``app_id`` on source topics ``sources``: exactly
    the table of docs/operations.md ("Secured clusters"). DESCRIBE is never listed: Kafka implies
    it from READ and WRITE.

    Args:
        role: ``all``, ``leader``, ``member``, or ``consumer`` (a ShareConsumer).
        principal: e.g. ``"User:alice"`` or ``"User:CN=alice"``.
        app_id: the queueflow app id (Faust app id).
        sources: the source topics.
        exactly_once: the app runs ``queueflow.processing.guarantee=exactly_once``: leaders
            create and read the ack topics, members write them inside transactions (WRITE and
            DESCRIBE on the transactional ids ``<app>-share-txn-*``, IDEMPOTENT_WRITE on the
            cluster).

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
        if exactly_once:
            ack = qf_topics.ack_topic(app_id, source)
            if serves:
                grant(ack, "create", "read")
            if handles:
                grant(ack, "write")
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
    if exactly_once and role != "consumer" and handles:
        txn = qf_topics.transactional_id_prefix(app_id)
        acls += [
            AclBinding(principal, "transactional_id", txn, "write", "prefixed"),
            AclBinding(principal, "transactional_id", txn, "describe", "prefixed"),
            AclBinding(principal, "cluster", "kafka-cluster", "idempotent_write"),
        ]
    return acls


def app_acls(
    app_id: str,
    sources: Iterable[str],
    leader_principals: Iterable[str],
    member_principals: Iterable[str],
    exactly_once: bool = False,
) -> list[AclBinding]:
    """The minimal ACLs of an app (docs/operations.md "Minimal ACLs"): the ``leader`` column
    for each leader principal, the ``member`` column for each member principal (a
    ``ShareConsumer`` needs the same). Only these principals may write the internal topics once
    the broker refuses what no ACL allows (``allow.everyone.if.no.acl.found=false``).
    ``exactly_once``: see :func:`role_acls`."""
    names = list(sources)
    out: list[AclBinding] = []
    for principal in leader_principals:
        out += role_acls("leader", principal, app_id, names, exactly_once)
    for principal in member_principals:
        out += role_acls("member", principal, app_id, names, exactly_once)
    return sorted(set(out), key=lambda b: (b.principal, b.resource_name, b.operation))
