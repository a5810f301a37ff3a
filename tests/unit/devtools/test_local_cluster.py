"""The local cluster's layout and configuration (:mod:`queueflow.devtools.broker.cluster`),
without starting a JVM: a dedicated KRaft controller, brokers on the next free port numbers,
replication factor 3 and ``min.insync.replicas=2`` for every topic with three brokers, and a
data directory that keeps its layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from examples.chaos.analysis import broker_outages
from examples.chaos.timeline import Event
from queueflow.devtools.broker.cluster import LocalCluster, is_cluster_dir, replication_configs
from queueflow.devtools.cli import cli
from queueflow.errors import BrokerError


def properties(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_three_brokers_replicate_every_topic_three_times_with_two_in_sync() -> None:
    configs = replication_configs(3)
    assert configs["default.replication.factor"] == "3"
    assert configs["min.insync.replicas"] == "2"
    for name in ("offsets.topic", "transaction.state.log", "share.coordinator.state.topic"):
        assert configs[f"{name}.replication.factor"] == "3"
    assert configs["transaction.state.log.min.isr"] == "2"
    assert configs["share.coordinator.state.topic.min.isr"] == "2"
    assert replication_configs(1)["min.insync.replicas"] == "1"
    assert replication_configs(5)["default.replication.factor"] == "3"


def test_a_controller_of_its_own_and_brokers_on_the_next_ports(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3, port=9092, controller_port=9093)
    assert cluster.bootstrap == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9095"
    for node in cluster.nodes:
        node.data_dir.mkdir(parents=True)
        node._write_configs()
    controller = properties(cluster.controller.config_path)
    assert controller["process.roles"] == "controller"
    assert controller["listeners"] == "CONTROLLER://127.0.0.1:9093"
    broker = properties(cluster.broker(2).config_path)
    assert broker["process.roles"] == "broker"
    assert broker["node.id"] == "2"
    assert broker["listeners"] == "PLAINTEXT://127.0.0.1:9094"
    assert broker["controller.quorum.bootstrap.servers"] == "127.0.0.1:9093"
    assert (broker["default.replication.factor"], broker["min.insync.replicas"]) == ("3", "2")


def test_the_data_directory_keeps_its_layout(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3, broker_ports=[20001, 20002, 20003], controller_port=20000)
    cluster._write_layout()
    assert is_cluster_dir(tmp_path)
    again = LocalCluster(tmp_path, 3)  # the stored ports and cluster id, not the defaults
    assert again.bootstrap == cluster.bootstrap
    assert again.cluster_id == cluster.cluster_id
    with pytest.raises(BrokerError, match="holds a cluster of 3 brokers, not 2"):
        LocalCluster(tmp_path, 2)


def test_bad_layouts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="at least one broker"):
        LocalCluster(tmp_path, 0)
    with pytest.raises(BrokerError, match="distinct broker ports"):
        LocalCluster(tmp_path, 2, broker_ports=[9093, 9094], controller_port=9093)
    (tmp_path / "single" / "kraft-combined-logs").mkdir(parents=True)
    with pytest.raises(BrokerError, match="holds a single-node broker"):
        LocalCluster(tmp_path / "single", 3)._write_layout()


def test_broker_outages_span_a_restart_and_a_kill_until_after_its_fencing() -> None:
    events = [
        Event(100.0, "broker_kill", detail="broker 2"),
        Event(110.0, "broker_fenced", detail="broker 2"),
        Event(200.0, "broker_stop", detail="broker 1"),
        Event(215.0, "broker_start", detail="broker 1"),
        Event(300.0, "broker_stop", detail="broker 3"),
    ]
    assert broker_outages(events) == [(100.0, 140.0), (200.0, 215.0), (300.0, float("inf"))]
    # make chaos: one broker, no name
    assert broker_outages([Event(5.0, "broker_stop"), Event(9.0, "broker_start")]) == [(5.0, 9.0)]


def test_the_cli_knows_a_cluster_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEUEFLOW_BROKER", raising=False)
    cluster = LocalCluster(tmp_path, 3, broker_ports=[20001, 20002, 20003], controller_port=20000)
    cluster._write_layout()
    runner = CliRunner()
    started = runner.invoke(cli, ["broker", "start", "--data-dir", str(tmp_path)])
    assert started.exit_code == 1
    assert "holds a cluster; start it with --brokers 3" in started.output
    status = runner.invoke(cli, ["broker", "status", "--data-dir", str(tmp_path)])
    assert status.exit_code == 1  # nothing runs
    assert "127.0.0.1:20001,127.0.0.1:20002,127.0.0.1:20003" in status.output
    assert "controller 0:  127.0.0.1:20000  not running" in status.output
    stopped = runner.invoke(cli, ["broker", "stop", "--data-dir", str(tmp_path)])
    assert (stopped.exit_code, stopped.output.strip()) == (0, "not running")
