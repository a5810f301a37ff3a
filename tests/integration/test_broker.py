"""The local Kafka broker serves, has share groups enabled, and a native share group works."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from queueflow.devtools.broker import (
    LocalBroker,
    create_topic,
    finalized_features,
    is_serving,
    run_kafka_tool,
)
from queueflow.devtools.broker.locations import has_native_share_groups
from queueflow.testing import produce

pytestmark = pytest.mark.integration

N_RECORDS = 20


async def _describe_cluster(bootstrap: str) -> dict[str, object]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(admin.start(), 15)
        return await asyncio.wait_for(admin.describe_cluster(), 15)
    finally:
        await admin.close()


async def _list_topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(admin.start(), 15)
        return await asyncio.wait_for(admin.list_topics(), 15)
    finally:
        await admin.close()


async def _produce(bootstrap: str, topic: str, values: list[str]) -> None:
    await produce(bootstrap, topic, values, acks="all", timeout_s=30)


@pytest.mark.timeout(60)
def test_broker_serves(kafka_bootstrap: str) -> None:
    assert is_serving(kafka_bootstrap, timeout_s=10)
    cluster = asyncio.run(_describe_cluster(kafka_bootstrap))
    assert len(cluster["brokers"]) >= 1  # type: ignore[arg-type]


@pytest.mark.native_share_groups
@pytest.mark.timeout(120)
def test_share_version_finalized(kafka_bootstrap: str) -> None:
    proc = run_kafka_tool(
        "org.apache.kafka.tools.FeatureCommand",
        ["--bootstrap-server", kafka_bootstrap, "describe"],
        timeout_s=90,
    )
    assert proc.returncode == 0, proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if "Feature: share.version" in ln), None)
    assert line is not None, proc.stdout
    assert re.search(r"FinalizedVersionLevel:\s*1\b", line), line
    # The Python ApiVersions probe agrees with the Java tool.
    assert finalized_features(kafka_bootstrap, timeout_s=10).get("share.version") == 1


@pytest.mark.native_share_groups
@pytest.mark.timeout(240)
def test_native_share_group_end_to_end(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(1)
    group = f"qf-share-{uuid.uuid4().hex[:10]}"
    values = [f"record-{i}" for i in range(N_RECORDS)]
    asyncio.run(_produce(kafka_bootstrap, topic, values))

    # The share group's default is share.auto.offset.reset=latest: set earliest before consuming.
    configs = run_kafka_tool(
        "kafka.admin.ConfigCommand",
        [
            "--bootstrap-server",
            kafka_bootstrap,
            "--entity-type",
            "groups",
            "--entity-name",
            group,
            "--alter",
            "--add-config",
            "share.auto.offset.reset=earliest",
        ],
        timeout_s=90,
    )
    assert configs.returncode == 0, configs.stdout + configs.stderr

    consumer = run_kafka_tool(
        "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
        [
            "--bootstrap-server",
            kafka_bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--max-messages",
            str(N_RECORDS),
            "--timeout-ms",
            "30000",
        ],
        timeout_s=120,
    )
    received = [ln for ln in consumer.stdout.splitlines() if ln.startswith("record-")]
    assert sorted(received) == sorted(values), consumer.stdout + consumer.stderr
    assert consumer.returncode == 0, consumer.stderr

    describe = run_kafka_tool(
        "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
        ["--bootstrap-server", kafka_bootstrap, "--describe", "--group", group],
        timeout_s=90,
    )
    assert describe.returncode == 0, describe.stdout + describe.stderr
    assert group in describe.stdout, describe.stdout


@pytest.mark.timeout(240)
def test_restart_keeps_topics(local_broker: LocalBroker | None, kafka_bootstrap: str) -> None:
    """stop()/start() on the same data dir keeps topics (needed by broker-restart tests)."""
    if local_broker is None:
        pytest.skip("QUEUEFLOW_BROKER is set: the external cluster is not restarted")
    topic = f"qf-restart-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_bootstrap, topic, 2, timeout_s=30)
    local_broker.stop(timeout_s=60)
    assert not local_broker.is_running()
    assert not is_serving(kafka_bootstrap, timeout_s=2)
    local_broker.start(timeout_s=120)
    assert local_broker.status().serving
    assert topic in asyncio.run(_list_topics(kafka_bootstrap))
    if has_native_share_groups():
        assert finalized_features(kafka_bootstrap)["share.version"] >= 1


@pytest.mark.native_share_groups
@pytest.mark.timeout(120)
def test_tool_exits_1_when_a_kafka_admin_command_reports_an_error(kafka_bootstrap: str) -> None:
    """Kafka's share-group command prints ``Error: ...`` and exits 0 for an unknown group;
    ``queueflow broker tool`` exits 1 then, and passes its output on."""
    from click.testing import CliRunner

    from queueflow.devtools.cli import cli

    missing = f"qf-no-such-group-{uuid.uuid4().hex[:8]}"
    runner = CliRunner()
    tool = ["broker", "tool", "share-groups", "--bootstrap-server", kafka_bootstrap]
    failed = runner.invoke(cli, [*tool, "--describe", "--group", missing])
    assert failed.exit_code == 1, failed.output
    assert "Error:" in failed.output and missing in failed.output
    listed = runner.invoke(cli, [*tool, "--list"])
    assert listed.exit_code == 0, listed.output
