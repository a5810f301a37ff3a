"""Which ACL operations each listener request needs, and the answers that refuse it (pure).

The rules are Kafka's for share groups (KIP-932 "Security"; the broker's ``KafkaApis``):
ShareGroupHeartbeat, ShareFetch and ShareAcknowledge need READ on the group (and the heartbeat
READ on the topics it subscribes to, as a queueflow member's principal needs READ on its
topics); ShareGroupDescribe and DescribeShareGroupOffsets DESCRIBE on the groups;
AlterShareGroupOffsets READ; DeleteShareGroupOffsets and DeleteGroups DELETE; ListOffsets
DESCRIBE on the topics. A request naming several groups or topics of which one is denied is
refused whole. The operations granted come from the cluster (KIP-430 authorized operations);
docs/kafka-listener.md "Security".
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i32, i64

__all__ = ["AUTHORIZE", "AclOperation", "Need", "allows", "unauthorized_response"]

_LIST_OFFSETS = 2
_DELETE_GROUPS = 42
_SHARE_GROUP_HEARTBEAT = 76
_SHARE_GROUP_DESCRIBE = 77
_SHARE_FETCH = 78
_SHARE_ACKNOWLEDGE = 79
_DESCRIBE_SHARE_GROUP_OFFSETS = 90
_ALTER_SHARE_GROUP_OFFSETS = 91
_DELETE_SHARE_GROUP_OFFSETS = 92
_ZERO = datetime.timedelta(0)


class AclOperation(enum.IntEnum):
    """Kafka's ACL operations, numbered as in the authorized-operations bit fields (KIP-430)."""

    ALL = 2
    READ = 3
    WRITE = 4
    DELETE = 6
    DESCRIBE = 8


def allows(bits: int, operation: AclOperation) -> bool:
    """Whether an authorized-operations bit field (KIP-430) grants ``operation`` (READ,
    WRITE and DELETE imply DESCRIBE, as Kafka's authorizer has it)."""
    if bits < 0:
        return False
    granted = {operation, AclOperation.ALL}
    if operation is AclOperation.DESCRIBE:
        granted |= {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE}
    return any(bits & (1 << op) for op in granted)


@dataclass(frozen=True, slots=True)
class Need:
    """What one request needs: ``group_op`` on each of ``groups``, ``topic_op`` on each of
    ``topics``."""

    groups: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    group_op: AclOperation = AclOperation.READ
    topic_op: AclOperation = AclOperation.READ


_READ, _DESCRIBE, _DELETE = AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE

#: API key -> what a request of it needs.
AUTHORIZE: dict[int, Callable[[Any], Need]] = {
    _SHARE_GROUP_HEARTBEAT: lambda b: Need((b.group_id,), tuple(b.subscribed_topic_names or ())),
    _SHARE_FETCH: lambda b: Need((b.group_id,)),
    _SHARE_ACKNOWLEDGE: lambda b: Need((b.group_id,)),
    _SHARE_GROUP_DESCRIBE: lambda b: Need(tuple(b.group_ids), group_op=_DESCRIBE),
    _DESCRIBE_SHARE_GROUP_OFFSETS: lambda b: Need(
        tuple(g.group_id for g in b.groups), group_op=_DESCRIBE
    ),
    _ALTER_SHARE_GROUP_OFFSETS: lambda b: Need((b.group_id,)),
    _DELETE_SHARE_GROUP_OFFSETS: lambda b: Need((b.group_id,), group_op=_DELETE),
    _DELETE_GROUPS: lambda b: Need(tuple(b.groups_names), group_op=_DELETE),
    _LIST_OFFSETS: lambda b: Need(topics=tuple(t.name for t in b.topics), topic_op=_DESCRIBE),
}


def unauthorized_response(
    api_key: int, version: int, error: ErrorCode, message: str, request: Any
) -> Any:
    """The answer of ``version`` to a request of ``api_key`` (a key of :data:`AUTHORIZE`)
    whose principal lacks an ACL: ``error`` (GROUP_ or TOPIC_AUTHORIZATION_FAILED) for each
    group, topic or the whole request, as the API reports errors, and nothing done."""
    m = load_payload_module(api_key, version, EntityType.response)
    if api_key == _SHARE_GROUP_HEARTBEAT:
        return m.ShareGroupHeartbeatResponse(
            throttle_time=_ZERO,
            error_code=error,
            error_message=message,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            heartbeat_interval=_ZERO,
        )
    if api_key in (_SHARE_FETCH, _SHARE_ACKNOWLEDGE):
        lock = (
            {"acquisition_lock_timeout": _ZERO} if api_key == _SHARE_FETCH or version >= 2 else {}
        )
        name = "ShareFetchResponse" if api_key == _SHARE_FETCH else "ShareAcknowledgeResponse"
        return getattr(m, name)(
            throttle_time=_ZERO,
            error_code=error,
            error_message=message,
            responses=(),
            node_endpoints=(),
            **lock,
        )
    if api_key == _ALTER_SHARE_GROUP_OFFSETS:
        return m.AlterShareGroupOffsetsResponse(
            throttle_time=_ZERO, error_code=error, error_message=message, responses=()
        )
    if api_key == _DELETE_SHARE_GROUP_OFFSETS:
        return m.DeleteShareGroupOffsetsResponse(
            throttle_time=_ZERO, error_code=error, error_message=message, responses=()
        )
    return _per_resource(api_key, m, error, message, request)


def _per_resource(api_key: int, m: Any, error: ErrorCode, message: str, request: Any) -> Any:
    """The refusals of the APIs that answer each group or topic on its own."""
    if api_key == _SHARE_GROUP_DESCRIBE:
        return m.ShareGroupDescribeResponse(
            throttle_time=_ZERO,
            groups=tuple(
                m.DescribedGroup(
                    error_code=error,
                    error_message=message,
                    group_id=g,
                    group_state="",
                    group_epoch=i32(-1),
                    assignment_epoch=i32(-1),
                    assignor_name="",
                    members=(),
                )
                for g in request.group_ids
            ),
        )
    if api_key == _DESCRIBE_SHARE_GROUP_OFFSETS:
        return m.DescribeShareGroupOffsetsResponse(
            throttle_time=_ZERO,
            groups=tuple(
                m.DescribeShareGroupOffsetsResponseGroup(
                    group_id=g.group_id, topics=(), error_code=error, error_message=message
                )
                for g in request.groups
            ),
        )
    if api_key == _DELETE_GROUPS:
        return m.DeleteGroupsResponse(
            throttle_time=_ZERO,
            results=tuple(
                m.DeletableGroupResult(group_id=g, error_code=error) for g in request.groups_names
            ),
        )
    return m.ListOffsetsResponse(
        throttle_time=_ZERO,
        topics=tuple(
            m.ListOffsetsTopicResponse(
                name=t.name,
                partitions=tuple(
                    m.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=error,
                        timestamp=i64(-1),
                        offset=i64(-1),
                    )
                    for p in t.partitions
                ),
            )
            for t in request.topics
        ),
    )
