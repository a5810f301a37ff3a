"""The leaders' and coordinator's metrics through ``InProcessCluster``: the share-partition
gauges follow every state change (not only ShareFetch), and the counters count what happened
(issue #14 item 6)."""

from __future__ import annotations

from typing import Any

from inprocess_helpers import TOPIC, cluster_with, poll_until, run, until

from queueflow import ACCEPT, REJECT
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

LABELS = {"group": "g", "topic": TOPIC, "partition": "0"}


def sample(cluster: InProcessCluster, name: str, **extra: str) -> float | None:
    labels = {**LABELS, **extra} if "group" not in extra else extra
    return cluster.metrics.registry.get_sample_value(name, labels)


def gauge(cluster: InProcessCluster, name: str, **extra: str) -> float | None:
    return sample(cluster, f"queueflow_share_partition_{name}", **extra)


def by_state(cluster: InProcessCluster) -> dict[str, Any]:
    return {
        s: gauge(cluster, "records", state=s)
        for s in ("available", "acquired", "acknowledged", "archived")
    }


def test_gauges_follow_lock_expiry_ticks_and_released_members() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(6, clock=clock, record_lock_duration_ms=5000) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            got = await poll_until(consumer, 6, clock)
            assert gauge(cluster, "acquired_records") == 6
            assert by_state(cluster) == {
                "available": 0,
                "acquired": 6,
                "acknowledged": 0,
                "archived": 0,
            }
            assert gauge(cluster, "log_end_offset") == 6 and gauge(cluster, "lag_records") == 6
            assert sample(cluster, "queueflow_share_partition_acquisitions_total") == 6
            first = "queueflow_share_partition_deliveries_total"
            assert sample(cluster, first, delivery_count="1") == 6

            # Two outcomes: ACCEPT 0, REJECT 1 (Archived); the SPSO moves past both.
            consumer.acknowledge(got[0], ACCEPT)
            consumer.acknowledge(got[1], REJECT)
            await consumer.commit_sync()
            assert gauge(cluster, "start_offset") == 2 and gauge(cluster, "lag_records") == 4
            assert sample(cluster, "queueflow_share_partition_archived_records_total") == 1

            # No ShareFetch from here on: the lock expires on a tick, and the gauges say so.
            clock.advance(6000)
            await cluster.tick()
            assert gauge(cluster, "acquired_records") == 0
            assert by_state(cluster)["available"] == 4
            assert sample(cluster, "queueflow_share_partition_lock_expiries_total") == 4
            await consumer.close()

            # A second member acquires, then is released by the coordinator (it leaves).
            other = cluster.consumer("g", acknowledgement_mode="explicit")
            await other.subscribe([TOPIC])
            await poll_until(other, 4, clock)
            assert gauge(cluster, "acquired_records") == 4
            assert sample(cluster, first, delivery_count="2") == 4
            await other.close()  # leaves: the leader releases its records
            await cluster.bus.drain()
            assert gauge(cluster, "acquired_records") == 0
            assert by_state(cluster)["available"] == 4

            members = cluster.metrics.registry.get_sample_value(
                "queueflow_share_group_members", {"group": "g"}
            )
            rebalances = cluster.metrics.registry.get_sample_value(
                "queueflow_share_group_rebalances_total", {"group": "g"}
            )
            epoch = cluster.metrics.registry.get_sample_value(
                "queueflow_share_group_epoch", {"group": "g"}
            )
            assert members == 0
            # join, leave, join, leave: each bumps the group epoch once
            assert epoch is not None and rebalances == epoch == 4

    run(scenario())


def test_share_agents_observe_the_acknowledgement_latency() -> None:
    """From the ShareFetch answer to the outcome: the handler's time (fake clock) and the
    queueing; one observation per record outcome."""
    clock = FakeClock()

    async def handler(record: Any) -> Any:
        clock.advance(2000)  # the handler "takes" 2 s of the fake monotonic clock
        return ACCEPT

    async def scenario() -> None:
        async with cluster_with(3, clock=clock) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=1)
            await until(lambda: gauge(cluster, "start_offset") == 3, "every record done", clock)
            await agent.stop()
            labels = {"group": "g", "topic": TOPIC}
            registry = cluster.metrics.registry
            name = "queueflow_acknowledgement_latency_seconds"
            assert registry.get_sample_value(f"{name}_count", labels) == 3
            # each took its handler's 2 s at least (plus the wait for the handlers before it
            # when the records came in one ShareFetch)
            assert registry.get_sample_value(f"{name}_sum", labels) >= 6
            assert registry.get_sample_value(f"{name}_bucket", {**labels, "le": "1.0"}) == 0

    run(scenario())
