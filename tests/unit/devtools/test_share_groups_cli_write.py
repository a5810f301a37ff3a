"""``queueflow share-groups`` write actions (issue #14): ``--reset-offsets``,
``--delete-offsets`` and ``--delete``. Flag combinations are checked through click (they are
refused before anything connects); the actions' output runs against an ``InProcessCluster``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from inprocess_helpers import TOPIC, cluster_with, run, settle

from queueflow.admin import OffsetSpec
from queueflow.devtools.cli import browse as browsing
from queueflow.devtools.cli import cli
from queueflow.devtools.cli import share_groups as command
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.testing.inprocess import InProcessCluster

BASE = ["share-groups", "--bootstrap-server", "x:1", "--app", "app"]
RESET = ["--reset-offsets", "--group", "g"]


@pytest.fixture
def no_admin(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("the command connected although its flags are refused")

    monkeypatch.setattr(command, "make_admin", refuse)
    monkeypatch.setattr(browsing, "make_browse_source", refuse)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "exactly one action"),
        (["--list", "--delete", "--group", "g"], "exactly one action"),
        ([*RESET, "--to-earliest", "--dry-run"], "either --topic or --all-topics"),
        (
            [*RESET, "--topic", "t", "--all-topics", "--to-earliest", "--dry-run"],
            "either --topic or --all-topics",
        ),
        ([*RESET, "--all-topics", "--dry-run"], "exactly one of --to-earliest"),
        (
            [*RESET, "--all-topics", "--to-earliest", "--to-latest", "--dry-run"],
            "exactly one of --to-earliest",
        ),
        ([*RESET, "--all-topics", "--to-earliest"], "either --dry-run or --execute"),
        (
            [*RESET, "--all-topics", "--to-earliest", "--dry-run", "--execute"],
            "either --dry-run or --execute",
        ),
        (["--reset-offsets", "--all-topics", "--to-earliest", "--dry-run"], "exactly one --group"),
        (
            [*RESET, "--group", "h", "--all-topics", "--to-latest", "--execute"],
            "exactly one --group",
        ),
        ([*RESET, "--topic", "t:x", "--to-earliest", "--dry-run"], "partitions must be numbers"),
        (
            [*RESET, "--all-topics", "--to-datetime", "yesterday", "--dry-run"],
            "cannot parse datetime 'yesterday'",
        ),
        (
            [*RESET, "--all-topics", "--by-duration", "1h", "--dry-run"],
            "cannot parse duration '1h'",
        ),
        ([*RESET, "--all-topics", "--by-duration", "-PT1H", "--dry-run"], "negative"),
        ([*RESET, "--all-topics", "--to-offset", "-1", "--dry-run"], "must be >= 0"),
        (["--delete-offsets", "--group", "g"], "needs --topic"),
        (["--delete-offsets", "--topic", "t"], "exactly one --group"),
        (["--delete"], "--delete needs --group G"),
        (["--delete", "--group", "g", "--all-groups"], "--delete needs --group G"),
        (["--describe", "--group", "g", "--to-earliest"], "--to-earliest may be used with"),
        (["--delete", "--group", "g", "--execute"], "--execute may be used with"),
        (["--list", "--topic", "t"], "--topic may be used with"),
        (["--delete", "--group", "g", "--members"], "--members may be used with --describe"),
    ],
)
def test_refused_flag_combinations_exit_1_like_kafka(
    no_admin: None, flags: list[str], message: str
) -> None:
    result = CliRunner().invoke(cli, [*BASE, *flags])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and message in result.output, result.output


async def finished_group(cluster: InProcessCluster, group: str = "g") -> None:
    consumer = cluster.consumer(group)
    await consumer.subscribe([TOPIC])
    while await consumer.poll(timeout_ms=0):
        pass
    await consumer.commit_sync()
    await consumer.close()
    await settle(cluster)


def test_reset_dry_run_prints_the_plan_and_execute_applies_it() -> None:
    async def scenario() -> None:
        async with cluster_with(10, partitions=2) as cluster:
            await finished_group(cluster)
            admin = cluster.admin()
            plan = await command._reset(
                admin, "g", [f"{TOPIC}:1"], OffsetSpec.exact(2), False, False
            )
            assert [line.split() for line in plan.splitlines()] == [
                ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                ["g", TOPIC, "1", "2"],
            ]
            assert cluster.share_partition("g", TOPIC, 1).start_offset == 5  # dry run
            done = await command._reset(admin, "g", [], OffsetSpec.earliest(), True, True)
            assert json.loads(done) == [
                {"group": "g", "topic": TOPIC, "partition": 0, "new_offset": 0},
                {"group": "g", "topic": TOPIC, "partition": 1, "new_offset": 0},
            ]
            assert cluster.share_partition("g", TOPIC, 0).start_offset == 0
            assert cluster.share_partition("g", TOPIC, 1).start_offset == 0
            offsets = await admin.list_offsets("g")  # the read side sees it in the tables
            assert [(o.partition, o.start_offset, o.lag) for o in offsets] == [(0, 0, 5), (1, 0, 5)]
            with pytest.raises(ShareGroupError) as info:
                await command._reset(admin, "g", ["other"], OffsetSpec.latest(), False, False)
            assert info.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            with pytest.raises(ShareGroupError) as info:
                await command._reset(admin, "g", [f"{TOPIC}:2"], OffsetSpec.latest(), False, False)
            assert "has no partition 2" in info.value.message

    run(scenario())


def test_reset_of_a_group_with_members_is_refused_in_kafka_s_words() -> None:
    async def scenario() -> None:
        async with cluster_with(2) as cluster:
            member = cluster.consumer("g")
            await member.subscribe([TOPIC])
            await settle(cluster)
            with pytest.raises(ShareGroupError) as info:
                await command._reset(cluster.admin(), "g", [], OffsetSpec.earliest(), False, False)
            message = info.value.message
            assert message.startswith("Share group 'g' is not empty.\nIt has 1 member(s): ")
            assert f"{member.member_id} (client-id " in message and "s ago)" in message
            assert "a member is expired share.session.timeout.ms" in message
            await member.close()

    run(scenario())


def test_delete_offsets_and_delete_print_kafka_s_messages() -> None:
    async def scenario() -> None:
        async with cluster_with(4) as cluster:
            await finished_group(cluster, "g")
            await finished_group(cluster, "h")
            admin = cluster.admin()
            text, ok = await command._delete_offsets(admin, "g", [TOPIC], False)
            assert ok and [line.split() for line in text.splitlines()] == [
                ["TOPIC", "STATUS"],
                [TOPIC, "Successful"],
            ]
            text, ok = await command._delete(admin, ["g"], False)
            assert ok and text == "Deletion of requested share groups ('g') was successful."
            text, ok = await command._delete(admin, ["nope", "h"], False)
            assert not ok
            lines = text.splitlines()
            assert lines[0] == "Error: Deletion of some share groups failed:"  # Kafka 4.3.1
            assert lines[1].startswith("* Group 'nope' could not be deleted due to: ")
            assert "GROUP_ID_NOT_FOUND" in lines[1]
            assert lines[-1] == "These share groups were deleted successfully: 'h'"
            assert [g.group_id for g in await admin.list_groups()] == []
            text, ok = await command._delete(admin, ["nope"], True)
            assert json.loads(text)["nope"]["error"] == "GROUP_ID_NOT_FOUND" and not ok

    run(scenario())


def test_delete_all_groups_deletes_every_empty_group() -> None:
    async def scenario() -> None:
        async with cluster_with(2) as cluster:
            await finished_group(cluster, "g")
            await finished_group(cluster, "h")
            admin = cluster.admin()
            text, ok = await command._delete(admin, None, False)
            assert ok and text == "Deletion of requested share groups ('g', 'h') was successful."
            assert await admin.list_groups() == []

    run(scenario())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--browse", "--group", "g"], "--browse takes exactly one --group and one --topic"),
        (["--browse", "--topic", "t"], "--browse takes exactly one --group and one --topic"),
        (
            ["--browse", "--group", "g", "--group", "h", "--topic", "t"],
            "exactly one --group and one --topic",
        ),
        (
            ["--describe", "--group", "g", "--partition", "0"],
            "--partition may be used with --browse",
        ),
        (["--list", "--max-records", "3"], "--max-records may be used with --browse only"),
        (["--browse", "--list", "--group", "g", "--topic", "t"], "exactly one action"),
    ],
)
def test_refused_browse_flags_exit_1(no_admin: None, flags: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, [*BASE, *flags])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and message in result.output, result.output


def test_browse_prints_offset_state_delivery_count_lock_key_and_a_value_preview() -> None:
    async def scenario() -> None:
        async with InProcessCluster({TOPIC: 1}) as cluster:
            cluster.produce(TOPIC, b"first", key=b"k0")
            cluster.produce(TOPIC, b"x" * 100 + b"\n\x00")
            holder = cluster.consumer("g", acknowledgement_mode="explicit", max_poll_records=1)
            await holder.subscribe([TOPIC])
            (held,) = await holder.poll(timeout_ms=2000)
            source = cluster.member_context.io.browse_source()
            rows, text = await browsing.browse_output(
                source, "inprocess", "g", TOPIC, None, None, 10, False
            )
            assert text == "" and rows is not None
            assert rows[0] == [
                "PARTITION",
                "OFFSET",
                "STATE",
                "DELIVERY-COUNT",
                "LOCK-OWNER",
                "LOCK-DEADLINE",
                "KEY",
                "VALUE",
            ]
            first, second = rows[1:]
            assert first[:5] == [0, 0, "ACQUIRED", 1, holder.member_id]
            assert first[5].endswith("Z") and first[6:] == ["k0", "first"]
            assert second == [0, 1, "AVAILABLE", 0, None, None, "-", "x" * 59 + "…"]
            _, out = await browsing.browse_output(source, "inprocess", "g", TOPIC, 0, 1, 1, True)
            (record,) = json.loads(out)
            assert record["value"] == "x" * 100 + "\n\x00" and record["state"] == "AVAILABLE"
            _, empty = await browsing.browse_output(source, "inprocess", "g", TOPIC, 0, 5, 1, False)
            assert empty == f"Share group 'g' has no records of {TOPIC}[0] from offset 5 to browse."
            assert held.offset == 0
            await holder.close()


def test_a_group_with_members_is_refused_in_kafka_4_3_s_words() -> None:
    """What kafka-share-groups.sh 4.3.1 prints for a group with members (docs/operations.md,
    "Inspecting share groups"): --delete's GroupNotEmptyException line, --delete-offsets'
    "Error: The group is not empty." table; and a topic the group lacks gets Kafka's status
    while the others are deleted."""

    async def scenario() -> None:
        async with cluster_with(2) as cluster:
            member = cluster.consumer("g")
            await member.subscribe([TOPIC])
            await settle(cluster)
            admin = cluster.admin()
            text, ok = await command._delete(admin, ["g"], False)
            assert not ok and text.splitlines() == [
                "Error: Deletion of some share groups failed:",
                "* Group 'g' could not be deleted due to: "
                "org.apache.kafka.common.errors.GroupNotEmptyException: Share group 'g' is not "
                "EMPTY.",
            ]
            text, ok = await command._delete_offsets(admin, "g", [TOPIC], False)
            assert not ok
            assert [line.split() for line in text.splitlines()] == [
                ["Error:", "The", "group", "is", "not", "empty."],
                [],
                ["TOPIC", "STATUS"],
                [TOPIC, "Error:", "The", "group", "is", "not", "empty."],
            ]
            await member.close()
            await settle(cluster)
            text, ok = await command._delete_offsets(admin, "g", [TOPIC, "nosuch"], False)
            assert not ok
            assert [" ".join(line.split()) for line in text.splitlines()] == [
                "TOPIC STATUS",
                f"{TOPIC} Successful",
                "nosuch Error: This server does not host this topic-partition.",
            ]
            (described,) = await admin.describe_groups(["g"])
            assert described.partitions == {}
            # after --delete-offsets, and an empty group's --state (--verbose: Kafka's order)
            text = await command._run(admin, "describe", ["g"], "offsets", None, False, False)
            assert text == "Share group 'g' has no offset information."
            notes: list[str] = []
            text = await command._run(admin, "describe", ["g"], "state", None, True, False, notes)
            assert text.splitlines()[0].split("  ")[:6] == [
                "GROUP",
                "COORDINATOR (ID)",
                "STATE",
                "GROUP-EPOCH",
                "ASSIGNMENT-EPOCH",
                "#MEMBERS",
            ]
            assert text.splitlines()[1].split()[2:] == ["Empty", "2", "2", "0", "simple"]
            assert notes == ["\nShare group 'g' has no active members."]  # for stderr

    run(scenario())
