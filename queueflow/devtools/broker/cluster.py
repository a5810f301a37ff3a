"""A local replicated Kafka cluster: one KRaft controller and N brokers, each in its own JVM.

Why a dedicated controller: with N combined broker+controller nodes the KRaft quorum is the
brokers themselves, so losing one broker for good and then restarting another (a rolling
restart after a crash: what ``make chaos-cluster`` does) leaves 1 of 3 voters up and the
cluster without a controller. With the controller in its own process, the brokers can come and
go; only the controller must stay (it is not what the scenarios exercise). Its heap is small.

Replication: with 3 or more brokers every topic, internal ones included (``__consumer_offsets``,
``__transaction_state``, ``__share_group_state``), defaults to replication factor 3 and
``min.insync.replicas=2``: an ``acks=all`` write needs two replicas in sync, so the cluster
keeps accepting writes with one broker down and refuses them (``NOT_ENOUGH_REPLICAS``) while
only one replica is in sync (docs/operations.md "Running against a replicated cluster").

Layout of ``data_dir``: ``cluster.json`` (cluster id, node ids and ports, fixed at the first
start), ``controller/`` and ``broker-<id>/`` (each a :class:`LocalBroker` data directory:
``server.properties``, ``kraft-combined-logs/``, ``broker.log``, ...).

Typical use::

    cluster = LocalCluster(Path(".queueflow/broker"), brokers=3)
    cluster.start()
    print(cluster.bootstrap)       # "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9095"
    cluster.kill_broker(2)         # SIGKILL one broker (a crash)
    cluster.restart_broker(3)      # controlled shutdown, start, wait until its replicas are in sync
    cluster.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from queueflow.devtools.broker.blocking import run_blocking
from queueflow.devtools.broker.local import LocalBroker, _random_cluster_id, _render
from queueflow.devtools.broker.locations import KAFKA_VERSION, has_native_share_groups
from queueflow.devtools.broker.logtail import LOG_TAIL_LINES, tail_text
from queueflow.devtools.broker.probe import SHARE_VERSION, finalized_features, started_admin
from queueflow.devtools.broker.tools import run_kafka_tool
from queueflow.errors import BrokerError

__all__ = [
    "CLUSTER_BROKER_JVM_OPTS",
    "CLUSTER_CONTROLLER_JVM_OPTS",
    "CONTROLLER_NODE_ID",
    "ClusterNode",
    "LocalCluster",
    "NodeStatus",
    "is_cluster_dir",
]

log = logging.getLogger(__name__)

#: JVM options of each cluster broker (four JVMs share the machine: small heaps).
CLUSTER_BROKER_JVM_OPTS = ("-Xms128m", "-Xmx384m", "-XX:+UseSerialGC")
#: JVM options of the controller (it only holds the metadata log).
CLUSTER_CONTROLLER_JVM_OPTS = ("-Xms64m", "-Xmx192m", "-XX:+UseSerialGC")
#: The controller's node id (brokers are 1..N).
CONTROLLER_NODE_ID = 0
_META = "cluster.json"
_CLIENT_ID = "queueflow-cluster"


def is_cluster_dir(data_dir: Path) -> bool:
    """Return True if ``data_dir`` holds a :class:`LocalCluster` (its ``cluster.json``)."""
    return (Path(data_dir).expanduser() / _META).is_file()


def replication_configs(brokers: int) -> dict[str, str]:
    """The replication defaults of a cluster of ``brokers`` brokers: replication factor
    ``min(brokers, 3)`` for every topic (internal ones included), ``min.insync.replicas`` one
    less (at least 1)."""
    rf = min(brokers, 3)
    isr = max(rf - 1, 1)
    return {
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(isr),
        "offsets.topic.replication.factor": str(rf),
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(isr),
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(isr),
    }


class ClusterNode(LocalBroker):
    """One node of a :class:`LocalCluster`: the KRaft controller or a broker.

    A :class:`LocalBroker` whose configuration, storage format and readiness check are a
    separate controller's or broker's. Made by :class:`LocalCluster`; see there.

    Args:
        data_dir: the node's data directory.
        node_id: Kafka ``node.id`` (:data:`CONTROLLER_NODE_ID` for the controller).
        port: the broker's PLAINTEXT port (ignored for the controller).
        controller_port: the controller's port (the quorum's bootstrap address).
        cluster_id: the cluster id every node is formatted with.
        brokers: the cluster's broker count (sets the replication defaults).
        extra_config, jvm_opts, die_with_parent: as for :class:`LocalBroker`.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        node_id: int,
        port: int,
        controller_port: int,
        cluster_id: str,
        brokers: int,
        extra_config: Mapping[str, str] | None = None,
        jvm_opts: Sequence[str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.brokers = brokers
        controller = node_id == CONTROLLER_NODE_ID
        if jvm_opts is None:
            jvm_opts = CLUSTER_CONTROLLER_JVM_OPTS if controller else CLUSTER_BROKER_JVM_OPTS
        super().__init__(
            data_dir,
            port=0 if controller else port,
            controller_port=controller_port,
            extra_config=extra_config,
            jvm_opts=jvm_opts,
            die_with_parent=die_with_parent,
        )

    @property
    def is_controller(self) -> bool:
        """This node is the KRaft controller (no client listener)."""
        return self.node_id == CONTROLLER_NODE_ID

    @property
    def bootstrap(self) -> str:
        """A broker's ``"127.0.0.1:<port>"``; the controller's controller address."""
        port = self.controller_port if self.is_controller else self.port
        return f"127.0.0.1:{port}"

    def __repr__(self) -> str:
        role = "controller" if self.is_controller else "broker"
        return f"ClusterNode({role} {self.node_id}, {self.bootstrap})"

    def _describe(self) -> str:
        if self.is_controller:
            return f"KRaft controller (node {self.node_id}) on {self.bootstrap}"
        return f"broker {self.node_id} on {self.bootstrap}"

    def _listen_ports(self) -> list[int]:
        return [self.controller_port] if self.is_controller else [self.port]

    def _check_format_ports(self) -> None:
        return None  # cluster.json holds the layout

    def _write_configs(self) -> None:
        cport = self.controller_port
        if self.is_controller:
            lines = {
                "process.roles": "controller",
                "listeners": f"CONTROLLER://127.0.0.1:{cport}",
                "advertised.listeners": f"CONTROLLER://127.0.0.1:{cport}",
            }
        else:
            lines = {
                "process.roles": "broker",
                "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                "inter.broker.listener.name": "PLAINTEXT",
            }
        config = {
            **lines,
            "node.id": str(self.node_id),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{cport}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.log_dirs),
            "num.partitions": "1",
            # As on production clusters: a mistyped topic must fail, not appear.
            "auto.create.topics.enable": "false",
            **replication_configs(self.brokers),
            "offsets.topic.num.partitions": "4",
            "share.coordinator.state.topic.num.partitions": "1",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "group.initial.rebalance.delay.ms": "0",
            **self.extra_config,
        }
        header = (
            f"# queueflow local cluster ({self.brokers} brokers + 1 KRaft controller), "
            f"{self!r}.\n# Rendered by queueflow.devtools.broker.cluster on every start.\n"
        )
        body = "".join(f"{key}={value}\n" for key, value in config.items())
        self.config_path.write_text(header + body)
        log4j = _render(self._log4j_path.name, {"LOG_FILE": str(self.log_path)})
        self._log4j_path.write_text(log4j)

    def _format(self) -> None:
        args = ["format", "-t", self.cluster_id, "-c", str(self.config_path)]
        if self.is_controller:
            args.insert(1, "--standalone")
            if has_native_share_groups():
                args += ["--feature", f"{SHARE_VERSION}=1"]
        proc = run_kafka_tool("kafka.tools.StorageTool", args)
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting KRaft storage in {self.log_dirs} failed (exit {proc.returncode}):\n"
                f"{tail_text(proc.stdout + proc.stderr, LOG_TAIL_LINES)}"
            )
        meta = {
            "kafka_version": KAFKA_VERSION,
            "cluster_id": self.cluster_id,
            "node_id": self.node_id,
            "port": self.port,
            "controller_port": self.controller_port,
            "formatted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        }
        self._meta_path.write_text(json.dumps(meta, indent=2) + "\n")

    def _wait_serving(self, deadline: float, timeout_s: float) -> None:
        detail = "no answer yet"
        while True:
            pid = self.pid()
            if pid is None:
                raise BrokerError(
                    f"{self._describe()} ({self.data_dir}) exited before serving.\n"
                    f"{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"{self._describe()} (pid {pid}) was not serving within {timeout_s} s "
                    f"(last probe: {detail}).\n{self.log_tail()}"
                )
            ok, detail = self._probe(min(3.0, max(remaining, 0.5)))
            if ok:
                return
            time.sleep(min(0.3, max(deadline - time.monotonic(), 0)))

    def _probe(self, timeout_s: float) -> tuple[bool, str]:
        """(serving, why not): the controller answers ApiVersions with ``share.version``
        finalized; a broker answers and the metadata lists it as a live broker."""
        try:
            features = finalized_features(self.bootstrap, timeout_s)
        except BrokerError as exc:
            return False, str(exc)
        if self.is_controller:
            level = features.get(SHARE_VERSION)
            if has_native_share_groups() and (level is None or level < 1):
                return False, f"{SHARE_VERSION} is {level} (need >= 1)"
            return True, "serving"
        try:
            live = live_broker_ids(self.bootstrap, timeout_s)
        except Exception as exc:
            return False, f"metadata request failed: {exc!r}"
        if self.node_id not in live:
            return False, f"metadata lists brokers {sorted(live)}, not yet {self.node_id}"
        return True, "serving"

    def serving(self, timeout_s: float = 3.0) -> bool:
        """Return True if this node answers as :meth:`_wait_serving` requires. Never raises."""
        return self.pid() is not None and self._probe(timeout_s)[0]


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    """One node of :meth:`LocalCluster.status`.

    Attributes:
        node_id: Kafka ``node.id``; role: ``"controller"`` or ``"broker"``.
        address: ``127.0.0.1:<port>`` (the controller's: its controller listener).
        pid: the JVM's pid or None; serving: it answers requests (see
            :meth:`ClusterNode.serving`); data_dir and log_path: its files.
    """

    node_id: int
    role: str
    address: str
    pid: int | None
    serving: bool
    data_dir: Path
    log_path: Path


class LocalCluster:
    """A local Kafka cluster: one KRaft controller and ``brokers`` brokers (module docstring).

    Storage is formatted only on the first start; ``stop()``/``start()`` keep everything.
    Ports and node ids are fixed in ``cluster.json`` at the first start: later the stored ones
    are used (a different ``brokers`` count raises).

    Args:
        data_dir: the cluster's directory (created if missing).
        brokers: the broker count (>= 1); node ids 1..N.
        port: the first broker's PLAINTEXT port; the others take the next free numbers above
            it that are not ``controller_port`` (9092, 9094, 9095 with the defaults), unless
            ``broker_ports`` lists them.
        controller_port: the KRaft controller's port.
        broker_ports: every broker's port, in node id order (overrides ``port``).
        extra_config: configs added to every node's (controller and brokers).
        die_with_parent: as for :class:`LocalBroker` (the JVMs die with the thread that
            started them).

    Raises:
        BrokerError: bad counts or ports, or ``data_dir`` holds a different layout.
    """

    def __init__(
        self,
        data_dir: Path,
        brokers: int = 3,
        port: int = 9092,
        controller_port: int = 9093,
        *,
        broker_ports: Sequence[int] | None = None,
        extra_config: Mapping[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        if brokers < 1:
            raise BrokerError(f"a cluster needs at least one broker, not {brokers}")
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.die_with_parent = die_with_parent
        self.extra_config = dict(extra_config or {})
        layout = self._stored_layout()
        if layout is not None:
            if int(layout["brokers"]) != brokers:
                raise BrokerError(
                    f"{self.data_dir} holds a cluster of {layout['brokers']} brokers, not "
                    f"{brokers}; use --brokers {layout['brokers']} or wipe it (--fresh)"
                )
            ports = [int(p) for p in layout["broker_ports"]]
            controller_port = int(layout["controller_port"])
            cluster_id = str(layout["cluster_id"])
        else:
            ports = list(broker_ports or _next_ports(port, brokers, controller_port))
            cluster_id = _random_cluster_id()
        if len(ports) != brokers or len({*ports, controller_port}) != brokers + 1:
            raise BrokerError(f"need {brokers} distinct broker ports besides {controller_port}")
        self.cluster_id = cluster_id
        self.controller_port = controller_port

        def node(node_id: int, dirname: str, node_port: int) -> ClusterNode:
            return ClusterNode(
                self.data_dir / dirname,
                node_id=node_id,
                port=node_port,
                controller_port=controller_port,
                cluster_id=cluster_id,
                brokers=brokers,
                extra_config=self.extra_config,
                die_with_parent=die_with_parent,
            )

        self.controller = node(CONTROLLER_NODE_ID, "controller", 0)
        self.brokers = [node(i + 1, f"broker-{i + 1}", p) for i, p in enumerate(ports)]

    def __repr__(self) -> str:
        return f"LocalCluster({str(self.data_dir)!r}, bootstrap={self.bootstrap!r})"

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def bootstrap(self) -> str:
        """Every broker's address, comma-separated (what clients get as bootstrap)."""
        return ",".join(b.bootstrap for b in self.brokers)

    @property
    def nodes(self) -> list[ClusterNode]:
        """The controller, then the brokers."""
        return [self.controller, *self.brokers]

    def broker(self, node_id: int) -> ClusterNode:
        """The broker with ``node.id`` ``node_id``.

        Raises:
            BrokerError: no such broker.
        """
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        raise BrokerError(f"no broker {node_id} (brokers: {[b.node_id for b in self.brokers]})")

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout_s: float = 120, progress: Callable[[str], None] | None = None) -> None:
        """Start every node not running (formatting storage on first use) and wait until the
        controller and every broker serve.

        The brokers are launched together, then waited for. Call from a thread that outlives
        the cluster when ``die_with_parent`` is set.

        Args:
            timeout_s: seconds from launch until each node must serve.
            progress: where to say what happens (one line a call); default: this logger.

        Raises:
            BrokerError: a port in use, formatting failed, a JVM exited or did not serve in
                time (the JVMs this call launched are killed first).
        """
        say = progress or log.info
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._stored_layout() is None:
            self._write_layout()
        started = time.monotonic()
        self._format_all(say)
        launched: list[ClusterNode] = []
        try:
            if self.controller.pid() is None:
                self.controller.launch(progress, timeout_s)
                launched.append(self.controller)
            self.controller._wait_serving(time.monotonic() + timeout_s, timeout_s)
            for b in self.brokers:
                if b.pid() is None:
                    b.launch(progress, timeout_s)
                    launched.append(b)
            deadline = time.monotonic() + timeout_s
            for b in self.brokers:
                b._wait_serving(deadline, timeout_s)
        except BrokerError:
            for node in launched:
                with contextlib.suppress(BrokerError):
                    node.kill()
            raise
        say(
            f"Kafka cluster serving on {self.bootstrap} (controller 127.0.0.1:"
            f"{self.controller_port}) after {time.monotonic() - started:.1f} s"
        )

    def _format_all(self, say: Callable[[str], None]) -> None:
        """Format the nodes not yet formatted, together (a Kafka tool JVM each)."""
        pending = [n for n in self.nodes if not n.is_formatted() and n.pid() is None]
        if not pending:
            return
        say(f"formatting the KRaft storage of {len(pending)} nodes in {self.data_dir}")
        errors: list[BrokerError] = []

        def format_node(node: ClusterNode) -> None:
            try:
                node.data_dir.mkdir(parents=True, exist_ok=True)
                node._write_configs()
                node._format()
            except BrokerError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=format_node, args=(n,)) for n in pending]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def stop(self, timeout_s: float = 30) -> None:
        """Stop every node: the brokers together (controlled shutdowns), then the controller.
        Idempotent; data kept.

        Raises:
            BrokerError: a JVM survived SIGKILL.
        """
        errors: list[BrokerError] = []

        def stop(node: ClusterNode) -> None:
            try:
                node.stop(timeout_s)
            except BrokerError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=stop, args=(b,)) for b in self.brokers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop(self.controller)
        if errors:
            raise errors[0]

    def kill(self) -> None:
        """SIGKILL every node (brokers first); data kept."""
        for node in [*self.brokers, self.controller]:
            node.kill()

    def wipe(self) -> None:
        """Stop every node and delete :attr:`data_dir`.

        Raises:
            BrokerError: ``data_dir`` is not empty and holds no ``cluster.json``.
        """
        self.stop()
        if not self.data_dir.exists():
            return
        if any(self.data_dir.iterdir()) and not is_cluster_dir(self.data_dir):
            raise BrokerError(f"refusing to delete {self.data_dir}: it holds no {_META}")
        shutil.rmtree(self.data_dir)

    def kill_broker(self, node_id: int) -> None:
        """SIGKILL broker ``node_id`` (a crash); its data stays. Other nodes are untouched."""
        self.broker(node_id).kill()

    def stop_broker(self, node_id: int, timeout_s: float = 30) -> None:
        """Stop broker ``node_id`` (SIGTERM: a controlled shutdown that moves its leaderships)."""
        self.broker(node_id).stop(timeout_s)

    def start_broker(self, node_id: int, timeout_s: float = 120) -> None:
        """Start broker ``node_id`` again and wait until the metadata lists it as live.

        Raises:
            BrokerError: it did not serve within ``timeout_s``.
        """
        self.broker(node_id).start(timeout_s)

    def restart_broker(
        self, node_id: int, down_s: float = 0.0, timeout_s: float = 120
    ) -> dict[str, float]:
        """One step of a rolling restart: stop broker ``node_id`` (controlled shutdown), wait
        ``down_s`` seconds, start it and wait until its replicas are back in sync.

        Returns:
            Wall-clock times (``time.time()``): ``stopped``, ``started`` (serving again) and
            ``in_sync`` (every partition's ISR holds every live replica).

        Raises:
            BrokerError: it did not serve, or its replicas were not in sync, in ``timeout_s``.
        """
        self.stop_broker(node_id)
        stopped = time.time()
        time.sleep(down_s)
        self.start_broker(node_id, timeout_s)
        started = time.time()
        self.wait_in_sync(timeout_s)
        return {"stopped": stopped, "started": started, "in_sync": time.time()}

    # -- state -----------------------------------------------------------------------------

    def live_brokers(self, timeout_s: float = 5.0) -> set[int]:
        """The node ids the cluster metadata lists as live (unfenced) brokers.

        Raises:
            BrokerError: no running broker answered.
        """
        last: Exception | None = None
        for b in self.brokers:
            if b.pid() is None:
                continue
            try:
                return live_broker_ids(b.bootstrap, timeout_s)
            except Exception as exc:
                last = exc
        raise BrokerError(f"no broker of {self!r} answered a metadata request: {last!r}")

    def wait_in_sync(self, timeout_s: float = 120, poll_s: float = 0.5) -> float:
        """Wait until every partition of every topic has a leader and its ISR holds each of its
        replicas that is a live broker (what a rolling restart waits for before the next step:
        no partition under-replicated but by a broker that is down). Returns the seconds waited.

        Raises:
            BrokerError: not in sync within ``timeout_s`` (the message names a lagging
                partition).
        """
        started = time.monotonic()
        detail = "no answer yet"
        while time.monotonic() - started < timeout_s:
            try:
                lagging = self._lagging(min(5.0, timeout_s))
            except Exception as exc:
                lagging = [f"metadata request failed: {exc!r}"]
            if not lagging:
                return time.monotonic() - started
            detail = f"{len(lagging)} partitions, e.g. {lagging[0]}"
            time.sleep(poll_s)
        raise BrokerError(f"{self!r}: replicas not in sync within {timeout_s} s ({detail})")

    def _lagging(self, timeout_s: float) -> list[str]:
        live, topics = run_blocking(_describe(self._any_bootstrap(), timeout_s))
        out = []
        for topic in topics:
            for p in topic.get("partitions", []):
                want = set(p.get("replicas", [])) & live
                if p.get("leader", -1) < 0 or not want <= set(p.get("isr", [])):
                    out.append(
                        f"{topic['topic']}-{p['partition']} (leader {p.get('leader')}, "
                        f"isr {p.get('isr')}, replicas {p.get('replicas')})"
                    )
        return out

    def _any_bootstrap(self) -> str:
        running = [b.bootstrap for b in self.brokers if b.pid() is not None]
        if not running:
            raise BrokerError(f"no broker of {self!r} is running")
        return ",".join(running)

    def status(self, timeout_s: float = 3.0) -> list[NodeStatus]:
        """Every node's :class:`NodeStatus` (controller first)."""
        return [
            NodeStatus(
                node_id=n.node_id,
                role="controller" if n.is_controller else "broker",
                address=n.bootstrap,
                pid=n.pid(),
                serving=n.serving(timeout_s),
                data_dir=n.data_dir,
                log_path=n.log_path,
            )
            for n in self.nodes
        ]

    def _stored_layout(self) -> dict[str, Any] | None:
        try:
            layout: dict[str, Any] = json.loads((self.data_dir / _META).read_text())
        except (OSError, ValueError):
            return None
        return layout

    def _write_layout(self) -> None:
        if self.data_dir.exists() and (self.data_dir / "kraft-combined-logs").exists():
            raise BrokerError(
                f"{self.data_dir} holds a single-node broker; stop it and wipe it first "
                f"(queueflow broker start --fresh --brokers {len(self.brokers)}) or choose "
                f"another --data-dir"
            )
        layout = {
            "kafka_version": KAFKA_VERSION,
            "cluster_id": self.cluster_id,
            "brokers": len(self.brokers),
            "broker_ports": [b.port for b in self.brokers],
            "controller_port": self.controller_port,
            "controller_node_id": CONTROLLER_NODE_ID,
        }
        (self.data_dir / _META).write_text(json.dumps(layout, indent=2) + "\n")


def _next_ports(first: int, count: int, skip: int) -> list[int]:
    ports: list[int] = []
    port = first
    while len(ports) < count:
        if port != skip:
            ports.append(port)
        port += 1
    return ports


async def _describe(bootstrap: str, timeout_s: float) -> tuple[set[int], list[Any]]:
    async with started_admin(bootstrap, timeout_s, _CLIENT_ID) as admin:
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
        topics = await asyncio.wait_for(admin.describe_topics(), timeout_s)
        return {int(b["node_id"]) for b in cluster.get("brokers", [])}, list(topics)


def live_broker_ids(bootstrap: str, timeout_s: float = 5.0) -> set[int]:
    """The node ids of the live brokers in ``bootstrap``'s metadata.

    Raises:
        Exception: the request failed (aiokafka's errors, ``asyncio.TimeoutError``).
    """

    async def ids() -> set[int]:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap,
            request_timeout_ms=max(int(timeout_s * 1000), 1000),
            client_id=_CLIENT_ID,
        )
        try:
            await asyncio.wait_for(admin.start(), timeout_s)
            cluster = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
            return {int(b["node_id"]) for b in cluster.get("brokers", [])}
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    return run_blocking(ids())
