"""Key-ordered sharing through the real coordinator, leaders and members, in process
(docs/concepts.md "Key-ordered sharing"): per-key order across members, parking by REJECT,
parked keys durable across a reload, and members refusing a group that is not key-ordered."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from inprocess_helpers import TOPIC, run, settings, settle

import queueflow
from queueflow.dashboard import DashboardData, page_html
from queueflow.engine.key_order import key_hash
from queueflow.errors import ConfigurationError, ShareGroupError
from queueflow.protocol.state_codec import decode_parked_keys, parked_keys_key
from queueflow.structs import TopicPartition
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

KEYED = {"g": {"share.ordering": "key"}}


def keyed_cluster(keys: list[str | None], clock: FakeClock | None = None) -> InProcessCluster:
    cluster = InProcessCluster(
        {TOPIC: 1}, clock=clock or FakeClock(), settings=settings(), group_configs=KEYED
    )
    for i, k in enumerate(keys):
        cluster.produce(TOPIC, f"{k}:{i}".encode(), key=None if k is None else k.encode())
    return cluster


def test_members_handle_each_key_in_offset_order_one_record_at_a_time() -> None:
    keys = [f"k{i % 7}" for i in range(120)] + [None, None]

    async def scenario() -> None:
        async with keyed_cluster(keys) as cluster:
            seen: dict[str | None, list[int]] = defaultdict(list)
            busy: set[str | None] = set()

            async def work(name: str) -> None:
                consumer = cluster.consumer("g", ordering="key", max_poll_records=5)
                await consumer.subscribe([TOPIC])
                try:
                    while len({o for v in seen.values() for o in v}) < len(keys):
                        for r in await consumer.poll(timeout_ms=50):
                            key = None if r.key is None else r.key.decode()
                            assert key not in busy, f"key {key} in flight at two members"
                            busy.add(key)
                            await asyncio.sleep(0)  # let the other members run meanwhile
                            seen[key].append(r.offset)
                            busy.discard(key)
                finally:
                    await consumer.close()

            await asyncio.gather(*(work(f"m{i}") for i in range(4)))
            for key, offsets in seen.items():  # redeliveries (at close) repeat the last one
                assert offsets == sorted(offsets), key
            assert sum(len(set(v)) for v in seen.values()) == len(keys)
            assert len(set(seen[None])) == 2

    run(scenario())


def test_a_reject_parks_the_key_durably_and_a_release_lets_it_go_on() -> None:
    async def scenario() -> None:
        async with keyed_cluster(["a", "b", "a", "b", "a"]) as cluster:
            consumer = cluster.consumer(
                "g", ordering="key", acknowledgement_mode="explicit", max_poll_records=10
            )
            await consumer.subscribe([TOPIC])
            got = await consumer.poll(timeout_ms=2000)
            assert [r.offset for r in got] == [0, 1]
            consumer.acknowledge(got[0], queueflow.REJECT)
            consumer.acknowledge(got[1], queueflow.ACCEPT)
            await consumer.commit_sync()
            later = await consumer.poll(timeout_ms=2000)
            assert [r.offset for r in later] == [3]  # b goes on, a is parked
            consumer.acknowledge(later[0], queueflow.ACCEPT)
            await consumer.commit_sync()
            await settle(cluster)
            stored = cluster.tables[TOPIC][parked_keys_key("g", 0)]
            (parked,) = decode_parked_keys(stored, where="test")
            assert (parked.key_hash, parked.offset, parked.reason, parked.key) == (
                key_hash(b"a"),
                0,
                "rejected",
                "a",
            )
            engine = cluster.leaders[TOPIC].partitions[("g", 0)].engine
            assert engine.key_order is not None
            assert engine.acquired_count == 0 and engine.record(2).state.name == "AVAILABLE"
            engine.key_order.release(key_hash(b"a"))
            cluster.leaders[TOPIC].long_polls.notify(0)  # as the admin's release does
            after = await consumer.poll(timeout_ms=2000)
            assert [r.offset for r in after] == [2]
            await consumer.close()

    run(scenario())


def test_a_member_asking_for_key_order_refuses_a_group_that_is_not() -> None:
    async def scenario() -> None:
        cluster = InProcessCluster({TOPIC: 1}, clock=FakeClock(), settings=settings())
        async with cluster:
            consumer = cluster.consumer("plain", ordering="key")
            with pytest.raises(ConfigurationError, match=r"not key-ordered.*share\.ordering=key"):
                await consumer.subscribe([TOPIC])
            await consumer.close()
        with pytest.raises(ConfigurationError, match="ordering='sorted'"):
            cluster.consumer("plain", ordering="sorted")

    run(scenario())


def test_the_admin_describes_releases_and_skips_parked_keys_and_refuses_bad_input() -> None:
    async def scenario() -> None:
        keys = ["a", "b", "a", "a", "b", "c", "a"]
        async with keyed_cluster(keys) as cluster:
            admin = cluster.admin()
            consumer = cluster.consumer(
                "g", ordering="key", acknowledgement_mode="explicit", max_poll_records=10
            )
            await consumer.subscribe([TOPIC])

            async def handle(reject: str = "") -> list[int]:
                got = await consumer.poll(timeout_ms=2000)
                for r in got:
                    bad = r.key == reject.encode()
                    consumer.acknowledge(r, queueflow.REJECT if bad else queueflow.ACCEPT)
                await consumer.commit_sync()
                await settle(cluster)
                return [r.offset for r in got]

            assert await handle(reject="a") == [0, 1, 5]  # a parks at 0
            assert await handle() == [4]  # b goes on; a's 2, 3, 6 wait
            (offsets,) = await admin.list_offsets("g")
            (parked,) = offsets.parked_keys
            assert (parked.key, parked.offset, parked.reason) == ("a", 0, "rejected")
            shown = await DashboardData(admin, records_limit=10, max_age_s=0.0).get()
            (sp,) = shown["groups"][0]["share_partitions"]
            assert sp["parked_keys"] == [
                {"key": "a", "key_hash": parked.key_hash, "offset": 0, "reason": "rejected"}
            ]
            assert "parked_keys" in page_html() and "--release-key" in page_html()
            with pytest.raises(ShareGroupError, match=r"key .zz. .* is not parked"):
                await admin.release_key("g", TOPIC, "zz")
            with pytest.raises(ShareGroupError, match="has no share-partitions of topic 'nope'"):
                await admin.release_key("g", "nope", "a")
            with pytest.raises(ShareGroupError, match="does not exist"):
                await admin.skip_key("nobody", TOPIC, "a")
            with pytest.raises(ShareGroupError, match="no partition 3"):
                await admin.skip_key("g", TOPIC, "a", partition=3)
            with pytest.raises(ShareGroupError, match="hash"):
                await admin.skip_key("g", TOPIC, "hash:xyz")
            assert await admin.release_key("g", TOPIC, "a") == {TopicPartition(TOPIC, 0): 0}
            assert await handle(reject="a") == [2]  # released: a's next record, parks again
            assert await admin.skip_key("g", TOPIC, "a", partition=0) == {
                TopicPartition(TOPIC, 0): 2  # offsets 3 and 6, all of a's that were read
            }
            cluster.produce(TOPIC, b"a:7", key=b"a")  # after the skip: delivered
            assert await handle() == [7]
            (offsets,) = await admin.list_offsets("g")
            assert offsets.parked_keys == () and offsets.start_offset == 8
            await consumer.close()

    run(scenario())
