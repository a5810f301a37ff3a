"""Admin calls queueflow needs: create internal topics, look up partition counts.

All go through aiokafka's admin client and its error classes (no literal error codes).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import stamina
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import (
    InvalidPartitionsError,
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)
from aiokafka.protocol.metadata import MetadataRequest

from queueflow._compat import admin_send_request
from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.structs import TopicPartition

T = TypeVar("T")

__all__ = [
    "METADATA_ATTEMPTS",
    "TopicMetadata",
    "create_topic_hint",
    "ensure_partitions",
    "ensure_topic",
    "existing_partition_counts",
    "group_partition_owners",
    "leader_racks",
    "partition_counts",
    "retry_unready",
    "topic_partition_counts",
    "unknown_topic_error",
]


def admin_client(config: KafkaClientConfig) -> AIOKafkaAdminClient:
    """A (not yet started) admin client for ``config``."""
    return AIOKafkaAdminClient(**config.client_kwargs())


async def ensure_topic(
    config: KafkaClientConfig,
    name: str,
    partitions: int,
    topic_config: Mapping[str, str] | None = None,
    replication_factor: int | None = None,
) -> None:
    """Create a topic if it does not exist; idempotent and safe to race.

    Args:
        config: the cluster.
        name: the topic.
        partitions: its partition count.
        topic_config: topic configs (``retention.ms`` ...).
        replication_factor: defaults to ``config.replication_factor``.

    Raises:
        ConfigurationError: the broker refused to create it (the message gives its error).
    """
    admin = admin_client(config)
    await admin.start()
    try:
        rf = replication_factor or config.replication_factor
        result = await admin.create_topics(
            [NewTopic(name, partitions, rf, topic_configs=dict(topic_config or {}))]
        )
        for _topic, code, *rest in getattr(result, "topic_errors", []):
            error = for_code(code)
            if code and error is not TopicAlreadyExistsError:
                detail = rest[0] if rest and rest[0] else error.__name__
                raise ConfigurationError(f"could not create topic {name!r}: {detail}")
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()


async def ensure_partitions(config: KafkaClientConfig, name: str, partitions: int) -> bool:
    """Grow topic ``name`` to ``partitions`` partitions if it has fewer; idempotent and safe to
    race (another worker growing it first is fine). Used for internal topics co-partitioned
    with a source topic that gained partitions at runtime.

    Returns:
        True if this call added partitions.

    Raises:
        ConfigurationError: the topic does not exist, or the broker refused (its error).
    """
    admin = admin_client(config)
    await admin.start()
    try:
        counts = await existing_partition_counts(admin, [name])
        if name not in counts:
            raise ConfigurationError(f"cannot add partitions to topic {name!r}: it does not exist")
        if counts[name] >= partitions:
            return False
        try:
            result = await admin.create_partitions({name: NewPartitions(partitions)})
        except InvalidPartitionsError:
            return False  # grown meanwhile (by another worker)
        for _topic, code, message in getattr(result, "topic_errors", []):
            error = for_code(code)
            if code and error is not InvalidPartitionsError:
                raise ConfigurationError(
                    f"could not add partitions to topic {name!r}: {message or error.__name__}"
                )
        return True
    finally:
        await admin.close()


async def existing_partition_counts(
    admin: AIOKafkaAdminClient, names: Iterable[str]
) -> dict[str, int]:
    """Partition counts of the topics among ``names`` that exist; never creates a topic.

    A metadata request naming a topic makes a broker with ``auto.create.topics.enable=true``
    (Kafka's default) create it, so the names are first looked up in the list of all topics and
    only the existing ones are described.
    """
    names = set(names)
    if not names:
        return {}
    return await retry_unready(lambda: _existing_partition_counts(admin, names))


async def _existing_partition_counts(admin: AIOKafkaAdminClient, names: set[str]) -> dict[str, int]:
    existing = names & set(await admin.list_topics())
    if existing != names:
        await _check_authorized(admin, sorted(names - existing))
    if not existing:
        return {}
    described = await admin.describe_topics(sorted(existing))
    return {
        d["topic"]: len(d["partitions"])
        for d in described
        if d["error_code"] == 0 and d["partitions"]
    }


#: Attempts of a metadata lookup against a cluster with a broker down: each goes to a random
#: broker; ~12 s of back-off in all, past the fencing of a dead broker (9 s).
METADATA_ATTEMPTS = 10


def _retriable(exc: Exception) -> bool:
    """A request failed on the broker it went to, not on what it asked."""
    return isinstance(exc, KafkaError) and bool(exc.retriable)


async def retry_unready(call: Callable[[], Awaitable[T]]) -> T:
    """Await ``call()``, again (up to :data:`METADATA_ATTEMPTS` times, 0.2 s to 2 s apart) while
    it fails with a retriable Kafka error.

    aiokafka's admin client (and Faust's topic creation) sends to a random broker it knows:
    one that just died, and that the controller has not fenced yet
    (``broker.session.timeout.ms``), fails the request with ``NodeNotReadyError``; another
    attempt goes to another broker (docs/operations.md "Running against a replicated
    cluster").

    Raises:
        KafkaError: the last error, after the last attempt; other errors at once.
    """
    async for attempt in stamina.retry_context(
        on=_retriable,
        attempts=METADATA_ATTEMPTS,
        timeout=None,
        wait_initial=0.2,
        wait_max=2.0,
    ):
        with attempt:
            return await call()
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _check_authorized(admin: AIOKafkaAdminClient, names: list[str]) -> None:
    """Ask for the metadata of ``names`` (never auto-creating them): a topic that was not
    listed because this client may not see it is an authorization problem, not a missing topic.

    Raises:
        ConfigurationError: the principal may not describe one of ``names``; the message names
            the topic and the ACL to grant.
    """
    response: Any = await admin_send_request(
        admin, MetadataRequest(names, allow_auto_topic_creation=False)
    )
    denied = [
        topic[1] for topic in response.topics if for_code(topic[0]) is TopicAuthorizationFailedError
    ]
    if denied:
        raise ConfigurationError(
            f"not authorized to access topic(s) {', '.join(map(repr, denied))} "
            f"(TOPIC_AUTHORIZATION_FAILED): the cluster has an authorizer and this client's "
            f"principal has no ACL on them; grant the ACLs of its role (docs/operations.md, "
            f"'Secured clusters'): at least DESCRIBE, plus READ on a source topic"
        )


def leader_racks(
    brokers: Iterable[Mapping[str, Any]], described: Iterable[Mapping[str, Any]]
) -> dict[TopicPartition, str]:
    """The rack (``broker.rack``) of each partition's leader broker.

    Args:
        brokers: ``describe_cluster()["brokers"]`` (``node_id``, ``rack``, ...).
        described: ``describe_topics(...)`` (``topic``, ``error_code``, ``partitions`` with
            ``partition`` and ``leader``).

    Returns:
        partition → rack; partitions whose leader has no rack (or is unknown) are absent.
    """
    rack_of = {b.get("node_id"): b.get("rack") for b in brokers}
    out: dict[TopicPartition, str] = {}
    for d in described:
        if d.get("error_code"):
            continue
        for p in d.get("partitions") or ():
            rack = rack_of.get(p.get("leader"))
            if rack:
                out[TopicPartition(str(d["topic"]), int(p["partition"]))] = str(rack)
    return out


async def topic_partition_counts(config: KafkaClientConfig, names: Iterable[str]) -> dict[str, int]:
    """Partition counts of the topics among ``names`` that exist (missing ones are absent);
    never creates a topic."""
    admin = admin_client(config)
    await admin.start()
    try:
        return await existing_partition_counts(admin, names)
    finally:
        await admin.close()


def create_topic_hint(name: str, bootstrap: str) -> str:
    """How to create topic ``name``: the command queueflow ships (Kafka's own tool through
    the jars it already has), and Kafka's script for those who have it."""
    return (
        f"`queueflow broker tool topics --bootstrap-server {bootstrap} --create --topic {name} "
        "--partitions N` (or kafka-topics.sh with the same arguments)"
    )


def unknown_topic_error(name: str, bootstrap: str) -> ConfigurationError:
    """The error for a source topic that does not exist: it says how to create it."""
    return ConfigurationError(
        f"unknown topic {name!r} on {bootstrap}: create it first with "
        f"{create_topic_hint(name, bootstrap)}, or fix the name"
    )


async def partition_counts(config: KafkaClientConfig, names: Iterable[str]) -> dict[str, int]:
    """Partition counts of ``names``.

    Raises:
        ConfigurationError: a topic does not exist; the message names it and says to create it.
    """
    names = list(names)
    admin = admin_client(config)
    await admin.start()
    try:
        counts = await existing_partition_counts(admin, names)
    finally:
        await admin.close()
    for name in names:
        if name not in counts:
            raise unknown_topic_error(name, config.bootstrap)
    return counts


#: How long (s) :meth:`TopicMetadata.partition_racks` reuses what it read (leaders move only
#: when brokers fail or a reassignment runs).
RACKS_TTL_S = 30.0


class TopicMetadata:
    """Partition counts of topics, cached for ``ttl_s`` seconds, from one admin client.

    Args:
        config: the cluster.
        ttl_s: how long (s) a count is reused.
    """

    def __init__(self, config: KafkaClientConfig, ttl_s: float = 5.0) -> None:
        self.config = config
        self.ttl_s = ttl_s
        self._admin: AIOKafkaAdminClient | None = None
        self._counts: dict[str, tuple[float, int]] = {}
        self._racks: dict[tuple[str, ...], tuple[float, dict[TopicPartition, str]]] = {}

    async def partition_counts(self, names: list[str]) -> dict[str, int]:
        """Partition counts of the existing topics among ``names``."""
        now = time.monotonic()
        stale = [n for n in names if n not in self._counts or now - self._counts[n][0] > self.ttl_s]
        if stale:
            async with self._client() as admin:
                for name, count in (await existing_partition_counts(admin, stale)).items():
                    self._counts[name] = (now, count)
        return {n: self._counts[n][1] for n in names if n in self._counts}

    async def partition_racks(self, names: list[str]) -> dict[TopicPartition, str]:
        """The rack of the leader broker of each partition of the existing topics among
        ``names`` (for the ``rack`` assignor), cached for :data:`RACKS_TTL_S`; partitions whose
        leader has no ``broker.rack`` are absent (all of them on a cluster without racks)."""
        now = time.monotonic()
        key = tuple(sorted(names))
        cached = self._racks.get(key)
        if cached is None or now - cached[0] > RACKS_TTL_S:
            async with self._client() as admin:
                existing = sorted(set(names) & set(await admin.list_topics()))
                described = await admin.describe_topics(existing) if existing else []
                cluster = await admin.describe_cluster()
            cached = self._racks[key] = (now, leader_racks(cluster["brokers"], described))
        return dict(cached[1])

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[AIOKafkaAdminClient]:
        """The admin client (started on first use). One that fails is closed, and the next call
        starts a fresh one: after a broker restart an aiokafka admin client can stay without a
        usable broker (``NodeNotReadyError``, node id None) for good."""
        if self._admin is None:
            admin = admin_client(self.config)
            try:
                await admin.start()
            except BaseException:
                await stop_quietly("admin client", admin.close)
                raise
            self._admin = admin
        try:
            yield self._admin
        except Exception:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the admin client."""
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await stop_quietly("admin client", admin.close)


async def group_partition_owners(
    admin: AIOKafkaAdminClient, group_id: str
) -> dict[tuple[str, int], str]:
    """Which member of the consumer group ``group_id`` (a Faust app's workers) holds each
    partition: ``(topic, partition) -> owner``. The owner is the worker's web URL from Faust's
    member metadata (``http://host:port``, where its ``/queueflow/`` dashboard is), or the
    client host the broker saw when the metadata is not Faust's.

    The share-group coordinator of a group is the owner of its partition of the coordinator
    topic, and a share-partition's leader the owner of that partition of the request topic:
    this is how the admin names them (KIP-932 names the broker; queueflow's are workers).

    Args:
        admin: a started admin client.
        group_id: the consumer group (the Faust app id).

    Returns:
        The assigned partitions; empty when the group has no members (no worker running) or is
        rebalancing.

    Raises:
        KafkaError: the broker refused (e.g. no DESCRIBE ACL on the group).
    """
    owners: dict[tuple[str, int], str] = {}
    for response in await admin.describe_consumer_groups([group_id]):
        for group in response.to_object()["groups"]:
            for member in group["members"]:
                owner = member["client_host"].lstrip("/")
                try:
                    metadata = ConsumerProtocolMemberMetadata.decode(member["member_metadata"])
                    url = json.loads(metadata.user_data or b"{}").get("url")
                    owner = url.rstrip("/") if isinstance(url, str) and url else owner
                except Exception:  # not Faust's metadata: keep the host
                    pass
                if not member["member_assignment"]:
                    continue  # rebalancing
                assignment = ConsumerProtocolMemberAssignment.decode(member["member_assignment"])
                for topic, partitions in assignment.assignment:
                    for partition in partitions:
                        owners[(topic, partition)] = owner
    return owners
