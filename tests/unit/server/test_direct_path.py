"""The direct member ↔ leader path (issue #11): long-poll ShareFetch, batched state writes,
NOT_LEADER_OR_FOLLOWER re-routing, and the endpoint over real TCP, on the in-process cluster
(no Kafka). The leaders, coordinator and members are the real classes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from inprocess_helpers import TOPIC, direct_cluster, events, eventually, fetch, run
from structlog.testing import capture_logs

from queueflow.errors import ErrorCode
from queueflow.member.agent import ShareAgent
from queueflow.member.direct import DirectClient, DirectPathError
from queueflow.protocol import framing
from queueflow.structs import AcknowledgeType, TopicPartition

TP = TopicPartition(TOPIC, 0)


def test_a_parked_fetch_is_answered_when_a_record_arrives_not_when_its_wait_ends() -> None:
    async def scenario() -> None:
        async with direct_cluster() as cluster:
            leader = cluster.leaders[TOPIC]
            started = time.monotonic()
            parked = asyncio.ensure_future(leader.serve(fetch("m1", 1, max_wait_ms=5_000)))
            await asyncio.sleep(0)  # let it reach the leader and park
            for _ in range(50):
                if leader.long_polls.queues[0].parked:
                    break
                await asyncio.sleep(0.01)
            assert leader.long_polls.queues[0].parked and not parked.done()
            cluster.produce(TOPIC, b"late", partition=0)
            response = await asyncio.wait_for(parked, 2.0)
            assert response.acquired == [(0, 0, 1)]
            assert time.monotonic() - started < 2.0

    run(scenario())


def test_an_empty_long_poll_ends_after_max_wait_with_nothing() -> None:
    async def scenario() -> None:
        async with direct_cluster() as cluster:
            started = time.monotonic()
            response = await cluster.leaders[TOPIC].serve(fetch("m1", 1, max_wait_ms=300))
            waited = time.monotonic() - started
            assert response.acquired == [] and response.error == ErrorCode.NONE.value
            assert 0.25 <= waited < 2.0

    run(scenario())


def test_a_release_wakes_a_parked_fetch_of_another_member() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=1) as cluster:
            leader = cluster.leaders[TOPIC]
            first = await leader.serve(fetch("m1", 1))
            assert first.acquired == [(0, 0, 1)]
            parked = asyncio.ensure_future(leader.serve(fetch("m2", 1, max_wait_ms=5_000)))
            await asyncio.sleep(0.05)
            assert not parked.done()
            release = fetch("m1", 2, max_records=0, acks=[(0, 0, (AcknowledgeType.RELEASE,))])
            assert (await leader.serve(release)).ack_error == ErrorCode.NONE.value
            response = await asyncio.wait_for(parked, 2.0)
            assert response.acquired == [(0, 0, 2)]

    run(scenario())


def test_requests_waiting_together_are_written_as_one_delta() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=40) as cluster:
            leader = cluster.leaders[TOPIC]
            await leader.serve(fetch("m0", 1, max_records=1))  # creates the share-partition
            writes = cluster.leaders[TOPIC].partitions[("g", 0)].writes
            answers = await asyncio.gather(
                *(leader.serve(fetch(f"m{i}", 1, max_records=3)) for i in range(1, 11))
            )
            acquired = sorted(r for a in answers for r in a.acquired)
            assert [first for first, _, _ in acquired] == list(range(1, 31, 3))
            # Ten requests, at most two batches (the first may start alone): far fewer writes.
            assert leader.partitions[("g", 0)].writes - writes <= 2

    run(scenario())


def test_a_partition_this_worker_does_not_lead_is_refused_as_not_leader() -> None:
    async def scenario() -> None:
        async with direct_cluster(partitions=1) as cluster:
            leader = cluster.leaders[TOPIC]
            leader.revoke({0})
            response = await leader.serve(fetch("m1", 7))
            assert response.error == ErrorCode.NOT_LEADER_OR_FOLLOWER.value
            assert "not led by this worker" in response.error_message
            assert response.request_id == 7

    run(scenario())


def test_members_learn_the_endpoint_from_the_heartbeat_and_fetch_over_it() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=3) as cluster:
            assert cluster.endpoint is not None and cluster.endpoint.address.startswith(
                "127.0.0.1:"
            )
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            session = consumer._session
            assert session is not None
            assert session._membership.leaders == {TP: cluster.endpoint.address}
            records = await consumer.poll(timeout_ms=2_000)
            assert [r.offset for r in records] == [0, 1, 2]
            # Long poll: the next poll is answered by the arrival, well before fetch.max.wait.ms.
            started = time.monotonic()
            poll = asyncio.ensure_future(consumer.poll(timeout_ms=5_000))
            await asyncio.sleep(0.1)
            cluster.produce(TOPIC, b"new", partition=0)
            assert [r.offset for r in await poll] == [3]
            assert time.monotonic() - started < 2.5
            await consumer.close()

    run(scenario())


def test_a_dead_endpoint_reroutes_the_member_through_the_request_topic() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=2) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            session = consumer._session
            assert session is not None and cluster.endpoint is not None
            await cluster.endpoint.close()
            session._membership.leaders[TP] = "127.0.0.1:1"  # nothing listens there
            with capture_logs() as logs:
                records = await consumer.poll(timeout_ms=2_000)
            assert [r.offset for r in records] == [0, 1]
            (rerouted,) = events(logs, "direct_path_rerouted")
            assert rerouted["address"] == "127.0.0.1:1"
            assert TP not in session._membership.leaders
            await consumer.close()

    run(scenario())


def test_the_endpoint_drops_a_peer_that_does_not_speak_the_protocol() -> None:
    async def scenario() -> None:
        async with direct_cluster() as cluster:
            assert cluster.endpoint is not None
            host, port = cluster.endpoint.address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            with capture_logs() as logs:
                writer.write(b"GET / HTTP/1.1\r\n\r\n")
                await writer.drain()
                assert await asyncio.wait_for(reader.read(), 2.0) == b""  # closed, no answer
            (dropped,) = events(logs, "direct_connection_dropped")
            assert "does not speak queueflow's direct protocol" in dropped["error"]
            writer.close()
            # The endpoint still serves real members.
            client = DirectClient()
            response = await client.call(cluster.endpoint.address, fetch("m1", 1), 2.0)
            assert response.error == ErrorCode.NONE.value
            await client.close()

    run(scenario())


def test_a_client_call_to_a_closed_port_fails_with_direct_path_error() -> None:
    async def scenario() -> None:
        client = DirectClient()
        with pytest.raises(
            DirectPathError, match=r"cannot connect to the leader at 127\.0\.0\.1:1"
        ):
            await client.call("127.0.0.1:1", fetch("m1", 1), 1.0)
        await client.close()

    run(scenario())


def test_frames_refuse_absurd_sizes() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data((framing.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(Exception, match="does not speak"):
            await framing.read_frame(reader)
        empty = asyncio.StreamReader()
        empty.feed_eof()
        assert await framing.read_frame(empty) is None

    run(scenario())


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(
    ("role", "listener", "has_endpoint"),
    [
        ("all", "127.0.0.1:0", True),
        ("leader", "0.0.0.0:0", True),
        ("all", "", False),
        ("member", "127.0.0.1:0", False),
    ],
)
def test_which_workers_get_an_endpoint(role: str, listener: str, has_endpoint: bool) -> None:
    import queueflow

    app = queueflow.App(
        f"direct-{role}",
        broker="kafka://localhost:9092",
        role=role,
        share_settings={"queueflow.leader.listener": listener},
    )
    assert (app.share_groups.endpoint is not None) is has_endpoint


def test_a_fetch_carrying_acknowledgements_is_answered_at_once_not_parked() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=1) as cluster:
            leader = cluster.leaders[TOPIC]
            assert (await leader.serve(fetch("m1", 1))).acquired == [(0, 0, 1)]
            started = time.monotonic()
            accept = fetch("m1", 2, max_wait_ms=5_000, acks=[(0, 0, (AcknowledgeType.ACCEPT,))])
            response = await asyncio.wait_for(leader.serve(accept), 2.0)
            assert response.ack_error == ErrorCode.NONE.value and response.acquired == []
            assert time.monotonic() - started < 2.0

    run(scenario())


def test_a_cancelled_long_poll_is_answered_at_once_and_acquires_nothing() -> None:
    """A member that lost a share-partition ends its parked fetch there (ShareFetchCancel):
    the records that arrive next go to the partition's new member, not to it."""

    async def scenario() -> None:
        async with direct_cluster() as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            session = consumer._session
            assert session is not None
            leader = cluster.leaders[TOPIC]
            parked = asyncio.ensure_future(session.fetch(TP, 10, max_wait_ms=5_000))
            for _ in range(100):
                if (
                    leader.long_polls.queues.get(0) is not None
                    and leader.long_polls.queues[0].parked
                ):
                    break
                await asyncio.sleep(0.01)
            assert leader.long_polls.queues[0].parked and session.router.long_polls[TP]
            started = time.monotonic()
            await session.end_long_polls(TP)
            result = await asyncio.wait_for(parked, 2.0)
            assert result.records == [] and result.error is None
            assert time.monotonic() - started < 2.0
            assert not leader.long_polls.queues[0].parked and not session.router.long_polls[TP]
            cluster.produce(TOPIC, b"later", partition=0)
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.acquired_count == 0  # nobody holds it: it waits for the next fetch
            await consumer.close()

    run(scenario())


