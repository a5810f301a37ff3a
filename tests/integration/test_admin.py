"""The admin API (:mod:`queueflow.admin`) and ``queueflow share-groups`` on the real broker: a
leader worker, members in this process, and the groups, members and offsets read back from the
app's changelogs (issue #14 items 1-2, read side)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_env import LEADER_SETTINGS, WAIT_S, member
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from click.testing import CliRunner

from queueflow import ACCEPT, REJECT, RELEASE, ShareRecord
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic, kafka_tool_argv
from queueflow.devtools.cli import cli
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.protocol import topics
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 2-partition topic led by one leader worker; group ``g`` finished 12 records, then 4
    more were produced and a member holds what it got of them."""
    topic = f"qf-admin-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 2)
    app_id = f"qf-admin-{uuid.uuid4().hex[:8]}"
    worker = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path_factory.mktemp("admin") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield {"topic": topic, "app_id": app_id, "worker": worker}


def outcome(r: ShareRecord) -> Any:
    """Partition 0: offset 3 REJECTed; partition 1: offset 0 RELEASEd once; else ACCEPT."""
    if (r.partition, r.offset) == (0, 3):
        return REJECT
    if (r.partition, r.offset, r.delivery_count) == (1, 0, 1):
        return RELEASE
    return ACCEPT


def test_groups_members_and_offsets(kafka_bootstrap: str, app: dict[str, Any]) -> None:
    topic, app_id = app["topic"], app["app_id"]
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

    async def scenario() -> None:
        await produce_records(kafka_bootstrap, topic, [f"r{i}" for i in range(12)], partitions=2)
        finisher = member(kafka_bootstrap, app_id, "g")
        await finisher.subscribe([topic])
        done: set[tuple[int, int]] = set()
        deadline = time.monotonic() + WAIT_S
        while len(done) < 12:
            assert time.monotonic() < deadline, f"only {sorted(done)} finished"
            for r in await finisher.poll(timeout_ms=500):
                finisher.acknowledge(r, outcome(r))
                if outcome(r) is not RELEASE:
                    done.add((r.partition, r.offset))
        assert all(e is None for e in (await finisher.commit_sync()).values())
        await finisher.close()

        # Nobody in the group: Empty; every record finished, so no lag.
        assert [(g.group_id, g.state) for g in await admin.list_groups()] == [("g", "Empty")]
        offsets = await admin.list_offsets("g")
        assert [(o.partition, o.start_offset, o.lag, o.log_end_offset) for o in offsets] == [
            (0, 6, 0, 6),
            (1, 6, 0, 6),
        ]

        # Four more records; a member takes some and holds them (never acknowledges).
        await produce_records(kafka_bootstrap, topic, [f"s{i}" for i in range(4)], partitions=2)
        holder = member(kafka_bootstrap, app_id, "g")
        await holder.subscribe([topic])
        held: list[ShareRecord] = []
        deadline = time.monotonic() + WAIT_S
        while not held:
            assert time.monotonic() < deadline, "the holder got nothing"
            held = await holder.poll(timeout_ms=500)
        try:
            (listing,) = await admin.list_groups()
            assert (listing.group_id, listing.state) == ("g", "Stable")
            assert await admin.list_groups(["empty"]) == []
            (described,) = await admin.describe_groups(["g"])
            (m,) = described.members
            assert m.member_id == holder.member_id and m.client_id == "g-client"
            assert sorted(m.assignment) == [(topic, 0), (topic, 1)]
            assert described.partitions == {topic: 2} and described.group_epoch >= 2
            # The one worker of the app is the coordinator and leads both share-partitions
            # (named by its web URL, from the app's Faust consumer group).
            worker_url = described.coordinator
            assert worker_url is not None, described
            assert worker_url.startswith("http://")
            assert worker_url.endswith(f":{app['worker'].web_port}"), worker_url

            offsets = await admin.list_offsets("g")
            for o in offsets:
                # What poll returned is Acquired, and so is what the holder prefetched.
                mine = [r for r in held if r.partition == o.partition]
                assert o.log_end_offset == 8 and o.start_offset == 6 and o.end_offset is not None
                assert o.in_flight["ACQUIRED"] == o.end_offset - 6 >= len(mine), (o, mine)
                assert o.in_flight["AVAILABLE"] == 0
                assert o.in_flight["ACKNOWLEDGED"] == o.in_flight["ARCHIVED"] == 0
                assert o.lag == 2  # KIP-1226: 8 - 6 - 0 delivered to completion
                assert o.leader == worker_url
        finally:
            await holder.close()

        with pytest.raises(ShareGroupError) as info:
            await admin.describe_groups(["nope"])
        assert info.value.code is ErrorCode.GROUP_ID_NOT_FOUND and "known groups: g" in str(
            info.value
        )
        with pytest.raises(ConfigurationError, match="no share groups found for app 'qf-typo'"):
            await ShareGroupAdmin("qf-typo", KafkaClientConfig(kafka_bootstrap)).list_groups()

    asyncio.run(scenario())


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["share-groups", *args], catch_exceptions=False)


