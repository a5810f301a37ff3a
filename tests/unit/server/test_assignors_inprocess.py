"""The choice of assignor and its lag input through ``InProcessCluster``: the real coordinator,
leaders, members and admin on in-memory topics (``queueflow.engine.assignors``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from inprocess_helpers import TOPIC, cluster_with, events, eventually, run, settings
from structlog.testing import capture_logs

from queueflow.errors import ConfigurationError
from queueflow.kafka.admin import leader_racks
from queueflow.member.consumer import ShareConsumer
from queueflow.member.context import MemberContext
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.server.coordinator import ShareGroupCoordinator
from queueflow.structs import TopicPartition
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster, _MemberIO


async def heartbeat(
    cluster: InProcessCluster, member_id: str, epoch: int, **fields: Any
) -> protocol.HeartbeatResponse:
    """One heartbeat of ``member_id`` sent as is (``fields``: ``assignors``, ``rack_id``)."""
    replies: list[Any] = []
    cluster.bus.members[member_id.encode()] = lambda raw: replies.append(protocol.decode(raw))
    request = protocol.HeartbeatRequest(
        group="g",
        member_id=member_id,
        member_epoch=epoch,
        subscribed_topics=[TOPIC],
        reply_partition=0,
        request_id=1,
        **fields,
    )
    await cluster.bus.send(
        topics.coordinator_topic(cluster.app_id), 0, protocol.encode(request), b"k"
    )
    await cluster.bus.drain()
    await eventually(lambda: bool(replies), f"an answer to {member_id}")
    reply = replies[-1]
    assert isinstance(reply, protocol.HeartbeatResponse) and reply.error == "NONE", reply
    return reply


def test_rolling_upgrade_keeps_simple_until_the_last_old_member_leaves() -> None:
    async def scenario() -> None:
        async with cluster_with(0, partitions=4, assignors="lag,simple") as cluster:
            admin = cluster.admin()
            with capture_logs() as logs:
                await heartbeat(cluster, "old-1", 0)
                await heartbeat(cluster, "old-2", 0)
                new = ["simple", "lag", "rack"]
                await heartbeat(cluster, "new-1", 0, assignors=new, rack_id="r1")
                (described,) = await admin.describe_groups(["g"])
                assert described.assignor == "simple"
                members = {m.member_id: m for m in described.members}
                assert members["old-1"].assignors == ()
                assert (members["new-1"].assignors, members["new-1"].rack_id) == (tuple(new), "r1")
                await heartbeat(cluster, "old-1", -1)
                assert cluster.coordinator.groups["g"].assignor == "simple"
                await heartbeat(cluster, "new-2", 0, assignors=new)
                await heartbeat(cluster, "old-2", -1)  # the last old member
                (described,) = await admin.describe_groups(["g"])
                assert described.assignor == "lag"
                # A new old member (a rollback) brings simple back.
                await heartbeat(cluster, "old-3", 0)
                assert cluster.coordinator.groups["g"].assignor == "simple"
            selected = events(logs, "assignor_selected")
            assert [e["assignor"] for e in selected] == ["simple", "lag", "simple"]
            assert "'lag' not supported by 1 member(s): old-3" in selected[2]["reason"]
            assert selected[1]["reason"].startswith("most preferred")

    run(scenario())


def test_members_advertise_their_settings() -> None:
    async def scenario() -> None:
        async with cluster_with(0, partitions=2, assignors="rack") as cluster:

            def member(**overrides: Any) -> ShareConsumer:
                ctx = MemberContext(
                    cluster.app_id,
                    settings(**overrides),
                    _MemberIO(cluster),
                    clock=cluster.clock,
                    metrics=cluster.metrics,
                )
                return ShareConsumer("g", app_id=cluster.app_id, context=ctx)

            new = member(member_assignors="rack", client_rack="eu-1a")
            old = member(member_assignors="")  # advertises nothing, like an older queueflow
            await new.subscribe([TOPIC])
            group = cluster.coordinator.groups["g"]
            assert group.assignor == "rack"
            (joined,) = group.members.values()
            assert (joined.assignors, joined.rack_id) == (("rack",), "eu-1a")
            await old.subscribe([TOPIC])
            assert group.assignor == "simple"
            await old.close()
            assert group.assignor == "rack"
            await new.close()

    run(scenario())


def test_lag_reported_by_the_leaders_weights_the_assignment() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        cluster = InProcessCluster(
            {TOPIC: 2},
            clock=clock,
            settings=settings(assignors="lag", leader_listener="127.0.0.1:0"),
            direct=True,
        )
        for i in range(40):
            cluster.produce(TOPIC, f"r{i}".encode(), partition=0 if i < 4 else 1)  # 4 and 36
        async with cluster:
            await heartbeat(cluster, "m0", 0, assignors=["lag"])
            leader = cluster.leaders[TOPIC]
            for p in (0, 1):  # load the share-partitions, as a first ShareFetch does
                await leader.cache.get("g", p)
            assert leader.lag_report([0, 1]) == [("g", 0, 4), ("g", 1, 36)]
            assert leader.lag_report([1]) == [("g", 1, 36)]
            clock.advance(10_000)  # the next announcement is due
            await cluster.endpoint.announce()  # type: ignore[union-attr]
            await cluster.bus.drain()
            assert cluster.coordinator.lag["g"] == {
                (TOPIC, 0): (4, clock.now_ms()),
                (TOPIC, 1): (36, clock.now_ms()),
            }
            for i in range(1, 5):
                await heartbeat(cluster, f"m{i}", 0, assignors=["lag"])
            group = cluster.coordinator.groups["g"]
            counts = Counter(tp.partition for m in group.members.values() for tp in m.assignment)
            assert counts == {0: 1, 1: 4}  # SimpleAssignor would give 3 and 2
            assert group.lag == {TopicPartition(TOPIC, 0): 4, TopicPartition(TOPIC, 1): 36}
            # The lag moves to partition 0: the next refresh (every
            # queueflow.assignor.refresh.interval.ms, on a coordinator tick) follows it.
            epoch = group.group_epoch
            clock.advance(30_000)
            moved = protocol.LeaderAnnouncement(
                topic=TOPIC,
                partitions=[0, 1],
                leader_epoch=1,
                address=cluster.endpoint.address,  # type: ignore[union-attr]
                lag=[("g", 0, 50), ("g", 1, 2)],
            )
            coordinator_topic = topics.coordinator_topic(cluster.app_id)
            for message in (moved, protocol.Tick(sent_ms=clock.now_ms())):
                await cluster.bus.send(coordinator_topic, 0, protocol.encode(message), b"k")
            await cluster.bus.drain()
            counts = Counter(tp.partition for m in group.members.values() for tp in m.assignment)
            assert counts == {0: 4, 1: 1} and group.group_epoch == epoch + 1
            clock.advance(60_000)  # reports this old no longer count
            assert cluster.coordinator.state.directory.fresh_lag("g", clock.now_ms()) == {}

    run(scenario())


def test_unknown_assignor_in_the_coordinator_settings_is_refused() -> None:
    server = cluster_with(0).server
    server.settings = settings(assignors="lag,fastest")
    with pytest.raises(ConfigurationError, match=r"group\.share\.assignors: unknown.*'fastest'"):
        ShareGroupCoordinator(server, {})


def test_rack_members_get_the_partitions_led_in_their_rack() -> None:
    async def scenario() -> None:
        async with cluster_with(0, partitions=4, assignors="rack") as cluster:
            asked: list[list[str]] = []

            async def partition_racks(names: list[str]) -> dict[TopicPartition, str]:
                asked.append(names)
                return {TopicPartition(TOPIC, p): ("r1" if p % 2 else "r2") for p in range(4)}

            # The in-process cluster is its own topic metadata; give it broker racks.
            cluster.partition_racks = partition_racks  # type: ignore[attr-defined]
            await heartbeat(cluster, "a", 0, assignors=["rack"], rack_id="r1")
            await heartbeat(cluster, "b", 0, assignors=["rack"], rack_id="r2")
            group = cluster.coordinator.groups["g"]
            assert group.assignor == "rack" and asked == [[TOPIC], [TOPIC]]
            assignment = {m: [tp.partition for tp in group.members[m].assignment] for m in "ab"}
            assert assignment == {"a": [1, 3], "b": [0, 2]}

    run(scenario())


def test_leader_racks_from_cluster_metadata() -> None:
    brokers = [{"node_id": 1, "rack": "eu-1a"}, {"node_id": 2, "rack": None}]
    described = [
        {
            "topic": "t",
            "error_code": 0,
            "partitions": [
                {"partition": 0, "leader": 1},
                {"partition": 1, "leader": 2},  # no broker.rack
                {"partition": 2, "leader": -1},  # no leader
            ],
        },
        {"topic": "gone", "error_code": 3, "partitions": []},
    ]
    assert leader_racks(brokers, described) == {TopicPartition("t", 0): "eu-1a"}