def test_a_worker_whose_membership_lease_ended_refuses_direct_requests() -> None:
    """A worker with no recent OK heartbeat may have lost its partitions without knowing:
    it answers NOT_LEADER over the direct path (the member re-routes through the request log,
    which the successor's fence splits), and parks no request past the lease's end."""

    async def scenario() -> None:
        async with direct_cluster(records=1) as cluster:
            assert cluster.endpoint is not None
            runtime: Any = cluster.server.runtime
            client = DirectClient()
            runtime.lease_ms = 0
            refused = await client.call(cluster.endpoint.address, fetch("m1", 1), 2.0)
            assert refused.error == ErrorCode.NOT_LEADER_OR_FOLLOWER.value
            assert "heartbeat" in refused.error_message and refused.acquired == []
            runtime.lease_ms = 200  # proven for 0.2 s more: a 5 s long poll ends by then
            served = await client.call(cluster.endpoint.address, fetch("m1", 2), 2.0)
            assert served.acquired == [(0, 0, 1)]
            started = time.monotonic()
            parked = await client.call(
                cluster.endpoint.address, fetch("m1", 3, max_wait_ms=5_000), 4.0
            )
            assert parked.acquired == [] and parked.error == ErrorCode.NONE.value
            assert time.monotonic() - started < 1.5
            await client.close()

    run(scenario())