def test_cli_describes_like_kafka_share_groups(kafka_bootstrap: str, app: dict[str, Any]) -> None:
    """Runs after test_groups_members_and_offsets (module order): group ``g`` exists."""
    base = ["--bootstrap-server", kafka_bootstrap, "--app", app["app_id"]]
    listed = run_cli(*base, "--list")
    assert listed.exit_code == 0 and listed.output.split() == ["g"]
    states = run_cli(*base, "--list", "--state")
    assert states.output.split() == ["GROUP", "STATE", "g", "Empty"]

    described = run_cli(*base, "--describe", "--group", "g")
    lines = [line.split() for line in described.output.splitlines()]
    assert described.exit_code == 0, described.output
    assert lines[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
    assert lines[1:] == [["g", app["topic"], "0", "6", "2"], ["g", app["topic"], "1", "6", "2"]]

    state = run_cli(*base, "--describe", "--group", "g", "--state")
    group, coordinator, *rest = [line.split() for line in state.output.splitlines()][1]
    assert (group, rest) == ("g", ["Empty", "0"])
    assert coordinator == f"http://{socket.gethostname()}:{app['worker'].web_port}", state.output
    members = run_cli(*base, "--describe", "--all-groups", "--members")
    assert members.output.strip() == "Share group 'g' has no active members."

    as_json = json.loads(run_cli(*base, "--describe", "--group", "g", "--output", "json").output)
    assert [o["start_offset"] for o in as_json[0]["offsets"]] == [6, 6]

    unknown = run_cli(*base, "--describe", "--group", "nope")
    assert unknown.exit_code == 1 and "share group 'nope' does not exist" in unknown.output
    for bad in (
        ["--describe"],
        ["--list", "--members"],
        ["--describe", "--all-groups", "--members", "--state"],
        ["--list", "--describe"],
    ):
        refused = run_cli(*base, *bad)
        assert refused.exit_code == 1 and refused.output.startswith("Error: "), (bad, refused)


@pytest.mark.native_share_groups
def test_cli_matches_kafka_share_groups_on_a_native_group(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The same 10 records through a native share group (Kafka's console share consumer,
    6 records) and through a queueflow group (as many records ACCEPTed as the native group
    finished): ``kafka-share-groups.sh --describe`` and ``queueflow share-groups --describe``
    print the same columns, start offset and KIP-1226 lag."""
    from queueflow.devtools.broker import run_kafka_tool

    topic = f"qf-admin-native-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    asyncio.run(produce_records(kafka_bootstrap, topic, [f"n{i}" for i in range(10)]))
    native = f"native-{uuid.uuid4().hex[:6]}"
    run_kafka_tool(
        "configs",
        [
            "--bootstrap-server",
            kafka_bootstrap,
            "--entity-type",
            "groups",
            "--entity-name",
            native,
            "--alter",
            "--add-config",
            "share.auto.offset.reset=earliest",
        ],
        timeout_s=90,
        check=True,
    )
    run_kafka_tool(
        "console-share-consumer",
        [
            "--bootstrap-server",
            kafka_bootstrap,
            "--topic",
            topic,
            "--group",
            native,
            "--max-messages",
            "6",
            "--timeout-ms",
            "30000",
        ],
        timeout_s=120,
        check=True,
    )
    kafka = run_kafka_tool(
        "share-groups",
        ["--bootstrap-server", kafka_bootstrap, "--describe", "--group", native],
        timeout_s=90,
        check=True,
    )
    kafka_lines = [line.split() for line in kafka.stdout.splitlines() if line.strip()]
    header, row = kafka_lines[0], dict(zip(kafka_lines[0], kafka_lines[1], strict=True))
    done = int(row["START-OFFSET"])

    app_id = f"qf-admin-cmp-{uuid.uuid4().hex[:8]}"

    async def finish(count: int) -> None:
        c = member(kafka_bootstrap, app_id, "cmp")
        await c.subscribe([topic])
        taken = 0
        deadline = time.monotonic() + WAIT_S
        while taken < count:
            assert time.monotonic() < deadline, f"{taken} of {count} records"
            for r in await c.poll(timeout_ms=500):
                # the first `count` records are ACCEPTed, the rest released (as the console
                # share consumer releases what it fetched beyond --max-messages)
                c.acknowledge(r, ACCEPT if r.offset < count else RELEASE)
                taken += r.offset < count
        assert all(e is None for e in (await c.commit_sync()).values())
        await c.close()

    with LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "data", LEADER_SETTINGS):
        asyncio.run(finish(done))
        ours = run_cli(
            "--bootstrap-server", kafka_bootstrap, "--app", app_id, "--describe", "--group", "cmp"
        )
        # --members: one live member in each group (the console share consumer stays in its
        # group until --timeout-ms passes with no record).
        native_member = subprocess.Popen(
            kafka_tool_argv(
                "console-share-consumer",
                [
                    "--bootstrap-server",
                    kafka_bootstrap,
                    "--topic",
                    topic,
                    "--group",
                    native,
                    "--timeout-ms",
                    "120000",
                ],
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            kafka_members, our_members = asyncio.run(
                members_of_both(kafka_bootstrap, app_id, topic, native)
            )
        finally:
            native_member.kill()
            native_member.wait(timeout=30)
    print(f"kafka-share-groups.sh:\n{kafka.stdout}\nqueueflow share-groups:\n{ours.output}")
    our_lines = [line.split() for line in ours.output.splitlines() if line.strip()]
    assert ours.exit_code == 0, ours.output
    assert our_lines[0] == header[: len(our_lines[0])], (our_lines, kafka.stdout)
    mine = dict(zip(our_lines[0], our_lines[1], strict=True))
    for column in ("TOPIC", "PARTITION", "START-OFFSET", "LAG"):
        assert mine[column] == row[column], (column, ours.output, kafka.stdout)

    print(f"kafka-share-groups.sh --members:\n{kafka_members}\n")
    print(f"queueflow share-groups --members:\n{our_members}")
    k_lines = [line.split() for line in kafka_members.splitlines() if line.strip()]
    o_lines = [line.split() for line in our_members.splitlines() if line.strip()]
    assert o_lines[0] == k_lines[0], (our_members, kafka_members)
    assert len(k_lines) == len(o_lines) == 2, (our_members, kafka_members)
    k_row, o_row = dict(zip(*k_lines, strict=True)), dict(zip(*o_lines, strict=True))
    for column in ("#PARTITIONS", "ASSIGNMENT"):
        assert o_row[column] == k_row[column], (column, our_members, kafka_members)


async def members_of_both(bootstrap: str, app_id: str, topic: str, native: str) -> tuple[str, str]:
    """``--describe --members`` of the native group (once Kafka's tool shows its console share
    consumer) and of queueflow's group ``cmp`` while a member is in it."""
    from queueflow.devtools.broker import run_kafka_tool

    c = member(bootstrap, app_id, "cmp")
    await c.subscribe([topic])
    await c.poll(timeout_ms=500)  # joined, with its assignment
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            kafka = await asyncio.to_thread(
                run_kafka_tool,
                "share-groups",
                ["--bootstrap-server", bootstrap, "--describe", "--group", native, "--members"],
                90,
                check=True,
            )
            if len([line for line in kafka.stdout.splitlines() if line.strip()]) >= 2:
                break
            assert time.monotonic() < deadline, f"no native member within {WAIT_S} s"
            await asyncio.sleep(0.5)
        ours = await asyncio.to_thread(
            run_cli,
            "--bootstrap-server",
            bootstrap,
            "--app",
            app_id,
            "--describe",
            "--group",
            "cmp",
            "--members",
        )
        assert ours.exit_code == 0, ours.output
        return kafka.stdout, ours.output
    finally:
        await c.close()


def test_the_app_s_internal_topics_roll_and_expire_their_segments(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    """Changelogs and control topics get short segments (and the changelogs a short
    tombstone retention), or they grow for days under a steady load (the 30-minute soak of
    2026-11-24 found the changelog growing 58 % per 10 minutes)."""
    topic, app_id = app["topic"], app["app_id"]
    expected = {
        f"{app_id}-{topics.state_table(topic)}-changelog": topics.STATE_CHANGELOG_CONFIG,
        f"{app_id}-{topics.GROUPS_TABLE}-changelog": topics.STATE_CHANGELOG_CONFIG,
        topics.request_topic(app_id, topic): topics.CONTROL_TOPIC_CONFIG,
        topics.coordinator_topic(app_id): topics.CONTROL_TOPIC_CONFIG,
        topics.reply_topic(app_id): topics.CONTROL_TOPIC_CONFIG,
    }

    async def describe() -> dict[str, dict[str, str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name) for name in expected]
            )
        finally:
            await admin.close()
        found: dict[str, dict[str, str]] = {}
        for response in responses:
            for _code, _message, _type, name, entries in response.resources:
                found[name] = {entry[0]: entry[1] for entry in entries}
        return found

    found = asyncio.run(describe())
    for name, config in expected.items():
        assert {key: found[name].get(key) for key in config} == config, name
    changelog = found[f"{app_id}-{topics.state_table(topic)}-changelog"]
    assert changelog["cleanup.policy"] == "compact"
