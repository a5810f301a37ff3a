"""The listener's admin APIs (``kafka-share-groups.sh``) without a broker: ShareGroupDescribe,
ListGroups, DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets and
ListOffsets answers from a stub of queueflow's admin, errors under Kafka's codes
(docs/kafka-listener.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType

from queueflow.admin import (
    MemberDescription,
    OffsetSpec,
    ShareGroupDescription,
    ShareGroupListing,
    SharePartitionOffsets,
)
from queueflow.errors import ErrorCode as QfErrorCode
from queueflow.errors import ShareGroupError
from queueflow.listener.admin import AdminGateway, kafka_error
from queueflow.listener.apis import SERVED
from queueflow.listener.metadata import TopicIds
from queueflow.structs import TopicPartition

TOPIC = "jobs"


def request(api_key: int, version: int, **fields: Any) -> Any:
    m = load_payload_module(api_key, version, EntityType.request)
    name = next(n for n in dir(m) if n.endswith("Request") and n != "RequestHeader")
    return getattr(m, name)(**fields)


def nested(api_key: int, version: int, class_name: str, **fields: Any) -> Any:
    return getattr(load_payload_module(api_key, version, EntityType.request), class_name)(**fields)


class StubAdmin:
    """Group ``g`` with one member on ``jobs``-0 and -1; ``empty`` with none."""

    def __init__(self) -> None:
        self.altered: list[tuple[str, dict[TopicPartition, int]]] = []
        self.deleted: list[tuple[str, list[str]]] = []
        self.resolved: list[OffsetSpec] = []

    async def list_groups(self, states: Iterable[str] | None = None) -> list[ShareGroupListing]:
        groups = [ShareGroupListing("empty", "Empty"), ShareGroupListing("g", "Stable")]
        wanted = None if states is None else {s.lower() for s in states}
        return [g for g in groups if wanted is None or g.state.lower() in wanted]

    async def describe_groups(self, group_ids: Iterable[str]) -> list[ShareGroupDescription]:
        (group_id,) = group_ids
        if group_id not in ("g", "empty"):
            raise ShareGroupError(QfErrorCode.GROUP_ID_NOT_FOUND, f"no group {group_id}")
        members = (
            ()
            if group_id == "empty"
            else (
                MemberDescription(
                    "m1",
                    "console-share-consumer",
                    "/127.0.0.1",
                    3,
                    (TOPIC,),
                    (TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)),
                ),
            )
        )
        state = "Empty" if group_id == "empty" else "Stable"
        return [ShareGroupDescription(group_id, state, 4, 4, {TOPIC: 2}, members)]

    async def list_offsets(
        self, group_id: str, topics_: Iterable[str] | None = None, *, records_limit: int = 0
    ) -> list[SharePartitionOffsets]:
        if group_id != "g":
            raise ShareGroupError(QfErrorCode.GROUP_ID_NOT_FOUND, f"no group {group_id}")
        return [
            SharePartitionOffsets(TOPIC, 0, 17, 20, 25, 8),
            SharePartitionOffsets(TOPIC, 1, None, None, 0, None),
        ]

    async def alter_share_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        if group_id != "empty":
            raise ShareGroupError(QfErrorCode.NON_EMPTY_GROUP, f"group {group_id} has members")
        self.altered.append((group_id, dict(offsets)))
        return dict(offsets)

    async def delete_share_group_offsets(self, group_id: str, topics_: Iterable[str]) -> None:
        if group_id != "empty":
            raise ShareGroupError(QfErrorCode.NON_EMPTY_GROUP, f"group {group_id} has members")
        self.deleted.append((group_id, list(topics_)))

    async def delete_share_groups(
        self, group_ids: Iterable[str]
    ) -> dict[str, ShareGroupError | None]:
        out: dict[str, ShareGroupError | None] = {}
        for group_id in group_ids:
            if group_id == "empty":
                out[group_id] = None
            elif group_id == "g":
                out[group_id] = ShareGroupError(QfErrorCode.NON_EMPTY_GROUP, "has members")
            else:
                out[group_id] = ShareGroupError(QfErrorCode.GROUP_ID_NOT_FOUND, "no group")
        return out

    async def resolve_offsets(
        self, partitions: Iterable[TopicPartition], spec: OffsetSpec
    ) -> dict[TopicPartition, int]:
        self.resolved.append(spec)
        value = {"earliest": 5, "latest": 25}.get(spec.kind, 11)
        return {tp: value for tp in partitions}


def gateway() -> tuple[AdminGateway, StubAdmin]:
    admin = StubAdmin()
    return AdminGateway(admin, TopicIds("app"), lambda: {TOPIC: 2}), admin


def test_admin_apis_are_listed_in_api_versions() -> None:
    for key in (2, 16, 42, 77, 90, 91, 92):
        assert key in SERVED


def test_share_group_describe_names_members_and_refuses_unknown_groups() -> None:
    gw, _ = gateway()
    answer = asyncio.run(
        gw.describe(1, request(77, 1, group_ids=("g", "nope"), include_authorized_operations=False))
    )
    g, nope = answer.groups
    assert (g.error_code, g.group_state, g.group_epoch, g.assignor_name) == (
        ErrorCode.none,
        "Stable",
        4,
        "simple",
    )
    (member,) = g.members
    assert (member.member_id, member.client_id, member.member_epoch) == (
        "m1",
        "console-share-consumer",
        3,
    )
    (tps,) = member.assignment.topic_partitions
    assert (tps.topic_name, tps.partitions, tps.topic_id) == (
        TOPIC,
        (0, 1),
        TopicIds("app").id_of(TOPIC),
    )
    assert nope.error_code == ErrorCode.group_id_not_found
    assert "no group nope" in nope.error_message


def test_list_groups_filters_by_type_and_state() -> None:
    gw, _ = gateway()
    every = asyncio.run(gw.list_groups(5, request(16, 5, states_filter=(), types_filter=())))
    assert [(g.group_id, g.group_state, g.group_type) for g in every.groups] == [
        ("empty", "Empty", "Share"),
        ("g", "Stable", "Share"),
    ]
    stable = asyncio.run(
        gw.list_groups(5, request(16, 5, states_filter=("stable",), types_filter=("Share",)))
    )
    assert [g.group_id for g in stable.groups] == ["g"]
    consumer = asyncio.run(
        gw.list_groups(5, request(16, 5, states_filter=(), types_filter=("consumer",)))
    )
    assert consumer.groups == ()


def test_describe_offsets_gives_the_spso_and_lag_or_minus_one_without_state() -> None:
    gw, _ = gateway()
    group = nested(90, 1, "DescribeShareGroupOffsetsRequestGroup", group_id="g", topics=None)
    missing = nested(90, 1, "DescribeShareGroupOffsetsRequestGroup", group_id="x", topics=None)
    answer = asyncio.run(gw.describe_offsets(1, request(90, 1, groups=(group, missing))))
    g, x = answer.groups
    (topic,) = g.topics
    assert [(p.partition_index, p.start_offset, p.lag) for p in topic.partitions] == [
        (0, 17, 8),
        (1, -1, -1),
    ]
    assert x.error_code == ErrorCode.group_id_not_found
    only_one = nested(
        90,
        0,
        "DescribeShareGroupOffsetsRequestGroup",
        group_id="g",
        topics=(
            nested(
                90, 0, "DescribeShareGroupOffsetsRequestTopic", topic_name=TOPIC, partitions=(1,)
            ),
        ),
    )
    v0 = asyncio.run(gw.describe_offsets(0, request(90, 0, groups=(only_one,))))
    assert [p.partition_index for p in v0.groups[0].topics[0].partitions] == [1]


def test_alter_offsets_only_on_an_empty_group() -> None:
    gw, admin = gateway()

    def alter(group_id: str) -> Any:
        part = nested(
            91, 0, "AlterShareGroupOffsetsRequestPartition", partition_index=1, start_offset=7
        )
        topic = nested(
            91, 0, "AlterShareGroupOffsetsRequestTopic", topic_name=TOPIC, partitions=(part,)
        )
        return asyncio.run(gw.alter_offsets(0, request(91, 0, group_id=group_id, topics=(topic,))))

    ok = alter("empty")
    assert ok.error_code == ErrorCode.none
    assert admin.altered == [("empty", {TopicPartition(TOPIC, 1): 7})]
    busy = alter("g")
    assert busy.error_code == ErrorCode.non_empty_group
    assert busy.responses[0].partitions[0].error_code == ErrorCode.non_empty_group
    assert len(admin.altered) == 1  # nothing changed


def test_delete_offsets_only_on_an_empty_group() -> None:
    gw, admin = gateway()
    topic = nested(92, 0, "DeleteShareGroupOffsetsRequestTopic", topic_name=TOPIC)
    ok = asyncio.run(gw.delete_offsets(0, request(92, 0, group_id="empty", topics=(topic,))))
    assert (ok.error_code, ok.responses[0].error_code) == (ErrorCode.none, ErrorCode.none)
    busy = asyncio.run(gw.delete_offsets(0, request(92, 0, group_id="g", topics=(topic,))))
    assert busy.error_code == ErrorCode.non_empty_group
    assert admin.deleted == [("empty", [TOPIC])]


def test_list_offsets_reads_the_log_and_refuses_unserved_partitions() -> None:
    gw, admin = gateway()

    def partition(index: int, timestamp: int) -> Any:
        return nested(2, 9, "ListOffsetsPartition", partition_index=index, timestamp=timestamp)

    topics = (
        nested(
            2,
            9,
            "ListOffsetsTopic",
            name=TOPIC,
            partitions=(
                partition(0, -2),
                partition(1, -1),
                partition(1, 1_000),
                partition(2, -2),
                partition(0, -3),
            ),
        ),
        nested(2, 9, "ListOffsetsTopic", name="other", partitions=(partition(0, -2),)),
    )
    answer = asyncio.run(
        gw.list_offsets(9, request(2, 9, replica_id=-1, isolation_level=0, topics=topics))
    )
    jobs, other = answer.topics
    assert [(p.error_code, p.offset) for p in jobs.partitions] == [
        (ErrorCode.none, 5),
        (ErrorCode.none, 25),
        (ErrorCode.none, 11),
        (ErrorCode.unknown_topic_or_partition, -1),
        (ErrorCode.invalid_request, -1),
    ]
    assert other.partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    assert [s.kind for s in admin.resolved] == ["earliest", "latest", "timestamp"]


def test_delete_groups_deletes_empty_share_groups_only() -> None:
    gw, _ = gateway()
    for version in (0, 2):
        answer = asyncio.run(
            gw.delete_groups(version, request(42, version, groups_names=("empty", "g", "x")))
        )
        assert [(r.group_id, r.error_code) for r in answer.results] == [
            ("empty", ErrorCode.none),
            ("g", ErrorCode.non_empty_group),
            ("x", ErrorCode.group_id_not_found),
        ]


def test_kafka_error_maps_queueflow_errors() -> None:
    assert (
        kafka_error(ShareGroupError(QfErrorCode.NON_EMPTY_GROUP, "x"))[0]
        == ErrorCode.non_empty_group
    )
    assert kafka_error(TimeoutError("slow"))[0] == ErrorCode.request_timed_out
    assert kafka_error(RuntimeError("bug"))[0] == ErrorCode.unknown_server_error
