"""A worker whose local store lacks changelog records its persisted offset counts as applied
(what Faust's standby replica left in a ``make partition-test`` run) rebuilds the store from
the changelog before it loads a share-partition: nothing acknowledged is delivered again
(docs/architecture.md "Standby stores and late snapshots")."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import rocksdict
from aiokafka import AIOKafkaConsumer, TopicPartition
from test_share_groups import LEADER_SETTINGS, consumer, poll_until, produce

from queueflow import ACCEPT
from queueflow.protocol import topics
from queueflow.testing import LeaderWorker

RECORDS = 20
OFFSET_KEY = b"__faust\x00offset__"  # where Faust's RocksDB store keeps its persisted offset


async def read_changelog(bootstrap: str, changelog: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every record of the changelog's partition 0: ``(offset, key, value)``."""
    tp = TopicPartition(changelog, 0)
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        reader.assign([tp])
        await reader.seek_to_beginning(tp)
        end = (await reader.end_offsets([tp]))[tp]
        records: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + 20
        while (await reader.position(tp)) < end:
            assert time.monotonic() < deadline, f"changelog not read to {end} within 20 s"
            for batch in (await reader.getmany(tp, timeout_ms=500)).values():
                records += [(r.offset, r.key, r.value) for r in batch]
        return records
    finally:
        await reader.stop()


def leave_store_behind(
    datadir: Path, table: str, records: list[tuple[int, bytes, bytes | None]]
) -> None:
    """Make the worker's store of partition 0 hold the share-partition state only up to its
    first delta, while its persisted offset says the whole changelog was applied."""
    (path,) = datadir.rglob(f"{table}-0.db")
    first_delta = min(o for o, k, _ in records if k.startswith(b"D/"))
    db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))
    try:
        for key in list(db.keys()):
            db.delete(key)
        for offset, key, value in records:
            stale = key.startswith((b"S/", b"D/")) and offset > first_delta
            if not stale:
                if value is None:
                    db.delete(key)
                else:
                    db[key] = value
        db[OFFSET_KEY] = str(records[-1][0]).encode()
    finally:
        db.close()


def test_a_store_missing_changelog_records_is_rebuilt_before_a_share_partition_loads(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    app_id = f"qf-behind-{uuid.uuid4().hex[:8]}"
    table = topics.state_table(topic)
    asyncio.run(produce(kafka_bootstrap, topic, RECORDS))

    async def accept_all() -> None:
        c = consumer(kafka_bootstrap, app_id, "behind")
        await c.subscribe([topic])
        await poll_until(c, lambda seen: len({r.offset for r in seen}) >= RECORDS)
        result = await c.commit_sync()
        assert all(error is None for error in result.values()), result
        await c.close()

    async def delivered_again() -> list[int]:
        c = consumer(kafka_bootstrap, app_id, "behind")
        await c.subscribe([topic])
        seen: list[int] = []
        deadline = time.monotonic() + 6  # the member joins and long-polls within this
        while time.monotonic() < deadline:
            for record in await c.poll(timeout_ms=500):
                seen.append(record.offset)
                c.acknowledge(record, ACCEPT)
        await c.close()
        return seen

    datadir = tmp_path / "worker"
    with LeaderWorker(app_id, [topic], kafka_bootstrap, datadir, LEADER_SETTINGS).start():
        asyncio.run(accept_all())
    changelog = f"{app_id}-{table}-changelog"
    records = asyncio.run(read_changelog(kafka_bootstrap, changelog))
    assert sum(1 for _, k, _ in records if k.startswith(b"D/")) >= 2, records
    leave_store_behind(datadir, table, records)
    with LeaderWorker(app_id, [topic], kafka_bootstrap, datadir, LEADER_SETTINGS).start():
        again = asyncio.run(delivered_again())
    assert again == [], f"acknowledged records delivered again: {sorted(again)}"
