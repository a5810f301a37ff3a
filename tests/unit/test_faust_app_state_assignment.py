"""A leader worker leads a share-partition only when Faust assigned it the partition's state
changelog too (its table recovery then reads the state), and creates the changelog topics
before its consumer reads the cluster's metadata (docs/operations.md
``leader_state_unassigned``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

import queueflow
from queueflow import _compat, faust_app


@pytest.fixture(autouse=True)
def loop(faust_loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
    """Every test here gets Faust's event loop (conftest ``faust_loop``)."""
    return faust_loop


def leader_app() -> Any:
    app = queueflow.App("qf-state", broker="kafka://localhost:1", store="memory://")

    @app.share_agent("orders", group="g")
    async def handle(record: queueflow.ShareRecord) -> object:
        return queueflow.ACCEPT

    return app.share_groups


def test_partitions_without_their_state_changelog_are_not_led(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = leader_app()
    monkeypatch.setattr(_compat, "active_changelog_partitions", lambda table: {0, 2})
    request_topic = groups._request_topics["orders"].get_topic_name()
    with capture_logs() as logs:
        assert groups._with_state(groups._tables["orders"], request_topic, {0, 1, 2}, 7) == {
            0,
            2,
        }
    (error,) = [e for e in logs if e["event"] == "leader_state_unassigned"]
    assert error["log_level"] == "error"
    assert (error["topic"], error["partitions"], error["generation"]) == (request_topic, [1], 7)
    assert error["changelog"].endswith("share-state-orders-changelog")


def test_coordinator_partitions_without_their_group_changelog_are_not_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = leader_app()
    seen: list[str] = []

    def active(table: Any) -> set[int]:
        seen.append(table.changelog_topic.get_topic_name())
        return {3} if table is groups._groups_table else {0, 1, 2}

    monkeypatch.setattr(_compat, "active_changelog_partitions", active)
    coordinator = groups._coordinator_topic.get_topic_name()
    with capture_logs() as logs:
        served = groups._with_state(groups._groups_table, coordinator, {3, 5}, 4)
    assert served == {3}
    assert seen == [groups._groups_table.changelog_topic.get_topic_name()]
    (error,) = [e for e in logs if e["event"] == "leader_state_unassigned"]
    assert (error["topic"], error["partitions"]) == (coordinator, [5])


def test_partitions_with_their_state_changelog_are_led_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = leader_app()
    monkeypatch.setattr(_compat, "active_changelog_partitions", lambda table: {0, 1, 2, 3})
    with capture_logs() as logs:
        table = groups._tables["orders"]
        assert groups._with_state(table, "orders-requests", {1, 3}, 2) == {1, 3}
    assert not logs


def test_prepare_creates_the_state_changelog_with_the_request_topic(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faust creates a table's changelog when the table starts, after its consumer has
    subscribed; a group leader whose metadata came in between left the changelog unassigned."""
    groups = leader_app()
    declared: list[tuple[str, int]] = []

    def recorder(topic: Any) -> Any:
        async def declare() -> None:
            declared.append((topic.get_topic_name(), topic.partitions))

        return declare

    async def counts(_kafka: Any, names: list[str]) -> dict[str, int]:
        return dict.fromkeys(names, 3)

    async def nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    request_topic = groups._request_topics["orders"]
    changelog = groups._tables["orders"].changelog_topic
    monkeypatch.setattr(request_topic, "maybe_declare", recorder(request_topic))
    monkeypatch.setattr(changelog, "maybe_declare", recorder(changelog))
    monkeypatch.setattr(faust_app, "wait_for_broker", nothing)
    monkeypatch.setattr(faust_app, "partition_counts", counts)
    monkeypatch.setattr(groups, "_prepare_coordinator_topic", nothing)
    monkeypatch.setattr(faust_app, "ensure_topic", nothing)
    monkeypatch.setattr(groups, "_start_kafka_listener", nothing)
    endpoint = groups.endpoint
    if endpoint is not None:
        monkeypatch.setattr(endpoint, "start", nothing)
    loop.run_until_complete(groups.prepare())
    assert declared == [
        (request_topic.get_topic_name(), 3),
        (changelog.get_topic_name(), 3),
    ]
