"""Kafka's admin APIs for share groups, answered from queueflow's admin
(:class:`~queueflow.admin.ShareGroupAdmin`), so that ``kafka-share-groups.sh`` (Java's
``Admin.describeShareGroups``, ``listShareGroupOffsets``, ``listGroups``,
``alterShareGroupOffsets``, ``deleteShareGroupOffsets``, ``listOffsets``) works against the
listener (KIP-932 "Administration"; https://kafka.apache.org/protocol). The reads go to the
app's changelogs and the writes to the group's coordinator, with queueflow's rules (an offset
reset or delete only on an empty group); errors come back under Kafka's codes."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i32, i64

from queueflow.admin import (
    OffsetSpec,
    ShareGroupDescription,
    ShareGroupListing,
    SharePartitionOffsets,
)
from queueflow.errors import ConfigurationError, ShareGroupError
from queueflow.listener.apis import (
    ALTER_SHARE_GROUP_OFFSETS,
    DELETE_GROUPS,
    DELETE_SHARE_GROUP_OFFSETS,
    DESCRIBE_SHARE_GROUP_OFFSETS,
    LIST_GROUPS,
    LIST_OFFSETS,
    SHARE_GROUP_DESCRIBE,
)
from queueflow.listener.metadata import TopicIds
from queueflow.structs import TopicPartition

__all__ = [
    "AdminGateway",
    "GroupAdmin",
    "kafka_error",
]

_ZERO = datetime.timedelta(0)
#: ListOffsets timestamps with a meaning (KIP-79, KIP-734): the log start and end.
_EARLIEST, _LATEST = -2, -1


class GroupAdmin(Protocol):
    """What the gateway needs of :class:`~queueflow.admin.ShareGroupAdmin` (its methods, same
    arguments and errors)."""

    async def list_groups(self, states: Iterable[str] | None = None) -> list[ShareGroupListing]:
        """Every share group of the app."""

    async def describe_groups(self, group_ids: Iterable[str]) -> list[ShareGroupDescription]:
        """The groups, described."""

    async def list_offsets(
        self, group_id: str, topics_: Iterable[str] | None = None, *, records_limit: int = 0
    ) -> list[SharePartitionOffsets]:
        """The offsets of the group's share-partitions."""

    async def alter_share_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Set the SPSO of share-partitions of an empty group."""

    async def delete_share_group_offsets(self, group_id: str, topics_: Iterable[str]) -> None:
        """Delete the share-partition state of topics of an empty group."""

    async def resolve_offsets(
        self, partitions: Iterable[TopicPartition], spec: OffsetSpec
    ) -> dict[TopicPartition, int]:
        """Log offsets by spec."""

    async def delete_share_groups(
        self, group_ids: Iterable[str]
    ) -> dict[str, ShareGroupError | None]:
        """Delete empty share groups; per group, None or why not."""


def kafka_error(exc: BaseException) -> tuple[ErrorCode, str]:
    """Kafka's error code and a message for an error of queueflow's admin: a
    :class:`ShareGroupError` under the code of the same name (``NON_EMPTY_GROUP``,
    ``GROUP_ID_NOT_FOUND``, ...), a timeout as ``REQUEST_TIMED_OUT``, a bad request as
    ``INVALID_REQUEST``, anything else as ``UNKNOWN_SERVER_ERROR``."""
    if isinstance(exc, ShareGroupError):
        name = exc.code.name.lower()
        code = ErrorCode[name] if name in ErrorCode.__members__ else ErrorCode.unknown_server_error
        return code, exc.message
    if isinstance(exc, TimeoutError):
        return ErrorCode.request_timed_out, f"the app's changelogs did not answer in time: {exc}"
    if isinstance(exc, (ConfigurationError, ValueError)):
        return ErrorCode.invalid_request, str(exc)
    return ErrorCode.unknown_server_error, repr(exc)


def _module(api_key: int, version: int) -> Any:
    return load_payload_module(api_key, version, EntityType.response)


class AdminGateway:
    """Answers the admin APIs of one listener from ``admin``.

    Args:
        admin: the app's share-group admin.
        topic_ids: the listener's topic ids (the ids Metadata gave).
        served: returns the topics the app serves (topic -> partition count), as last read.
    """

    def __init__(self, admin: GroupAdmin, topic_ids: TopicIds, served: Any) -> None:
        self._admin = admin
        self._topic_ids = topic_ids
        self._served = served

    async def describe(self, version: int, request: Any) -> Any:
        """ShareGroupDescribe (v1): each group's state, epochs and members with their
        assignments; a group the app doesn't know gets GROUP_ID_NOT_FOUND."""
        m = _module(SHARE_GROUP_DESCRIBE, version)
        groups = []
        for group_id in request.group_ids:
            try:
                (group,) = await self._admin.describe_groups([group_id])
            except Exception as exc:  # each group answers on its own, as Kafka's coordinator
                code, message = kafka_error(exc)
                groups.append(
                    m.DescribedGroup(
                        error_code=code,
                        error_message=message,
                        group_id=group_id,
                        group_state="Dead",
                        group_epoch=i32(-1),
                        assignment_epoch=i32(-1),
                        assignor_name="",
                        members=(),
                    )
                )
                continue
            groups.append(self._described(m, group))
        return m.ShareGroupDescribeResponse(throttle_time=_ZERO, groups=tuple(groups))

    def _described(self, m: Any, group: ShareGroupDescription) -> Any:
        members = []
        for member in group.members:
            by_topic: dict[str, list[int]] = {}
            for tp in member.assignment:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            members.append(
                m.Member(
                    member_id=member.member_id,
                    rack_id=member.rack_id or None,
                    member_epoch=i32(member.member_epoch),
                    client_id=member.client_id,
                    client_host=member.host,
                    subscribed_topic_names=tuple(member.subscribed_topics),
                    assignment=m.Assignment(
                        topic_partitions=tuple(
                            m.TopicPartitions(
                                topic_id=self._topic_ids.id_of(topic),
                                topic_name=topic,
                                partitions=tuple(i32(p) for p in sorted(parts)),
                            )
                            for topic, parts in sorted(by_topic.items())
                        )
                    ),
                )
            )
        return m.DescribedGroup(
            error_code=ErrorCode.none,
            group_id=group.group_id,
            group_state=group.state,
            group_epoch=i32(group.group_epoch),
            assignment_epoch=i32(group.assignment_epoch),
            assignor_name=group.assignor,
            members=tuple(members),
        )

    async def list_groups(self, version: int, request: Any) -> Any:
        """ListGroups (v5): the app's share groups (type ``Share``, protocol type ``share``),
        filtered by the states and types asked for (case-insensitive, as Kafka)."""
        m = _module(LIST_GROUPS, version)
        types = {t.lower() for t in request.types_filter}
        states = [s for s in request.states_filter] or None
        listed: list[ShareGroupListing] = []
        error = ErrorCode.none
        if not types or "share" in types:
            try:
                listed = await self._admin.list_groups(states)
            except Exception as exc:
                error, _ = kafka_error(exc)
        return m.ListGroupsResponse(
            throttle_time=_ZERO,
            error_code=error,
            groups=tuple(
                m.ListedGroup(
                    group_id=g.group_id,
                    protocol_type="share",
                    group_state=g.state,
                    group_type="Share",
                )
                for g in listed
            ),
        )

    async def describe_offsets(self, version: int, request: Any) -> Any:
        """DescribeShareGroupOffsets (v0-v1): the SPSO and lag (v1; KIP-1226) of each asked
        share-partition (all of the group's when the topics are null); ``-1`` where the group
        has no state yet."""
        m = _module(DESCRIBE_SHARE_GROUP_OFFSETS, version)
        groups = []
        for asked in request.groups:
            wanted = (
                None
                if asked.topics is None
                else {t.topic_name: set(t.partitions) for t in asked.topics}
            )
            try:
                offsets = await self._admin.list_offsets(
                    asked.group_id, None if wanted is None else sorted(wanted)
                )
            except Exception as exc:
                code, message = kafka_error(exc)
                groups.append(
                    m.DescribeShareGroupOffsetsResponseGroup(
                        group_id=asked.group_id, topics=(), error_code=code, error_message=message
                    )
                )
                continue
            groups.append(
                m.DescribeShareGroupOffsetsResponseGroup(
                    group_id=asked.group_id,
                    topics=self._offset_topics(m, version, offsets, wanted),
                    error_code=ErrorCode.none,
                )
            )
        return m.DescribeShareGroupOffsetsResponse(throttle_time=_ZERO, groups=tuple(groups))

    def _offset_topics(
        self,
        m: Any,
        version: int,
        offsets: list[SharePartitionOffsets],
        wanted: Mapping[str, set[int]] | None,
    ) -> tuple[Any, ...]:
        by_topic: dict[str, list[Any]] = {}
        for o in offsets:
            parts = None if wanted is None else wanted.get(o.topic)
            if parts is not None and parts and o.partition not in parts:
                continue
            fields: dict[str, Any] = {
                "partition_index": i32(o.partition),
                "start_offset": i64(-1 if o.start_offset is None else o.start_offset),
                "leader_epoch": i32(-1 if o.start_offset is None else 0),
                "error_code": ErrorCode.none,
            }
            if version >= 1:
                fields["lag"] = i64(-1 if o.lag is None else o.lag)
            by_topic.setdefault(o.topic, []).append(
                m.DescribeShareGroupOffsetsResponsePartition(**fields)
            )
        return tuple(
            m.DescribeShareGroupOffsetsResponseTopic(
                topic_name=topic,
                topic_id=self._topic_ids.id_of(topic),
                partitions=tuple(parts),
            )
            for topic, parts in sorted(by_topic.items())
        )

    async def alter_offsets(self, version: int, request: Any) -> Any:
        """AlterShareGroupOffsets (v0): set the SPSO of the asked share-partitions of an empty
        group (``--reset-offsets --execute``); a group with members gets NON_EMPTY_GROUP and
        nothing changes."""
        m = _module(ALTER_SHARE_GROUP_OFFSETS, version)
        offsets = {
            TopicPartition(t.topic_name, int(p.partition_index)): int(p.start_offset)
            for t in request.topics
            for p in t.partitions
        }
        error, message = ErrorCode.none, None
        try:
            await self._admin.alter_share_group_offsets(request.group_id, offsets)
        except Exception as exc:
            error, message = kafka_error(exc)
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(offsets):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return m.AlterShareGroupOffsetsResponse(
            throttle_time=_ZERO,
            error_code=error,
            error_message=message,
            responses=tuple(
                m.AlterShareGroupOffsetsResponseTopic(
                    topic_name=topic,
                    topic_id=self._topic_ids.id_of(topic),
                    partitions=tuple(
                        m.AlterShareGroupOffsetsResponsePartition(
                            partition_index=i32(p), error_code=error, error_message=message
                        )
                        for p in parts
                    ),
                )
                for topic, parts in sorted(by_topic.items())
            ),
        )

    async def delete_offsets(self, version: int, request: Any) -> Any:
        """DeleteShareGroupOffsets (v0): delete the group's state of the asked topics (an
        empty group only: NON_EMPTY_GROUP otherwise)."""
        m = _module(DELETE_SHARE_GROUP_OFFSETS, version)
        names = [t.topic_name for t in request.topics]
        error, message = ErrorCode.none, None
        try:
            await self._admin.delete_share_group_offsets(request.group_id, names)
        except Exception as exc:
            error, message = kafka_error(exc)
        return m.DeleteShareGroupOffsetsResponse(
            throttle_time=_ZERO,
            error_code=error,
            error_message=message,
            responses=tuple(
                m.DeleteShareGroupOffsetsResponseTopic(
                    topic_name=name,
                    topic_id=self._topic_ids.id_of(name),
                    error_code=error,
                    error_message=message,
                )
                for name in names
            ),
        )

    async def delete_groups(self, version: int, request: Any) -> Any:
        """DeleteGroups (v0-v2; ``--delete``): delete each empty share group (its metadata
        and the state of its share-partitions); a group with members gets NON_EMPTY_GROUP,
        an unknown one GROUP_ID_NOT_FOUND."""
        m = _module(DELETE_GROUPS, version)
        names = list(request.groups_names)
        try:
            outcome: Mapping[str, BaseException | None] = await self._admin.delete_share_groups(
                names
            )
        except Exception as exc:
            outcome = {name: exc for name in names}
        results = []
        for name in names:
            error = outcome.get(name)
            code = ErrorCode.none if error is None else kafka_error(error)[0]
            results.append(m.DeletableGroupResult(group_id=name, error_code=code))
        return m.DeleteGroupsResponse(throttle_time=_ZERO, results=tuple(results))

    async def list_offsets(self, version: int, request: Any) -> Any:
        """ListOffsets (v6-v11; ``--reset-offsets --to-earliest/--to-latest/--to-datetime``):
        the log start (timestamp -2), end (-1) or first offset at or after a timestamp, read
        from the app's cluster; topics the app doesn't serve get UNKNOWN_TOPIC_OR_PARTITION,
        other special timestamps INVALID_REQUEST."""
        m = _module(LIST_OFFSETS, version)
        served = self._served()
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                code, offset = await self._offset(t.name, int(p.partition_index), p, served)
                parts.append(
                    m.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=code,
                        timestamp=i64(-1),
                        offset=i64(offset),
                        leader_epoch=i32(0 if code is ErrorCode.none else -1),
                    )
                )
            topics.append(m.ListOffsetsTopicResponse(name=t.name, partitions=tuple(parts)))
        return m.ListOffsetsResponse(throttle_time=_ZERO, topics=tuple(topics))

    async def _offset(
        self, topic: str, partition: int, asked: Any, served: Mapping[str, int]
    ) -> tuple[ErrorCode, int]:
        if not 0 <= partition < served.get(topic, 0):
            return ErrorCode.unknown_topic_or_partition, -1
        ts = int(asked.timestamp)
        if ts == _EARLIEST:
            spec = OffsetSpec.earliest()
        elif ts == _LATEST:
            spec = OffsetSpec.latest()
        elif ts >= 0:
            spec = OffsetSpec.at(ts)
        else:
            return ErrorCode.invalid_request, -1
        tp = TopicPartition(topic, partition)
        try:
            found = await self._admin.resolve_offsets([tp], spec)
        except Exception as exc:
            return kafka_error(exc)[0], -1
        return ErrorCode.none, found[tp]
