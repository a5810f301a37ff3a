"""Asking a running cluster whether it serves: finalized features, live broker count."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError, NoError, for_code

from queueflow.devtools.broker.api_versions import (
    FinalizedFeaturesRequest,
    finalized_feature_levels,
)
from queueflow.devtools.broker.blocking import run_blocking
from queueflow.errors import BrokerError

__all__ = ["SHARE_VERSION", "finalized_features", "is_serving", "probe", "split_bootstrap"]

#: The feature that enables KIP-932 share groups (level >= 1).
SHARE_VERSION = "share.version"

_CLIENT_ID = "queueflow-probe"


def split_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2"`` -> ``[("h1", p1), ("h2", p2)]``; IPv6 brackets are stripped.

    Raises:
        BrokerError: an item is not ``host:port``.
    """
    hosts = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise BrokerError(f"bad bootstrap address {item!r}; expected host:port")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


async def _api_versions_features(host: str, port: int, timeout_s: float) -> dict[str, int]:
    """Send ApiVersions v3 to one broker; return its finalized features (name -> max level)."""
    timeout_ms = max(int(timeout_s * 1000), 1)
    conn = await asyncio.wait_for(
        create_conn(host, port, client_id=_CLIENT_ID, request_timeout_ms=timeout_ms), timeout_s
    )
    try:
        response = await asyncio.wait_for(conn.send(FinalizedFeaturesRequest()), timeout_s)
    finally:
        conn.close()
    error = for_code(response.error_code)
    if error is not NoError:
        raise BrokerError(f"ApiVersions v3 to {host}:{port} failed: {error.__name__}")
    return finalized_feature_levels(response)


def finalized_features(bootstrap: str, timeout_s: float = 5.0) -> dict[str, int]:
    """Return the cluster's finalized feature levels, e.g. ``{"share.version": 1, ...}``.

    Uses one ApiVersions (v3) request from Python (aiokafka), so no JVM is started. The first
    reachable address of ``bootstrap`` answers.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout_s: seconds for connecting and for the answer, per address.

    Raises:
        BrokerError: no address answered (the message names the last error), or the broker
            answered with an error.
    """
    last: Exception | None = None
    for host, port in split_bootstrap(bootstrap):
        try:
            return run_blocking(_api_versions_features(host, port, timeout_s))
        except (OSError, asyncio.TimeoutError, KafkaError, ValueError) as exc:
            last = exc
    raise BrokerError(f"no answer to ApiVersions from {bootstrap}: {last!r}")


@contextlib.asynccontextmanager
async def started_admin(
    bootstrap: str, timeout_s: float, client_id: str = _CLIENT_ID
) -> AsyncIterator[AIOKafkaAdminClient]:
    """An aiokafka admin client of ``bootstrap`` (``host:port[,...]``), started within
    ``timeout_s`` seconds (also its request timeout, at least 1 s), closed on exit.

    Raises:
        asyncio.TimeoutError, KafkaError: it could not start.
    """
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=max(int(timeout_s * 1000), 1000),
        client_id=client_id,
    )
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        yield admin
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def _broker_count(bootstrap: str, timeout_s: float) -> int:
    async with started_admin(bootstrap, timeout_s) as admin:
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
        return len(cluster.get("brokers", []))


def probe(bootstrap: str, timeout_s: float) -> tuple[bool, int | None, str]:
    """Return (serving, ``share.version`` level or None, a one-line description). Never raises.

    Serving means: ApiVersions answered and the metadata lists at least one live broker. Each
    of the two requests may take ``timeout_s`` seconds.
    """
    try:
        features = finalized_features(bootstrap, timeout_s)
    except BrokerError as exc:
        return False, None, str(exc)
    level = features.get(SHARE_VERSION)
    try:
        brokers = run_blocking(_broker_count(bootstrap, timeout_s))
    except Exception as exc:
        return False, level, f"metadata request failed: {exc!r}"
    if brokers < 1:
        return False, level, "metadata lists no live broker yet"
    return True, level, f"serving; {SHARE_VERSION}={level}"


def is_serving(bootstrap: str, timeout_s: float = 5.0) -> bool:
    """Return True if ``bootstrap`` answers ApiVersions and its metadata lists a live broker.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout_s: seconds allowed for each of the two requests. Never raises.
    """
    return probe(bootstrap, timeout_s)[0]
