"""How a leader worker sizes its coordinator topic and group table (docs/architecture.md
"Coordinator sharding"): as the existing topics are, else as
``queueflow.coordinator.topic.num.partitions``; a setting that differs from an existing topic is
logged, never acted on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

import queueflow
from queueflow import faust_app
from queueflow.errors import ConfigurationError
from queueflow.protocol import topics

APP = "qf-shard"
COORDINATOR, CHANGELOG = topics.coordinator_topic(APP), topics.groups_changelog(APP)


@pytest.fixture(autouse=True)
def loop(
    faust_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> asyncio.AbstractEventLoop:
    """Faust's event loop (conftest ``faust_loop``), and no coordinator partition count from
    the environment."""
    monkeypatch.delenv("QUEUEFLOW_COORDINATOR_TOPIC_NUM_PARTITIONS", raising=False)
    return faust_loop


def prepared(
    loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
    existing: dict[str, int],
    **share_settings: Any,
) -> tuple[Any, list[int], list[dict[str, Any]]]:
    """Build an app (nothing listens at its broker), let its coordinator topic be prepared
    against ``existing`` topics; returns the share groups, the partitions each declared topic
    had when declared (the coordinator topic, then the group changelog), and the log
    events."""
    app = queueflow.App(
        APP, broker="kafka://localhost:1", store="memory://", share_settings=share_settings
    )
    groups = app.share_groups
    declared: list[int] = []

    async def counts(_kafka: Any, names: list[str]) -> dict[str, int]:
        assert sorted(names) == sorted([COORDINATOR, CHANGELOG])
        return {n: c for n, c in existing.items() if n in names}

    changelog = groups._groups_table.changelog_topic

    async def declare() -> None:
        declared.append(groups._coordinator_topic.partitions)

    async def declare_changelog() -> None:  # before Faust's consumer reads metadata
        assert declared, "the changelog is declared after the coordinator topic"
        declared.append(changelog.partitions)

    monkeypatch.setattr(faust_app, "topic_partition_counts", counts)
    monkeypatch.setattr(groups._coordinator_topic, "maybe_declare", declare)
    monkeypatch.setattr(changelog, "maybe_declare", declare_changelog)
    with capture_logs() as logs:
        loop.run_until_complete(groups._prepare_coordinator_topic())
    return groups, declared, logs


def sizes(groups: Any) -> tuple[int, int, int, int]:
    table = groups._groups_table
    return (
        groups._coordinator_topic.partitions,
        table.partitions,
        table.changelog_topic.partitions,
        groups.server_context.coordinator_partitions,
    )


def test_a_new_app_creates_the_topic_with_the_setting(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups, declared, logs = prepared(loop, monkeypatch, {})
    assert sizes(groups) == (8, 8, 8, 8) and declared == [8, 8]
    assert not [e for e in logs if e["event"] == "coordinator_partitions_mismatch"]

    groups, declared, _ = prepared(
        loop, monkeypatch, {}, **{"queueflow.coordinator.topic.num.partitions": 3}
    )
    assert sizes(groups) == (3, 3, 3, 3) and declared == [3, 3]


def test_an_app_made_before_sharding_keeps_its_one_partition_and_says_so(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups, declared, logs = prepared(loop, monkeypatch, {COORDINATOR: 1, CHANGELOG: 1})
    assert sizes(groups) == (1, 1, 1, 1) and declared == [1, 1]
    (warning,) = [e for e in logs if e["event"] == "coordinator_partitions_mismatch"]
    assert warning["log_level"] == "warning"
    assert (warning["partitions"], warning["configured"]) == (1, 8)
    assert "new app id" in warning["detail"]


def test_the_group_changelog_decides_when_only_it_exists(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The coordinator topic was deleted (it holds requests only); the groups' state is hashed
    # by the changelog's count, so the topic is re-created with it.
    groups, declared, _ = prepared(loop, monkeypatch, {CHANGELOG: 4})
    assert sizes(groups) == (4, 4, 4, 4) and declared == [4, 4]


def test_a_topic_and_changelog_that_disagree_stop_the_worker(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="co-partitioned"):
        prepared(loop, monkeypatch, {COORDINATOR: 8, CHANGELOG: 1})
