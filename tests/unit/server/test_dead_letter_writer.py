"""The leaders' DLQ writer in process (docs/guide.md "Dead-letter topics"): REJECTed records are
held by ``__dead_letter__``, written with their headers, then Archived; a failing DLQ write
leaves them held (nothing lost) until it succeeds."""

from __future__ import annotations

from collections import Counter

from inprocess_helpers import TOPIC, produce, run, settings

from queueflow import REJECT, RELEASE
from queueflow.protocol.dead_letters import DeadLetterRecord, SourceRecord
from queueflow.server.leader.dead_letters import DeadLetterWriter
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

DLQ = "jobs-dlq"


class FakeIO:
    """Reads the cluster's records; sends fail while ``failing``."""

    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster
        self.sent: list[tuple[str, DeadLetterRecord]] = []
        self.failing = False
        self.closed = False

    async def read(
        self, topic: str, partition: int, runs: list[tuple[int, int]]
    ) -> dict[int, SourceRecord]:
        log = self.cluster.records[(topic, partition)]  # type: ignore[index]
        return {
            o: SourceRecord(o, log[o].key, log[o].value)
            for first, last in runs
            for o in range(first, last + 1)
        }

    async def send(self, topic: str, records: list[DeadLetterRecord]) -> None:
        if self.failing:
            raise ConnectionError("not now")
        self.sent.extend((topic, r) for r in records)

    async def close(self) -> None:
        self.closed = True


def test_rejected_and_limit_records_are_written_then_archived() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        cluster = InProcessCluster(
            {TOPIC: 1, DLQ: 1},
            clock=clock,
            settings=settings(),
            group_configs={
                "g": {
                    "errors.deadletterqueue.topic.name": DLQ,
                    "share.delivery.count.limit": 2,
                }
            },
        )
        produce(cluster, 3)
        async with cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            leader = cluster.leaders[TOPIC]
            io = FakeIO(cluster)
            writer = DeadLetterWriter(leader, io)
            io.failing = True
            for _ in range(2):  # r0 REJECTed, r1 and r2 RELEASEd to the limit
                for record in await consumer.poll(timeout_ms=0):
                    kind = REJECT if record.offset == 0 else RELEASE
                    consumer.acknowledge(record, kind, error=ValueError(f"no {record.offset}"))
                await consumer.commit_sync()
            durable = leader.partitions[("g", 0)]
            held = [(r.first_offset, r.last_offset) for r in durable.engine.dead_letters()]
            assert held == [(0, 0), (1, 2)]  # two runs: delivery counts 1 and 2
            assert not await writer.round()  # the DLQ write fails: still held, nothing lost
            again = [(r.first_offset, r.last_offset) for r in durable.engine.dead_letters()]
            assert again == held
            failures = cluster.server.metrics.dead_letter_failures
            assert failures.labels("g", TOPIC, DLQ)._value.get() == 1
            io.failing = False
            assert not await writer.round()  # backing off
            writer._retry.clear()
            assert await writer.round()
            assert durable.engine.dead_letters() == []
            assert durable.engine.start_offset == 3
            reasons = Counter(dict(r.headers)["queueflow.dead_letter.reason"] for _t, r in io.sent)
            assert reasons == {b"rejected": 1, b"delivery_limit": 2}
            by_offset = {dict(r.headers)["queueflow.dead_letter.offset"]: r for _t, r in io.sent}
            assert dict(by_offset[b"1"].headers)["queueflow.dead_letter.exception.message"] == (
                b"no 1"
            )
            assert by_offset[b"0"].value == b""  # copy.record.enable defaults to false
            await consumer.close()
            await writer.stop()
            assert io.closed

    run(scenario())
