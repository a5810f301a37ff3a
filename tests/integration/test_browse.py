"""Browsing on the real broker (docs/guide.md "Browsing"): ``ShareConsumer.browse`` and
``queueflow share-groups --browse`` show a share-partition's records with their share states
(read from the state its leader persisted), delivery counts and locks, and acquire nothing: the
in-flight state and delivery counts are the same after a browse, and the records are delivered
afterwards as if no browse had happened. A browse of an unknown group says what to do."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from admin_env import MEMBER_SETTINGS, WAIT_S
from click.testing import CliRunner

import queueflow
from queueflow import BrowsedRecord, ShareConsumer
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.devtools.cli import cli
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 60_000,  # the held record stays Acquired
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
}


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 1-partition topic with 6 records, led by one leader worker."""
    topic = f"qf-browse-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    values = [f"r{i}" for i in range(6)]
    asyncio.run(produce_records(kafka_bootstrap, topic, values, keys=[f"k{i}" for i in range(6)]))
    app_id = f"qf-browse-{uuid.uuid4().hex[:8]}"
    worker = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path_factory.mktemp("browse") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield {"topic": topic, "app_id": app_id}


def member(bootstrap: str, app_id: str, mode: str = "explicit", **kwargs: Any) -> ShareConsumer:
    return ShareConsumer(
        "browsed",
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode=mode,
        settings=MEMBER_SETTINGS,
        **kwargs,
    )


def states(records: list[BrowsedRecord]) -> list[tuple[int, str | None, int]]:
    return [(r.offset, r.state, r.delivery_count) for r in records]


def test_browse_shows_states_and_acquires_nothing(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id = app["topic"], app["app_id"]
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

    async def scenario() -> None:
        holder = member(kafka_bootstrap, app_id, max_poll_records=3)
        browser = member(kafka_bootstrap, app_id)
        await holder.subscribe([topic])
        held: list[queueflow.ShareRecord] = []
        deadline = time.monotonic() + WAIT_S
        while not held:
            assert time.monotonic() < deadline, "nothing delivered"
            held = await holder.poll(timeout_ms=500)
        assert [r.offset for r in held] == [0, 1, 2]
        holder.acknowledge(held[1], queueflow.ACCEPT)
        holder.acknowledge(held[2], queueflow.REJECT)
        await holder.commit_sync()
        expected = [(0, "ACQUIRED", 1), (1, "ACKNOWLEDGED", 1), (2, "ARCHIVED", 1)]
        expected += [(o, "AVAILABLE", 0) for o in (3, 4, 5)]
        seen: list[BrowsedRecord] = []
        while states(seen) != expected:  # the leader's changelog write may lag a little
            assert time.monotonic() < deadline, states(seen)
            seen = await browser.browse(topic)
        assert [(r.key, r.value) for r in seen] == [(b"k%d" % i, b"r%d" % i) for i in range(6)]
        assert seen[0].member_id == holder.member_id
        assert seen[0].lock_deadline_ms is not None
        assert seen[0].lock_deadline_ms > time.time() * 1000 + 30_000  # the 60 s lock
        (before,) = await admin.list_offsets("browsed", records_limit=10)
        assert states(await browser.browse(topic, 0, from_offset=4, max_records=1)) == [
            (4, "AVAILABLE", 0)
        ]
        (after,) = await admin.list_offsets("browsed", records_limit=10)
        assert after.batches == before.batches and after.end_offset == 3  # nothing acquired

        cli_lines = await asyncio.to_thread(
            run_cli, kafka_bootstrap, app_id, "--group", "browsed", "--topic", topic
        )
        assert cli_lines[0].split() == [
            "PARTITION",
            "OFFSET",
            "STATE",
            "DELIVERY-COUNT",
            "LOCK-OWNER",
            "LOCK-DEADLINE",
            "KEY",
            "VALUE",
        ]
        rows = [line.split() for line in cli_lines[1:]]
        assert rows[0][:5] == ["0", "0", "ACQUIRED", "1", str(holder.member_id)]
        assert rows[0][6:] == ["k0", "r0"]
        assert rows[1] == ["0", "1", "ACKNOWLEDGED", "1", "-", "-", "k1", "r1"]
        assert [row[:4] for row in rows[2:]] == [
            ["0", "2", "ARCHIVED", "1"],
            *[["0", str(o), "AVAILABLE", "0"] for o in (3, 4, 5)],
        ]

        # Delivered as if no browse had happened: 3..5 for the first time.
        taker = member(kafka_bootstrap, app_id, mode="implicit")
        await taker.subscribe([topic])
        counts: dict[int, int] = {}
        while len(counts) < 3:
            assert time.monotonic() < deadline, counts
            counts.update({r.offset: r.delivery_count for r in await taker.poll(timeout_ms=500)})
        assert counts == {3: 1, 4: 1, 5: 1}
        await taker.close()
        await holder.close()
        await browser.close()

    asyncio.run(asyncio.wait_for(scenario(), 2 * WAIT_S))


def run_cli(bootstrap: str, app_id: str, *args: str) -> list[str]:
    result = CliRunner().invoke(
        cli,
        ["share-groups", "--bootstrap-server", bootstrap, "--app", app_id, "--browse", *args],
        catch_exceptions=False,
    )
    print(result.output)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_browse_of_an_unknown_group_or_topic_says_what_to_do(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id = app["topic"], app["app_id"]
    base = ["share-groups", "--bootstrap-server", kafka_bootstrap, "--app", app_id, "--browse"]
    for args, message in (
        (
            ["--group", "nobody", "--topic", topic],
            "share group 'nobody' does not exist in app",
        ),
        (
            ["--group", "browsed", "--topic", "no-such-topic"],
            "topic 'no-such-topic' does not exist",
        ),
    ):
        result = CliRunner().invoke(cli, [*base, *args])
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: ") and message in result.output, result.output
    unknown = CliRunner().invoke(cli, [*base, "--group", "nobody", "--topic", topic])
    assert "'queueflow share-groups --list' lists them" in unknown.output
