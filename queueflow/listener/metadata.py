"""Metadata and FindCoordinator answers: every listener node of the app as a broker, each
share-partition of the topics the app serves led by the node of the worker that leads it
(:mod:`queueflow.listener.leadership`), and the asked listener as the coordinator of every
group (KIP-932 "Share group coordinator"; https://kafka.apache.org/protocol). Pure."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i32

from queueflow.listener.apis import FIND_COORDINATOR, METADATA
from queueflow.listener.leadership import Cluster, Node
from queueflow.structs import TopicPartition

__all__ = ["Cluster", "Node", "TopicIds", "find_coordinator_response", "metadata_response"]

_ZERO = datetime.timedelta(0)
#: Namespace of the topic ids: the same on every worker of an app.
_TOPIC_ID_NAMESPACE = uuid.UUID("6b0f2c8e-5c1d-4f6e-9a53-7d1e2b3c4a55")


class TopicIds:
    """Topic names <-> the topic ids the listener gives them: a name-based UUID (RFC 4122
    version 5) of the app id and topic name, so every worker of an app gives the same."""

    def __init__(self, app_id: str) -> None:
        self.app_id = app_id
        self._names: dict[uuid.UUID, str] = {}

    def id_of(self, topic: str) -> uuid.UUID:
        """The id of ``topic`` (remembered for :meth:`name_of`)."""
        topic_id = uuid.uuid5(_TOPIC_ID_NAMESPACE, f"{self.app_id}\0{topic}")
        self._names[topic_id] = topic
        return topic_id

    def name_of(self, topic_id: uuid.UUID | None) -> str | None:
        """The name of an id given out before, else None."""
        return None if topic_id is None else self._names.get(topic_id)


def metadata_response(
    version: int,
    request: Any,
    served: Mapping[str, int],
    cluster: Cluster,
    topic_ids: TopicIds,
    cluster_id: str,
) -> Any:
    """The Metadata answer: each asked topic (all served ones when ``request.topics`` is
    null) with each partition led by its leader's node (:meth:`Cluster.leader_of`), and the
    nodes named as brokers; a topic the app doesn't serve gets UNKNOWN_TOPIC_OR_PARTITION.

    Args:
        version: the request's version (12 or 13).
        request: the kio MetadataRequest.
        served: topic -> partition count of the topics this app serves.
        cluster: the listener nodes and who leads what.
    """
    m = load_payload_module(METADATA, version, EntityType.response)
    asked: list[tuple[str | None, uuid.UUID | None]]
    if request.topics is None:
        asked = [(name, None) for name in sorted(served)]
    else:
        asked = [(t.name, t.topic_id) for t in request.topics]
    topics = []
    for name, topic_id in asked:
        if name is None and topic_id is not None:
            name = topic_ids.name_of(topic_id)
        if name is None or name not in served:
            topics.append(
                m.MetadataResponseTopic(
                    error_code=ErrorCode.unknown_topic_or_partition,
                    name=name,
                    topic_id=topic_id or uuid.UUID(int=0),
                    partitions=(),
                )
            )
            continue
        partitions = []
        for p in range(served[name]):
            leader = cluster.leader_of(TopicPartition(name, p))
            node_id = i32(leader.node.node_id)
            partitions.append(
                m.MetadataResponsePartition(
                    error_code=ErrorCode.none,
                    partition_index=i32(p),
                    leader_id=node_id,
                    leader_epoch=i32(leader.epoch),
                    replica_nodes=(node_id,),
                    isr_nodes=(node_id,),
                )
            )
        topics.append(
            m.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name=name,
                topic_id=topic_ids.id_of(name),
                partitions=tuple(partitions),
            )
        )
    fields: dict[str, Any] = {
        "throttle_time": _ZERO,
        "brokers": tuple(
            m.MetadataResponseBroker(node_id=i32(n.node_id), host=n.host, port=i32(n.port))
            for n in cluster.nodes()
        ),
        "cluster_id": cluster_id,
        "controller_id": i32(cluster.me.node_id),
        "topics": tuple(topics),
    }
    if version >= 13:
        fields["error_code"] = ErrorCode.none
    return m.MetadataResponse(**fields)


def find_coordinator_response(
    version: int, request: Any, node: Node | Callable[[str], Node]
) -> Any:
    """The FindCoordinator answer: for every group key (key type 0, which Kafka's share
    consumers send for their share group) ``node``, or ``node(group)`` (the listener of the
    worker serving the group's coordinator partition); other key types (1: transactions, 2:
    share-group state) get INVALID_REQUEST. v0-v3 ask for one key (librdkafka), v4+ for a
    batch (Java)."""
    m = load_payload_module(FIND_COORDINATOR, version, EntityType.response)
    key_type = getattr(request, "key_type", 0)  # v0: groups only
    ok = key_type == 0
    node_of = node if callable(node) else (lambda _: node)

    def answer(key: str) -> dict[str, Any]:
        where = node_of(key) if ok else None
        out: dict[str, Any] = {
            "node_id": i32(-1 if where is None else where.node_id),
            "host": "" if where is None else where.host,
            "port": i32(-1 if where is None else where.port),
            "error_code": ErrorCode.none if ok else ErrorCode.invalid_request,
        }
        if version >= 1:
            out["error_message"] = None if ok else f"key type {key_type} is not served here"
        return out

    if version < 4:
        one = answer(request.key)
        if version >= 1:
            one["throttle_time"] = _ZERO
        return m.FindCoordinatorResponse(**one)
    return m.FindCoordinatorResponse(
        throttle_time=_ZERO,
        coordinators=tuple(
            m.Coordinator(key=key, **answer(key)) for key in request.coordinator_keys
        ),
    )