def test_a_known_log_end_never_goes_back() -> None:
    """A ListOffsets answer older than what an arrivals consumer read must not lower the known
    high watermark: records below it would look absent, and no arrival would come to wake the
    long polls waiting for them (a leader + member pair left records unserved that way)."""
    from queueflow.kafka.config import KafkaClientConfig
    from queueflow.server.log_offsets import LogOffsets

    offsets = LogOffsets(KafkaClientConfig("localhost:1"))
    assert offsets._raise_end(TP, 30) == 30
    assert offsets._raise_end(TP, 22) == 30  # the stale answer
    assert offsets.known_end(TP) == 30
    assert offsets._raise_end(TP, 31) == 31


def test_an_idle_partition_s_long_polls_do_not_starve_another_partition_s_records() -> None:
    """The agent's room is shared by its share-partitions' fetch loops. A fetch of an idle
    share-partition waits at the leader (long poll) holding its room: it takes only a share,
    and a loop coming back empty lets the loops waiting for room go first. Otherwise the idle
    share-partition's loops took the room in turn forever and the other's records waited (the
    secured-listener stall of 2026-11-24)."""

    async def scenario() -> None:
        handled: list[tuple[int, int]] = []

        async def handler(record: Any) -> None:
            handled.append((record.partition, record.offset))

        async with direct_cluster(partitions=2, fetch_max_wait_ms=30_000) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=1)
            for round_ in range(6):
                busy, quiet = round_ % 2, 1 - round_ % 2
                for _ in range(12):
                    cluster.produce(TOPIC, b"burst", partition=busy)
                total = len(handled) + 12
                await eventually(lambda n=total: len(handled) == n, f"round {round_}: the burst")
                cluster.produce(TOPIC, b"single", partition=quiet)
                # Far below fetch.max.wait.ms (30 s): the record is answered by a held fetch.
                await eventually(
                    lambda n=total + 1: len(handled) == n, f"round {round_}: the single record"
                )
            await agent.stop()

    run(scenario())


def test_only_a_fetch_that_asked_for_records_and_got_none_makes_its_share_partition_idle() -> None:
    """A ShareFetch sent with no room (it only carries acknowledgements) finds no records by
    design. Taking that for an idle share-partition let its other fetch loop long-poll outside
    the room again and again: in the chaos run of 2026-11-25 a member held 406 records against
    a high water of 83, and their locks expired while queued."""

    async def scenario() -> None:
        async def handler(record: Any) -> None:
            pass

        cluster = direct_cluster()
        agent = ShareAgent(cluster.member_context, handler, TOPIC, "g")
        answers: list[int] = []

        async def reserve(tp: TopicPartition, idle: bool) -> int:
            return answers.pop(0)

        async def fetch_once(tp: TopicPartition, want: int, max_wait_ms: int | None) -> int:
            return 0  # no records

        agent.dispatch.reserve = reserve  # type: ignore[method-assign]
        agent.dispatch.fetch_once = fetch_once  # type: ignore[method-assign]
        answers.append(0)  # no room: acknowledgements only
        await agent.dispatch.fetch_round(TP, idle=False)
        assert TP not in agent.dispatch.idle_partitions
        answers.append(5)  # asked for 5, got none: idle
        await agent.dispatch.fetch_round(TP, idle=False)
        assert TP in agent.dispatch.idle_partitions

    run(scenario())


def test_an_idle_agent_holds_one_long_poll_per_share_partition() -> None:
    """An idle share-partition's two fetch loops take turns: one ShareFetch waits at the leader,
    the other loop waits for it (two would double an idle fleet's requests)."""

    async def scenario() -> None:
        async def handler(record: Any) -> None:
            pass

        async with direct_cluster(records=4, partitions=2, fetch_max_wait_ms=300) as cluster:
            leader = cluster.leaders[TOPIC]
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=2)
            await eventually(lambda: agent.stats.accepted == 4, "the records handled")
            most = {0: 0, 1: 0}
            for _ in range(150):  # 1.5 s: five long polls per share-partition
                for partition in most:
                    queue = leader.long_polls.queues.get(partition)
                    parked = len(queue.parked) if queue is not None else 0
                    most[partition] = max(most[partition], parked)
                await asyncio.sleep(0.01)
            assert most == {0: 1, 1: 1}
            await agent.stop()

    run(scenario())
