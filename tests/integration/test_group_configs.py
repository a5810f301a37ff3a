"""Group configs and start positions on the real broker (issue #14 items 3 and 4):
``queueflow configs`` against a leader worker's coordinator, and a partition added to a source
topic while a group consumes it, delivered from offset 0 without a restart."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from admin_env import MEMBER_SETTINGS, WAIT_S
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from click.testing import CliRunner

from queueflow import ShareConsumer, ShareRecord
from queueflow.devtools.broker import create_topic
from queueflow.devtools.cli import cli
from queueflow.engine.group_config import GROUP_CONFIG_NAMES
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

#: The group starts at the log end: records added to partition 0 before it joins are skipped,
#: and only the "partitions added at runtime start at offset 0" rule delivers partition 1's.
LEADER_SETTINGS = {
    "share.auto.offset.reset": "latest",
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
}


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 1-partition topic with 3 records, led by one leader worker."""
    topic = f"qf-configs-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    asyncio.run(produce_records(kafka_bootstrap, topic, ["old0", "old1", "old2"], partition=0))
    app_id = f"qf-configs-{uuid.uuid4().hex[:8]}"
    worker = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path_factory.mktemp("configs") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield {"topic": topic, "app_id": app_id, "worker": worker}


def member(bootstrap: str, app_id: str, group: str) -> ShareConsumer:
    return ShareConsumer(
        group, app_id=app_id, bootstrap_servers=bootstrap, settings=MEMBER_SETTINGS
    )


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(cli, ["configs", *args], catch_exceptions=False)
    print(f"$ queueflow configs {' '.join(args)}\n{result.output}")
    return result


def test_configs_set_describe_and_refuse_bad_input(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id = app["topic"], app["app_id"]
    base = ["--bootstrap-server", kafka_bootstrap, "--app", app_id]

    async def join_and_leave() -> None:
        c = member(kafka_bootstrap, app_id, "workers")
        await c.subscribe([topic])
        await c.close()

    asyncio.run(join_and_leave())  # the group exists

    done = run_cli(
        *base,
        "--group",
        "workers",
        "--alter",
        "--add-config",
        "share.delivery.count.limit=3,share.record.lock.duration.ms=15000",
    )
    assert done.exit_code == 0 and done.output == "Completed updating config for group workers.\n"
    described = run_cli(*base, "--group", "workers", "--describe")
    assert described.exit_code == 0
    assert described.output.splitlines() == [
        "Dynamic configs for group workers are:",
        "  share.record.lock.duration.ms=15000 sensitive=false "
        "synonyms={DYNAMIC_GROUP_CONFIG:share.record.lock.duration.ms=15000}",
        "  share.delivery.count.limit=3 sensitive=false "
        "synonyms={DYNAMIC_GROUP_CONFIG:share.delivery.count.limit=3}",
    ]
    every = run_cli(
        *base, "--entity-type", "groups", "--entity-name", "workers", "--describe", "--all"
    )
    assert every.exit_code == 0
    assert len(every.output.splitlines()) == 1 + len(GROUP_CONFIG_NAMES)
    assert "  share.auto.offset.reset=latest sensitive=false synonyms={DEFAULT_CONFIG:" in (
        every.output
    )
    nobody = run_cli(*base, "--group", "nobody", "--describe")  # as kafka-configs.sh
    assert nobody.exit_code == 0
    assert nobody.output.strip() == (
        "The group 'nobody' doesn't exist and doesn't have dynamic config."
    )
    for args, message in (
        (
            ["--group", "workers", "--alter", "--add-config", "share.isolation.level=x"],
            "INVALID_CONFIG: share.isolation.level='x' is not allowed: choose one of "
            "read_uncommitted",
        ),
        (
            ["--group", "workers", "--alter", "--add-config", "share.delivery.count.limit=1"],
            "INVALID_CONFIG: share.delivery.count.limit=1 is out of range: allowed [2..10]",
        ),
    ):
        refused = run_cli(*base, *args)
        assert refused.exit_code == 1 and message in refused.output, refused.output
    again = run_cli(*base, "--group", "workers", "--describe")
    assert again.output == described.output  # nothing changed
    deleted = run_cli(
        *base, "--group", "workers", "--alter", "--delete-config", "share.delivery.count.limit"
    )
    assert deleted.exit_code == 0
    assert (
        "share.delivery.count.limit"
        not in run_cli(*base, "--group", "workers", "--describe").output
    )


def test_a_partition_added_at_runtime_is_delivered_from_offset_0(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id, worker = app["topic"], app["app_id"], app["worker"]

    async def scenario() -> None:
        c = member(kafka_bootstrap, app_id, "growing")
        await c.subscribe([topic])
        try:
            got: list[ShareRecord] = []
            deadline = time.monotonic() + WAIT_S
            while not got:  # latest: starts at the log end when its first fetch initialises it
                assert time.monotonic() < deadline, "no record of partition 0"
                await produce_records(kafka_bootstrap, topic, ["p0-new"], partition=0)
                got += await c.poll(timeout_ms=1000)
            assert {(r.partition, r.value) for r in got} == {(0, b"p0-new")}
            assert min(r.offset for r in got) > 2  # old0..old2 were skipped
            admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
            started = time.monotonic()
            await admin.start()
            try:
                await admin.create_partitions({topic: NewPartitions(2)})
            finally:
                await admin.close()
            # Produced before anyone consumes partition 1: delivered all the same.
            await produce_records(kafka_bootstrap, topic, ["p1-a", "p1-b"], partition=1)
            added: list[ShareRecord] = []
            deadline = time.monotonic() + 2 * WAIT_S
            while len(added) < 2:
                assert time.monotonic() < deadline, f"partition 1 not delivered: {added}"
                added += await c.poll(timeout_ms=500)
            print(f"partition 1 delivered {time.monotonic() - started:.1f} s after it was added")
            assert sorted((r.partition, r.offset, r.value) for r in added) == [
                (1, 0, b"p1-a"),
                (1, 1, b"p1-b"),
            ]
        finally:
            await c.close()

    asyncio.run(scenario())
    log = worker.log_path.read_text()
    assert "source_partitions_added" in log
    assert worker.process is not None and worker.process.poll() is None  # no restart
