"""Leaders announce their Kafka-protocol listener and the coordinator partitions they serve
with their direct endpoint, so that every listener can name the others in Metadata and
FindCoordinator (in-process cluster with the direct path; docs/kafka-listener.md "Which node
leads a share-partition")."""

from __future__ import annotations

import asyncio

from inprocess_helpers import TOPIC, direct_cluster, run

from queueflow.member.session import ShareFetchSession
from queueflow.structs import TopicPartition


def test_leaders_announce_their_listener_and_their_coordinator_partitions() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=2, partitions=2) as cluster:
            endpoint, coordinator = cluster.endpoint, cluster.coordinator
            assert endpoint is not None
            endpoint.advertise_kafka_listener("127.0.0.1:9192")
            endpoint.coordinator_partitions = coordinator.live_partitions
            session = ShareFetchSession(cluster.member_context, "g", [TOPIC], "test")
            await session.start()
            for p in (0, 1):  # the share-partitions go live on their first request
                await session.fetch(TopicPartition(TOPIC, p), 1)
            assert coordinator.live_partitions() == [(0, coordinator.epoch("g"))]
            now = cluster.clock.now_ms

            async def announced() -> bool:
                await endpoint.announce()
                await cluster.bus.drain()
                return bool(coordinator.kafka_leaders(now()))

            deadline = asyncio.get_running_loop().time() + 5
            while not await announced():
                assert asyncio.get_running_loop().time() < deadline, "nothing announced"
                await asyncio.sleep(0.01)
            leaders = coordinator.kafka_leaders(now())
            assert {tp: address for tp, (_, address) in leaders.items()} == {
                (TOPIC, 0): "127.0.0.1:9192",
                (TOPIC, 1): "127.0.0.1:9192",
            }
            assert coordinator.kafka_coordinator("g", now()) == "127.0.0.1:9192"
            # a listener turned off is announced as such at once (every topic again)
            endpoint.advertise_kafka_listener("")
            assert not await announced()
            await session.close()

    run(scenario())
