"""Client quotas with Kafka's AlterClientQuotas (v0) and DescribeClientQuotas (v0) APIs.

aiokafka 0.14 declares DescribeClientQuotas but not AlterClientQuotas, so the latter is declared
here with aiokafka's protocol building blocks, like :mod:`.acls`. Kafka's quotas per user
principal (KIP-546 for the APIs; https://kafka.apache.org/documentation/#design_quotas):
``producer_byte_rate`` (bytes/s), ``consumer_byte_rate`` and ``request_percentage`` (percent of
one request handler thread's time).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import NoError, for_code
from aiokafka.protocol.admin import DescribeClientQuotasRequest
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Float64, Int16, Int32, Schema, String

from queueflow._compat import admin_send_request
from queueflow.devtools.broker.blocking import run_blocking
from queueflow.errors import BrokerError

__all__ = ["QUOTA_KEYS", "alter_user_quotas", "describe_user_quotas"]

_API_KEY: Final = 49  # AlterClientQuotas
#: The user-principal quotas Kafka knows.
QUOTA_KEYS: Final = frozenset(
    {"producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate"}
)
_MATCH_EXACT: Final = 0


class AlterClientQuotasResponse_v0(Response):
    """AlterClientQuotas v0 response: one result per entity, in order."""

    API_KEY = _API_KEY
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "entries",
            Array(
                ("error_code", Int16),
                ("error_message", String("utf-8")),
                (
                    "entity",
                    Array(("entity_type", String("utf-8")), ("entity_name", String("utf-8"))),
                ),
            ),
        ),
    )


class AlterClientQuotasRequest_v0(RequestStruct):
    """AlterClientQuotas v0 request."""

    API_KEY = _API_KEY
    API_VERSION = 0
    RESPONSE_TYPE = AlterClientQuotasResponse_v0
    SCHEMA = Schema(
        (
            "entries",
            Array(
                (
                    "entity",
                    Array(("entity_type", String("utf-8")), ("entity_name", String("utf-8"))),
                ),
                (
                    "ops",
                    Array(("key", String("utf-8")), ("value", Float64), ("remove", Boolean)),
                ),
            ),
        ),
        ("validate_only", Boolean),
    )


class AlterClientQuotasRequest(Request[AlterClientQuotasRequest_v0]):
    """An AlterClientQuotas request for :meth:`aiokafka.client.AIOKafkaClient.send`."""

    API_KEY: ClassVar[int] = _API_KEY

    def __init__(self, entries: list[Any], validate_only: bool) -> None:
        self.entries = entries
        self.validate_only = validate_only

    def build(
        self, request_struct_class: type[AlterClientQuotasRequest_v0]
    ) -> AlterClientQuotasRequest_v0:
        return request_struct_class(self.entries, self.validate_only)


def _user(principal: str) -> str:
    """The user name of ``User:name`` (quotas are per user name, not per principal string)."""
    kind, _, name = principal.partition(":")
    if kind != "User" or not name:
        raise BrokerError(f"a quota needs a user principal User:<name>, not {principal!r}")
    return name


def alter_user_quotas(
    client_kwargs: Mapping[str, Any],
    principal: str,
    quotas: Mapping[str, float],
    *,
    validate_only: bool = False,
    timeout_s: float = 30.0,
) -> None:
    """Set ``quotas`` (key -> value, keys of :data:`QUOTA_KEYS`) of user ``principal``
    (``User:alice``) with one AlterClientQuotas request (blocking).

    Raises:
        BrokerError: an unknown key, not a user principal, the broker refused (its error and
            message are given), or the call took longer than ``timeout_s``.
    """
    unknown = set(quotas) - QUOTA_KEYS
    if unknown:
        raise BrokerError(f"unknown quota {sorted(unknown)}; known: {sorted(QUOTA_KEYS)}")
    entity = [("user", _user(principal))]
    ops = [(key, float(value), False) for key, value in sorted(quotas.items())]
    request = AlterClientQuotasRequest([(entity, ops)], validate_only)
    run_blocking(asyncio.wait_for(_send(dict(client_kwargs), request, _check_alter), timeout_s))


def describe_user_quotas(
    client_kwargs: Mapping[str, Any], principal: str, timeout_s: float = 30.0
) -> dict[str, float]:
    """The quotas of user ``principal`` (``User:alice``), key -> value (blocking).

    Raises:
        BrokerError: not a user principal, the broker refused, or a timeout.
    """
    request = DescribeClientQuotasRequest([("user", _MATCH_EXACT, _user(principal))], True)
    response = run_blocking(
        asyncio.wait_for(_send(dict(client_kwargs), request, _check_describe), timeout_s)
    )
    return {name: value for _entity, values in response.entries for name, value in values}


def _check_alter(response: Any) -> None:
    for code, message, entity in response.entries:
        error = for_code(code)
        if error is not NoError:
            raise BrokerError(f"AlterClientQuotas refused {entity}: {error.__name__}: {message}")


def _check_describe(response: Any) -> None:
    error = for_code(response.error_code)
    if error is not NoError:
        raise BrokerError(
            f"DescribeClientQuotas refused: {error.__name__}: {response.error_message}"
        )


async def _send(client_kwargs: dict[str, Any], request: Any, check: Any) -> Any:
    admin = AIOKafkaAdminClient(**client_kwargs)
    try:
        await admin.start()
        response = await admin_send_request(admin, request)
        check(response)
        return response
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
