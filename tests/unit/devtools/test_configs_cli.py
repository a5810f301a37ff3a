"""``queueflow configs`` (issue #14 item 3), like ``kafka-configs.sh --entity-type groups``:
flag combinations are refused through click before anything connects; the actions' output runs
against an ``InProcessCluster``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from inprocess_helpers import TOPIC, cluster_with, run, settle

from queueflow.devtools.cli import cli
from queueflow.devtools.cli import configs as command
from queueflow.engine.group_config import GROUP_CONFIG_NAMES
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.testing.inprocess import InProcessCluster

BASE = ["configs", "--bootstrap-server", "x:1", "--app", "app"]


@pytest.fixture
def no_admin(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("the command connected although its flags are refused")

    monkeypatch.setattr(command, "make_admin", refuse)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--group", "g"], "exactly one action"),
        (["--group", "g", "--describe", "--alter"], "exactly one action"),
        (["--describe"], "give the share group"),
        (["--group", "g", "--entity-name", "h", "--describe"], "name different groups"),
        (["--group", "g", "--alter"], "--alter needs --add-config"),
        (["--group", "g", "--describe", "--add-config", "a=1"], "with --alter only"),
        (["--group", "g", "--alter", "--all", "--add-config", "a=1"], "--all may be used"),
        (
            ["--group", "g", "--alter", "--add-config", "share.delivery.count.limit"],
            "expected name=value",
        ),
        (["--group", "g", "--alter", "--add-config", "a=1,a=2"], "sets 'a' twice"),
    ],
)
def test_refused_flag_combinations_exit_1(no_admin: None, flags: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, [*BASE, *flags])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and message in result.output, result.output


def test_entity_type_is_groups_only(no_admin: None) -> None:
    result = CliRunner().invoke(cli, [*BASE, "--entity-type", "topics", "--describe"])
    assert result.exit_code == 2 and "'topics' is not 'groups'" in result.output


def test_add_config_takes_kafka_s_comma_separated_pairs() -> None:
    assert command.parse_add_config(
        ("share.delivery.count.limit=3,share.auto.offset.reset=by_duration:PT1H", "b = 2")
    ) == {
        "share.delivery.count.limit": "3",
        "share.auto.offset.reset": "by_duration:PT1H",
        "b": "2",
    }


async def existing_group(cluster: InProcessCluster, group: str = "g") -> None:
    member = cluster.consumer(group)
    await member.subscribe([TOPIC])
    await member.close()
    await settle(cluster)


def test_alter_then_describe_prints_kafka_s_lines() -> None:
    async def scenario() -> None:
        async with cluster_with(1) as cluster:
            await existing_group(cluster)
            admin = cluster.admin()
            text = await command._describe(admin, "g", False, False)
            assert text == "Dynamic configs for group g are:"
            text = await command._alter(
                admin,
                "g",
                {"share.delivery.count.limit": "3", "share.auto.offset.reset": "earliest"},
                [],
                False,
            )
            assert text == "Completed updating config for group g."
            assert (await command._describe(admin, "g", False, False)).splitlines() == [
                "Dynamic configs for group g are:",
                "  share.auto.offset.reset=earliest sensitive=false "
                "synonyms={DYNAMIC_GROUP_CONFIG:share.auto.offset.reset=earliest}",
                "  share.delivery.count.limit=3 sensitive=false "
                "synonyms={DYNAMIC_GROUP_CONFIG:share.delivery.count.limit=3}",
            ]
            lines = (await command._describe(admin, "g", True, False)).splitlines()
            assert lines[0] == "All configs for group g are:"
            assert len(lines) == 1 + len(GROUP_CONFIG_NAMES)
            assert (
                "  share.record.lock.duration.ms=30000 sensitive=false "
                "synonyms={DEFAULT_CONFIG:group.share.record.lock.duration.ms=30000}"
            ) in lines
            await command._alter(admin, "g", {}, ["share.delivery.count.limit"], False)
            data = json.loads(await command._describe(admin, "g", False, True))
            assert data == {
                "group": "g",
                "configs": [
                    {
                        "name": "share.auto.offset.reset",
                        "value": "earliest",
                        "source": "DYNAMIC_GROUP_CONFIG",
                        "synonym": "share.auto.offset.reset",
                    }
                ],
            }

    run(scenario())


def test_errors_name_the_group_the_config_and_the_range() -> None:
    async def scenario() -> None:
        async with cluster_with(1) as cluster:
            await existing_group(cluster)
            admin = cluster.admin()
            with pytest.raises(ShareGroupError) as info:
                await command._describe(admin, "nope", False, False)
            assert info.value.code is ErrorCode.GROUP_ID_NOT_FOUND
            with pytest.raises(ShareGroupError) as info:
                await command._alter(admin, "g", {"share.delivery.count.limit": "1"}, [], False)
            assert info.value.code is ErrorCode.INVALID_CONFIG
            assert str(info.value).startswith("INVALID_CONFIG: share.delivery.count.limit=1 is")
            assert "allowed [2..10]" in str(info.value)
            assert await command._describe(admin, "g", False, False) == (
                "Dynamic configs for group g are:"
            )

    run(scenario())
