"""The leader's handling of the redelivery wire fields and archive log (queueflow.server.leader
handlers): ``ack_delay_ms`` / ``ack_undelivered`` reach the engine, and every Archived record
is logged once as ``records_archived`` (docs/operations.md)."""

from __future__ import annotations

import msgspec
from inprocess_helpers import TOPIC, RawMember, cluster_with, run, settle

from queueflow.engine.partition import SharePartitionConfig
from queueflow.engine.reserved import DELAYED_OWNER
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader import ShareLeader, handlers
from queueflow.server.leader.results import LogEvent
from queueflow.structs import AcknowledgeType
from queueflow.testing import FakeClock

NOW = 1_000_000
RELEASE, REJECT = int(AcknowledgeType.RELEASE), int(AcknowledgeType.REJECT)


def share_partition(limit: int = 5) -> DurableSharePartition:
    config = SharePartitionConfig(delivery_count_limit=limit, throttle_delivery=False)
    return DurableSharePartition.create({}, "g", "jobs", 0, config, 0, 0)


def request(
    acks: list[tuple[int, int, tuple[int, ...]]], **fields: object
) -> protocol.ShareFetchRequest:
    return protocol.ShareFetchRequest(
        group="g",
        topic="jobs",
        partition=0,
        member_id="m",
        request_id=7,
        reply_partition=0,
        max_records=0,
        acks=acks,
        deadline_ms=NOW + 1000,
        **fields,  # type: ignore[arg-type]
    )


def archived_lines(logs: tuple[LogEvent, ...]) -> list[dict[str, object]]:
    return [dict(e.fields) for e in logs if e.event == "records_archived"]


def test_wire_delays_and_give_backs_reach_the_engine() -> None:
    durable = share_partition()
    durable.engine.acquire("m", 10, 6, NOW)
    wire = request([(0, 5, (RELEASE,))], ack_delay_ms=[(0, 1, 2500)], ack_undelivered=[(4, 5)])
    wire = protocol.decode(protocol.encode(wire))  # as it travels
    assert isinstance(wire, protocol.ShareFetchRequest)
    fetched = handlers.share_fetch(durable, wire, NOW + 1, acquire_from=None)
    assert fetched.response.ack_error == "NONE"
    engine = durable.engine
    assert engine.record(0).member_id == DELAYED_OWNER
    assert engine.record(0).lock_deadline_ms == NOW + 1 + 2500
    assert (engine.record(2).state.name, engine.record(2).delivery_count) == ("AVAILABLE", 1)
    assert (engine.record(4).state.name, engine.record(4).delivery_count) == ("AVAILABLE", 0)


def test_a_bad_delay_is_refused_with_invalid_request_and_changes_nothing() -> None:
    durable = share_partition()
    durable.engine.acquire("m", 10, 2, NOW)
    before = durable.engine.snapshot()
    bad = request([(0, 1, (RELEASE,))], ack_delay_ms=[(0, 1, 99 * 3_600_000)])
    fetched = handlers.share_fetch(durable, bad, NOW + 1, acquire_from=None)
    assert fetched.response.ack_error == "INVALID_REQUEST"
    assert "queueflow.redelivery.max.delay.ms" in fetched.response.ack_error_message
    assert durable.engine.snapshot() == before


def test_every_archived_record_is_logged_once_with_its_reason() -> None:
    durable = share_partition(limit=2)
    durable.engine.acquire("m", 10, 6, NOW)
    fetched = handlers.share_fetch(
        durable, request([(0, 1, (REJECT,)), (2, 5, (RELEASE,))]), NOW + 1, acquire_from=None
    )
    lines = archived_lines(fetched.effects.logs)
    assert lines == [
        {
            "group": "g",
            "partition": 0,
            "offsets": "0..1",
            "records": 2,
            "reason": "rejected",
            "delivery_count": 1,
        }
    ]
    durable.engine.acquire("m", 10, 6, NOW + 2)  # second delivery, at the limit
    result = handlers.tick([durable], NOW + 2 + 30_000)  # the lock runs out
    (line,) = archived_lines(result.logs)
    assert (line["offsets"], line["reason"], line["delivery_count"]) == (
        "2..5",
        "delivery_limit",
        2,
    )
    assert archived_lines(handlers.tick([durable], NOW + 10**6).logs) == []  # once only


def test_a_delay_survives_a_leader_failover() -> None:
    """A delayed record is durable (the v3 lock section, owner ``__delayed__``): after the
    partition moves to a new leader it is still not Available before its time, then is
    delivered again with its count (the delay's end counts no delivery)."""

    async def scenario() -> None:
        clock = FakeClock()
        async with cluster_with(3, clock=clock) as cluster:
            m = RawMember(cluster, "m")
            assert (await m.fetch(0, 10)).acquired == [(0, 2, 1)]
            request = msgspec.structs.replace(
                m.fetch_request(0, 0, acks=[(0, 2, (RELEASE,))]), ack_delay_ms=[(0, 2, 60_000)]
            )
            answer = await m.call(topics.request_topic(cluster.app_id, TOPIC), 0, request)
            assert isinstance(answer, protocol.ShareFetchResponse)
            assert answer.ack_error == "NONE"
            await settle(cluster)
            cluster.leaders[TOPIC].revoke({0})  # failover: the partition moves away
            fresh = ShareLeader(cluster.server, TOPIC, cluster.tables[TOPIC])
            fresh.assign({0}, 2)
            await fresh.send_fences()
            await fresh.handle(0, 100, cluster.bus.sent[-1][2])  # its fence read back: live
            other = RawMember(cluster, "m-other")
            early = await other.fetch(0, 10, handler=fresh.handle, offset=101)
            assert early.error == "NONE" and early.acquired == []
            engine = fresh.partitions[("g", 0)].engine
            assert engine.record(1).member_id == DELAYED_OWNER and engine.delayed_count == 3
            clock.advance(60_001)
            late = await other.fetch(0, 10, handler=fresh.handle, offset=102)
            assert late.acquired == [(0, 2, 2)]

    run(scenario())
