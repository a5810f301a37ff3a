"""``faust_app.ChangelogTable``: a store taken over is rebuilt from the changelog before a
share-partition is loaded from it, and a cut leader's late snapshot never replaces its
successor's (docs/architecture.md "Standby stores and late snapshots")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from structlog.testing import capture_logs

from queueflow import _compat
from queueflow.engine.state import ShareSnapshot
from queueflow.faust_app import raw_table
from queueflow.protocol import topics
from queueflow.protocol.state_codec import decode_snapshot, encode_snapshot, snapshot_key

BROKER = "kafka://localhost:1"  # nothing listens: these tests never start an app
KEY = snapshot_key("g", 2)


@pytest.fixture(autouse=True)
def loop(faust_loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
    """Every test here gets Faust's event loop (conftest ``faust_loop``)."""
    return faust_loop


@pytest.fixture
def table(tmp_path: Path) -> Any:
    app = faust.App("qf-unit-changelog", broker=BROKER, store="rocksdb://", datadir=tmp_path)
    return raw_table(app, topics.state_table("jobs"), partitions=4, snapshots=True)


def snapshot(state_epoch: int, snapshot_epoch: int, start: int) -> bytes:
    return encode_snapshot(
        ShareSnapshot(
            snapshot_epoch=snapshot_epoch,
            state_epoch=state_epoch,
            leader_epoch=1,
            start_offset=start,
            batches=(),
        )
    )


def record(table: Any, partition: int, offset: int, key: bytes, value: bytes | None) -> Any:
    """A changelog event as Faust's recovery hands it to ``apply_changelog_batch``."""
    topic = table.changelog_topic.get_topic_name()
    message = SimpleNamespace(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        tp=KafkaTopicPartition(topic, partition),
    )
    return SimpleNamespace(message=message)


def held(table: Any, partition: int = 2) -> tuple[int, int, int] | None:
    raw = _compat.store_partition_get(table, partition, KEY)
    if raw is None:
        return None
    s = decode_snapshot(raw, where="test")
    return s.state_epoch, s.snapshot_epoch, s.start_offset


def test_a_late_snapshot_of_a_lower_state_epoch_does_not_replace_the_successors(
    table: Any,
) -> None:
    # The cut leader (state epoch 0) wrote a snapshot before its lease lapsed; the broker
    # acknowledged it after the successor's first snapshot (state epoch 1).
    table.apply_changelog_batch([record(table, 2, 40, KEY, snapshot(0, 3, 500))])
    with capture_logs() as logs:
        table.apply_changelog_batch(
            [
                record(table, 2, 47, KEY, snapshot(1, 4, 620)),  # the successor's
                record(table, 2, 48, KEY, snapshot(0, 4, 560)),  # the late one
            ]
        )
        assert held(table) == (1, 4, 620)
        table.apply_changelog_batch([record(table, 2, 82, KEY, snapshot(0, 5, 600))])
    assert held(table) == (1, 4, 620)
    ignored = [e for e in logs if e["event"] == "state_late_snapshot_ignored"]
    assert [(e["offset"], e["snapshot"], e["kept"]) for e in ignored] == [
        (48, (0, 4), (1, 4)),
        (82, (0, 5), (1, 4)),
    ]
    # Its next snapshot, and a deleted and re-created share-partition, apply as before.
    table.apply_changelog_batch([record(table, 2, 90, KEY, snapshot(1, 5, 700))])
    assert held(table) == (1, 5, 700)
    table.apply_changelog_batch(
        [record(table, 2, 91, KEY, None), record(table, 2, 92, KEY, snapshot(0, 0, 0))]
    )
    assert held(table) == (0, 0, 0)
    # Other keys and other partitions are untouched by the rule.
    table.apply_changelog_batch([record(table, 1, 3, b"D/g/1/0/0/000000", b"x")])
    assert _compat.store_partition_get(table, 1, b"D/g/1/0/0/000000") == b"x"


def test_a_standby_store_taken_over_is_rebuilt_from_the_changelogs_start(
    table: Any, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A standby applied records 0..1 and 5 of partition 2 but lost 2..4 (a dropped fetch):
    # its persisted offset says 5, so Faust's recovery would read nothing more.
    tp = KafkaTopicPartition(table.changelog_topic.get_topic_name(), 2)
    table.apply_changelog_batch(
        [
            record(table, 2, 0, KEY, snapshot(0, 0, 0)),
            record(table, 2, 1, b"D/g/2/0/0/000000", b"d0"),
            record(table, 2, 5, b"D/g/2/0/0/000004", b"d4"),
        ]
    )
    assert table.persisted_offset(tp) == 5
    active: set[int] = set()
    monkeypatch.setattr(_compat, "active_changelog_partitions", lambda t: set(active))

    async def rebalance(generation: int) -> None:
        await table.on_rebalance(set(), set(), set(), generation)

    loop.run_until_complete(rebalance(3))  # a standby of partition 2
    assert table.persisted_offset(tp) == 5
    active.add(2)
    with capture_logs() as logs:
        loop.run_until_complete(rebalance(4))  # the standby takes partition 2 over
    assert table.persisted_offset(tp) is None  # recovery reads from the changelog's start
    assert _compat.store_partition_get(table, 2, KEY) is None
    assert [(e["event"], e["partition"], e["keys_dropped"]) for e in logs] == [
        ("state_store_rebuilt", 2, 4)  # three records and the persisted offset
    ]
    # A flushed standby batch sets an offset before recovery starts: still from the start.
    table.apply_changelog_batch([record(table, 2, 9, b"D/g/2/0/0/000008", b"d8")])
    assert table.persisted_offset(tp) is None
    table.apply_changelog_batch([record(table, 2, 12, KEY, snapshot(1, 0, 9))])
    loop.run_until_complete(table.on_recovery_completed({tp}, set()))
    assert table.persisted_offset(tp) == 12
    # Owned in the next generation too: the store it wrote itself is kept.
    with capture_logs() as logs:
        loop.run_until_complete(rebalance(5))
    assert table.persisted_offset(tp) == 12
    assert logs == []
    # Back after a generation it missed: rebuilt again.
    with capture_logs() as logs:
        loop.run_until_complete(rebalance(7))
    assert table.persisted_offset(tp) is None
    assert [e["event"] for e in logs] == ["state_store_rebuilt"]
