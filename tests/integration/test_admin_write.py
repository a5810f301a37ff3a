"""The admin API's write side and ``queueflow share-groups --reset-offsets / --delete-offsets /
--delete`` on the real broker: a leader worker, members in this process, the CLI driving the
worker's coordinator and leaders (issue #14 items 1-2, write side)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from admin_env import LEADER_SETTINGS, WAIT_S, member
from click.testing import CliRunner

from queueflow import ACCEPT, RELEASE, ShareConsumer, ShareRecord
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.devtools.cli import cli
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.structs import TopicPartition
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 2-partition topic with 10 records (5 per partition), led by one leader worker."""
    topic = f"qf-admin-w-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 2)
    asyncio.run(produce_records(kafka_bootstrap, topic, [f"r{i}" for i in range(10)], partitions=2))
    app_id = f"qf-admin-w-{uuid.uuid4().hex[:8]}"
    worker = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path_factory.mktemp("admin-w") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield {"topic": topic, "app_id": app_id}


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.2)


async def take(c: ShareConsumer, count: int, outcome: Any) -> list[ShareRecord]:
    """Poll until ``count`` records came, acknowledging each with ``outcome`` (None: hold)."""
    got: list[ShareRecord] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} records"
        for r in await c.poll(timeout_ms=500):
            got.append(r)
            if outcome is not None:
                c.acknowledge(r, outcome)
    if outcome is not None:
        assert all(e is None for e in (await c.commit_sync()).values())
    return got


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["share-groups", *args], catch_exceptions=False)


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip()]


