"""``queueflow share-groups --release-key / --skip-key`` (key-ordered groups, docs/operations.md
"Parked keys"): flag combinations are refused before anything connects; the actions run
against an ``InProcessCluster``'s admin."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from inprocess_helpers import TOPIC, run, settings, settle

import queueflow
from queueflow.devtools.cli import cli, parked_keys
from queueflow.devtools.cli import share_groups as command
from queueflow.errors import ShareGroupError
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

BASE = ["share-groups", "--bootstrap-server", "x:1", "--app", "app"]


@pytest.fixture
def no_admin(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("the command connected although its flags are refused")

    monkeypatch.setattr(command, "make_admin", refuse)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--release-key", "a", "--topic", "t"], "exactly one --group"),
        (["--skip-key", "a", "--group", "g"], "exactly one --topic"),
        (["--skip-key", "a", "--group", "g", "--topic", "t:0"], "exactly one --topic"),
        (
            ["--release-key", "a", "--skip-key", "a", "--group", "g", "--topic", "t"],
            "give one of them",
        ),
        (["--release-key", "a", "--group", "g", "--topic", "t", "--list"], "action of its own"),
        (["--describe", "--group", "g", "--partition", "0"], "--partition may be used"),
    ],
)
def test_bad_flags_are_refused_before_connecting(
    no_admin: None, flags: list[str], message: str
) -> None:
    result = CliRunner().invoke(cli, [*BASE, *flags])
    assert result.exit_code == 1 and message in result.output, result.output


def test_release_and_skip_print_where_the_key_was_freed() -> None:
    async def scenario() -> None:
        cluster = InProcessCluster(
            {TOPIC: 1},
            clock=FakeClock(),
            settings=settings(),
            group_configs={"g": {"share.ordering": "key"}},
        )
        for i, k in enumerate(["a", "a", "a"]):
            cluster.produce(TOPIC, f"{k}{i}".encode(), key=k.encode())
        async with cluster:
            admin = cluster.admin()
            c = cluster.consumer("g", ordering="key", acknowledgement_mode="explicit")
            await c.subscribe([TOPIC])
            (first,) = await c.poll(timeout_ms=2000)
            c.acknowledge(first, queueflow.REJECT)
            await c.commit_sync()
            await settle(cluster)
            text = await parked_keys.key_action(admin, "g", TOPIC, "a", None, None, False)
            assert text == f"Released key 'a' of share group 'g' on {TOPIC}[0]."
            (second,) = await c.poll(timeout_ms=2000)
            c.acknowledge(second, queueflow.REJECT)
            await c.commit_sync()
            await settle(cluster)
            text = await parked_keys.key_action(admin, "g", TOPIC, None, "a", 0, True)
            assert text == f'[{{"topic": "{TOPIC}", "partition": 0, "archived": 1}}]'
            with pytest.raises(ShareGroupError, match="not parked"):
                await parked_keys.key_action(admin, "g", TOPIC, "a", None, None, False)
            await c.close()

    run(scenario())
