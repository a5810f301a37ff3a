"""Members and redelivery, in process: ``ShareConsumer.acknowledge(..., delay=)`` and
``queueflow.release``, bad delays, and a share agent returning ``queueflow.release(...)``
(docs/concepts.md "Delayed redelivery")."""

from __future__ import annotations

import datetime

import pytest
from inprocess_helpers import TOPIC, cluster_with, eventually, run, settle, until

import queueflow
from queueflow.engine.partition import RecordState
from queueflow.engine.reserved import DELAYED_OWNER
from queueflow.errors import ConfigurationError
from queueflow.structs import ShareRecord
from queueflow.testing import FakeClock


def test_a_consumer_releases_with_a_delay_and_bad_delays_record_nothing() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        async with cluster_with(2, clock=clock) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            first, second = await consumer.poll(timeout_ms=0)
            for kind, delay, words in (
                (queueflow.RELEASE, -0.5, ">= 0 seconds"),
                (queueflow.RELEASE, datetime.timedelta(hours=13), "above the maximum"),
                (queueflow.ACCEPT, 1, "RELEASE only"),
                (queueflow.RENEW, 1, "RELEASE only"),
            ):
                with pytest.raises(ConfigurationError, match=words):
                    consumer.acknowledge(first, kind, delay=delay)
            consumer.acknowledge(first, queueflow.RELEASE, delay=2.5)
            consumer.acknowledge(second, queueflow.release(datetime.timedelta(seconds=4)))
            now = clock.now_ms()
            await consumer.commit_sync()
            engine = cluster.share_partition("g", TOPIC, 0)
            assert [engine.record(o).member_id for o in (0, 1)] == [DELAYED_OWNER] * 2
            assert engine.record(0).lock_deadline_ms == now + 2500
            assert engine.record(1).lock_deadline_ms == now + 4000
            assert await consumer.poll(timeout_ms=0) == []  # not before its time
            clock.advance(2500)
            await cluster.tick()
            (again,) = await consumer.poll(timeout_ms=0)
            assert (again.offset, again.delivery_count) == (0, 2)
            consumer.acknowledge(again, queueflow.ACCEPT)
            await consumer.close()

    run(scenario())


def test_an_agent_returning_release_with_a_delay() -> None:
    seen: list[tuple[int, int]] = []

    async def handler(record: ShareRecord) -> object:
        seen.append((record.offset, record.delivery_count))
        return queueflow.release(delay=30) if record.delivery_count == 1 else queueflow.ACCEPT

    async def scenario() -> None:
        clock = FakeClock()
        async with cluster_with(1, clock=clock) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g")
            engine = cluster.share_partition

            def delayed() -> bool:
                sp = engine("g", TOPIC, 0)
                return sp is not None and sp.record(0).member_id == DELAYED_OWNER

            await eventually(delayed, "record 0 delayed")
            assert seen == [(0, 1)]
            clock.advance(30_000)
            await eventually(lambda: engine("g", TOPIC, 0).start_offset == 1, "accepted")
            assert seen == [(0, 1), (0, 2)]
            assert engine("g", TOPIC, 0).record(0).state is RecordState.ARCHIVED  # below SPSO
            await agent.stop()
            await settle(cluster)

    run(scenario())


def test_a_poison_record_in_a_batch_fails_alone() -> None:
    """A batch handler raising for one record: its batch's records are handled again one by
    one on the same delivery, so the neighbours are ACCEPTed once and only the poison record
    goes on to the delivery count limit (docs/concepts.md "Throttled delivery")."""
    seen: list[tuple[int, int, int]] = []

    async def handler(records: list[ShareRecord]) -> object:
        seen.extend((r.offset, r.delivery_count, len(records)) for r in records)
        if any(r.offset == 2 for r in records):
            raise RuntimeError("poison")
        return None

    async def scenario() -> None:
        clock = FakeClock()
        async with cluster_with(6, clock=clock) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", batch=True, concurrency=4)
            await until(lambda: spso(cluster) == 6, "every record done", clock)
            await agent.stop()
            await settle(cluster)

    def spso(cluster: object) -> int:
        sp = cluster.share_partition("g", TOPIC, 0)  # type: ignore[attr-defined]
        return -1 if sp is None else int(sp.start_offset)

    run(scenario())
    first_batch = [s for s in seen if s[2] > 1]
    assert first_batch and any(o == 2 for o, _, _ in first_batch)  # it shared a batch
    assert {c for o, c, _ in seen if o != 2} == {1}  # neighbours: one delivery each
    assert {c for o, c, _ in seen if o == 2} == {1, 2, 3, 4, 5}  # poison: to the limit