def test_reset_with_the_cli_then_the_next_member_starts_at_the_new_spso(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id = app["topic"], app["app_id"]
    base = ["--bootstrap-server", kafka_bootstrap, "--app", app_id]
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

    async def empty() -> bool:
        return [(g.group_id, g.state) for g in await admin.list_groups()] == [("g", "Empty")]

    async def spsos() -> list[int | None]:
        return [o.start_offset for o in await admin.list_offsets("g")]

    async def finish_all() -> None:
        c = member(kafka_bootstrap, app_id, "g")
        await c.subscribe([topic])
        await take(c, 10, ACCEPT)
        await c.close()
        await eventually(empty, "group g Empty")
        await eventually(lambda: _equal(spsos(), [5, 5]), "SPSO 5 on both partitions")

    asyncio.run(finish_all())

    dry = run_cli(
        *base,
        "--reset-offsets",
        "--group",
        "g",
        "--topic",
        f"{topic}:0",
        "--to-offset",
        "2",
        "--dry-run",
    )
    print(f"$ queueflow share-groups --reset-offsets ... --dry-run\n{dry.output}")
    assert dry.exit_code == 0, dry.output
    assert rows(dry.output) == [
        ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
        ["g", topic, "0", "2"],
    ]
    by_duration = run_cli(
        *base,
        "--reset-offsets",
        "--group",
        "g",
        "--all-topics",
        "--by-duration",
        "PT1H",
        "--dry-run",
        "--output",
        "json",
    )
    assert [r["new_offset"] for r in json.loads(by_duration.output)] == [0, 0]
    later = run_cli(
        *base,
        "--reset-offsets",
        "--group",
        "g",
        "--all-topics",
        "--to-datetime",
        "2999-01-01T00:00:00.000",
        "--dry-run",
    )
    assert [r[3] for r in rows(later.output)[1:]] == ["5", "5"]  # no record after: log end
    assert asyncio.run(spsos()) == [5, 5]  # a dry run changes nothing

    done = run_cli(
        *base,
        "--reset-offsets",
        "--group",
        "g",
        "--topic",
        f"{topic}:0",
        "--to-offset",
        "2",
        "--execute",
    )
    print(f"$ queueflow share-groups --reset-offsets ... --execute\n{done.output}")
    assert done.exit_code == 0, done.output
    assert rows(done.output) == [
        ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
        ["g", topic, "0", "2"],
    ]
    described = run_cli(*base, "--describe", "--group", "g")
    print(f"$ queueflow share-groups --describe --group g\n{described.output}")

    async def next_member() -> None:
        await eventually(lambda: _equal(spsos(), [2, 5]), "SPSO 2 on partition 0")
        c = member(kafka_bootstrap, app_id, "g")
        await c.subscribe([topic])
        got = await take(c, 3, ACCEPT)
        assert sorted((r.partition, r.offset, r.delivery_count) for r in got) == [
            (0, 2, 1),
            (0, 3, 1),
            (0, 4, 1),
        ]
        assert await c.poll(timeout_ms=1000) == []  # partition 1 stayed at 5: nothing more
        await c.close()

    asyncio.run(next_member())


def test_a_group_with_members_is_refused_and_nothing_changes(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id = app["topic"], app["app_id"]
    base = ["--bootstrap-server", kafka_bootstrap, "--app", app_id]
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

    async def scenario() -> None:
        holder = member(kafka_bootstrap, app_id, "busy")
        await holder.subscribe([topic])
        held = await take(holder, 1, None)
        try:
            await eventually(
                lambda: _equal(_states(admin), {"busy": "Stable"}, subset=True), "busy Stable"
            )
            before = await admin.list_offsets("busy")
            refused = await asyncio.to_thread(
                run_cli,
                *base,
                "--reset-offsets",
                "--group",
                "busy",
                "--all-topics",
                "--to-latest",
                "--execute",
            )
            print(f"$ queueflow share-groups --reset-offsets --group busy ...\n{refused.output}")
            assert refused.exit_code == 1
            # Kafka's line, then who holds the group (on stderr)
            assert refused.output.startswith("Share group 'busy' is not empty.\nIt has ")
            assert len(refused.output.strip().splitlines()) == 2
            # the coordinator refuses too (the admin API has no pre-check)
            with pytest.raises(ShareGroupError) as info:
                await admin.alter_share_group_offsets("busy", {TopicPartition(topic, 0): 5})
            assert info.value.code is ErrorCode.NON_EMPTY_GROUP
            for action, words in (
                (["--delete-offsets", "--topic", topic], "Error: The group is not empty."),
                (["--delete"], "GroupNotEmptyException: Share group 'busy' is not EMPTY."),
            ):  # Kafka 4.3.1's words (tests/integration/test_parity.py)
                out = await asyncio.to_thread(run_cli, *base, *action, "--group", "busy")
                assert out.exit_code == 1 and words in out.output, out.output
            after = await admin.list_offsets("busy")
            assert [(o.start_offset, o.end_offset, dict(o.in_flight)) for o in after] == [
                (o.start_offset, o.end_offset, dict(o.in_flight)) for o in before
            ]
            # the holder still owns its records
            for r in held:
                holder.acknowledge(r, RELEASE)
            assert all(e is None for e in (await holder.commit_sync()).values())
        finally:
            await holder.close()

    asyncio.run(scenario())


def test_delete_offsets_and_delete_group(kafka_bootstrap: str, app: dict[str, Any]) -> None:
    """Runs after the tests above (module order): groups ``g`` and ``busy`` exist."""
    topic, app_id = app["topic"], app["app_id"]
    base = ["--bootstrap-server", kafka_bootstrap, "--app", app_id]
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))
    asyncio.run(
        eventually(
            lambda: _equal(_states(admin), {"g": "Empty", "busy": "Empty"}), "both groups Empty"
        )
    )

    deleted = run_cli(*base, "--delete-offsets", "--group", "g", "--topic", topic)
    print(f"$ queueflow share-groups --delete-offsets --group g --topic {topic}\n{deleted.output}")
    assert deleted.exit_code == 0, deleted.output
    assert rows(deleted.output) == [["TOPIC", "STATUS"], [topic, "Successful"]]

    gone = run_cli(*base, "--delete", "--group", "busy", "--group", "nope")
    print(f"$ queueflow share-groups --delete --group busy --group nope\n{gone.output}")
    assert gone.exit_code == 1
    assert "* Group 'nope' could not be deleted due to: GROUP_ID_NOT_FOUND" in gone.output
    assert "These share groups were deleted successfully: 'busy'" in gone.output
    ok = run_cli(*base, "--delete", "--group", "g")
    print(f"$ queueflow share-groups --delete --group g\n{ok.output}")
    assert ok.exit_code == 0 and ok.output.strip() == (
        "Deletion of requested share groups ('g') was successful."
    )
    asyncio.run(eventually(lambda: _equal(_states(admin), {}), "no groups left"))

    async def starts_afresh() -> None:  # share.auto.offset.reset=earliest: all 10 again
        c = member(kafka_bootstrap, app_id, "g")
        await c.subscribe([topic])
        got = await take(c, 10, ACCEPT)
        assert {r.delivery_count for r in got} == {1}
        await c.close()

    asyncio.run(starts_afresh())


async def _states(admin: ShareGroupAdmin) -> dict[str, str]:
    return {g.group_id: g.state for g in await admin.list_groups()}


async def _equal(value: Awaitable[Any], expected: Any, subset: bool = False) -> bool:
    got = await value
    if subset:
        return all(got.get(k) == v for k, v in expected.items())
    return bool(got == expected)


def test_a_wrong_app_id_fails_fast_and_creates_nothing(kafka_bootstrap: str) -> None:
    admin = ShareGroupAdmin("qf-typo-w", KafkaClientConfig(kafka_bootstrap), 10_000)
    with pytest.raises(ConfigurationError, match="no share-group coordinator for app 'qf-typo-w'"):
        asyncio.run(admin.delete_share_group_offsets("g", ["t"]))
    refused = run_cli(
        "--bootstrap-server", kafka_bootstrap, "--app", "qf-typo-w", "--delete", "--group", "g"
    )
    assert refused.exit_code == 1 and "no share-group coordinator" in refused.output
    assert asyncio.run(_no_topics(kafka_bootstrap, "qf-typo-w"))


async def _no_topics(bootstrap: str, prefix: str) -> bool:
    from queueflow.kafka.admin import admin_client

    admin = admin_client(KafkaClientConfig(bootstrap))
    await admin.start()
    try:
        return not [t for t in await admin.list_topics() if t.startswith(prefix)]
    finally:
        await admin.close()
