"""Workers on separate hosts: a Kafka broker on the bridge of a :class:`NetLab`, and chaos-app
workers (:mod:`examples.chaos.app`) each in its own network namespace with its own address.

Every process of the cluster is started by this one, and :meth:`PartitionCluster.close` stops
them and deletes the namespaces, also after a failure (use it as a context manager).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.chaos.config import ROOT
from queueflow.devtools.broker import LocalBroker, create_topic, find_free_ports
from queueflow.devtools.netns import Host, NetLab
from queueflow.testing import WorkerProcess, events, faust_worker_argv

__all__ = ["PartitionCluster", "SlotWorker", "leaders_by_partition"]

#: Share-group settings of every worker (KIP-932 names): locks short enough that records a
#: cut-off member held come back within a scenario.
SHARE_SETTINGS: dict[str, int | str] = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 5000,
    "group.share.session.timeout.ms": 8000,
    "group.share.heartbeat.interval.ms": 1000,
    "group.share.delivery.count.limit": 10,
}


@dataclass
class SlotWorker:
    """One worker on its own host (a ``faust worker`` of :mod:`examples.chaos.app`)."""

    name: str
    role: str
    host: Host
    process: WorkerProcess
    incarnation: int = 0
    pids: list[int] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def alive(self) -> bool:
        return self.process.alive()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Its queueflow events, every incarnation."""
        return events(self.log_path, name)


def leaders_by_partition(workers: Mapping[str, SlotWorker], topic: str) -> dict[int, str]:
    """Request partition -> the worker whose newest ``leader_assigned`` for ``topic`` (by
    leader epoch) names it."""
    best: dict[int, tuple[int, str]] = {}
    for name, w in workers.items():
        for event in w.events("leader_assigned"):
            if event.get("topic") != topic:
                continue
            epoch = int(event["leader_epoch"])
            for p in event.get("partitions") or []:
                if p not in best or best[p][0] <= epoch:
                    best[int(p)] = (epoch, name)
    return {p: name for p, (_, name) in best.items()}


class PartitionCluster:
    """A broker on the lab's bridge and workers on their own hosts.

    Args:
        run_dir: where the broker's data, the workers' logs and ledgers go.
        roles: worker name -> ``QUEUEFLOW_ROLE`` (``all``, ``leader``, ``member``).
        partitions: partitions of the source topic.
        session_timeout_s: the leaders' Faust session timeout (heartbeats every second).
        progress: where to say what it does.
    """

    def __init__(
        self,
        run_dir: Path,
        roles: Mapping[str, str],
        partitions: int = 3,
        session_timeout_s: float = 6.0,
        progress: Callable[[str], None] = print,
    ) -> None:
        self.run_dir = run_dir
        self.roles = dict(roles)
        self.partitions = partitions
        self.session_timeout_s = session_timeout_s
        self.progress = progress
        run_id = uuid.uuid4().hex[:8]
        self.topic = f"partition-{run_id}"
        self.app_id = f"queueflow-partition-{run_id}"
        self.lab = NetLab()
        self.broker: LocalBroker | None = None
        self.port = 0
        self.workers: dict[str, SlotWorker] = {}

    @property
    def bootstrap(self) -> str:
        """The broker's address on the bridge (reachable from every host)."""
        return f"{self.lab.gateway}:{self.port}"

    def __enter__(self) -> PartitionCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """The lab, the broker (listening on every address, advertising the bridge's), the
        topic, one host per worker (workers not started: :meth:`start_worker`)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lab.create()
        self.port, controller = find_free_ports(2)
        self.broker = LocalBroker(
            self.run_dir / "broker",
            port=self.port,
            controller_port=controller,
            extra_config={
                "listeners": f"PLAINTEXT://0.0.0.0:{self.port},CONTROLLER://127.0.0.1:{controller}",
                "advertised.listeners": (
                    f"PLAINTEXT://{self.lab.gateway}:{self.port},"
                    f"CONTROLLER://127.0.0.1:{controller}"
                ),
                "group.min.session.timeout.ms": "2000",  # Kafka's 6 s floor: short tests
            },
            die_with_parent=True,
        )
        self.broker.start(progress=self.progress)
        create_topic(self.bootstrap, self.topic, self.partitions)
        for name, role in self.roles.items():
            host = self.lab.add_host(name)
            self.workers[name] = self._worker(name, role, host)
        self.progress(
            f"lab {self.lab.tag}: broker {self.bootstrap}; hosts "
            + ", ".join(f"{w.name}={w.host.ip} ({w.role})" for w in self.workers.values())
        )

    def _worker(self, name: str, role: str, host: Host) -> SlotWorker:
        settings = {**SHARE_SETTINGS, "queueflow.leader.listener": f"{host.ip}:0"}
        env = {
            "CHAOS_APP_ID": self.app_id,
            "CHAOS_TOPIC": self.topic,
            "CHAOS_BROKER": f"kafka://{self.bootstrap}",
            "CHAOS_RELEASE": "0",
            "CHAOS_REJECT": "0",
            "CHAOS_POISON_MOD": str(10**12),
            "CHAOS_WORK_MS": "1",
            "CHAOS_SHARE_SETTINGS": json.dumps(settings),
            "CHAOS_FAUST_SESSION_TIMEOUT_S": str(self.session_timeout_s),
            "CHAOS_FAUST_HEARTBEAT_S": "1",
            "QUEUEFLOW_ROLE": role,
            "PYTHONUNBUFFERED": "1",
        }
        argv = faust_worker_argv(
            "examples.chaos.app", self.run_dir / name, loglevel="info", without_web=True
        )
        process = WorkerProcess(
            self.lab.argv(host, argv), self.run_dir / f"{name}.log", env, cwd=ROOT
        )
        return SlotWorker(name, role, host, process)

    def start_worker(self, name: str) -> None:
        """Start (again) worker ``name``; its ledger is ``ledger/<name>-<incarnation>.jsonl``."""
        w = self.workers[name]
        w.incarnation += 1
        ledger = self.run_dir / "ledger"
        ledger.mkdir(parents=True, exist_ok=True)
        w.process.start(
            {"CHAOS_LEDGER": str(ledger / f"{name}-{w.incarnation}.jsonl")},
            header=f"\n===== partition: {name} incarnation {w.incarnation} =====",
        )
        if w.process.pid is not None:
            w.pids.append(w.process.pid)

    def leaders(self) -> dict[int, str]:
        """Request partition -> the worker leading it now (newest assignment)."""
        return leaders_by_partition(self.workers, self.topic)

    def wait_settled(self, names: list[str], timeout_s: float = 90.0) -> int:
        """Wait until the workers ``names`` logged ``leader_assigned`` in one generation and
        lead every partition together; returns that generation.

        Raises:
            TimeoutError: not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in names:
                if self.workers[name].incarnation and not self.workers[name].alive():
                    tail = self.workers[name].process.log_tail(30)
                    raise RuntimeError(f"worker {name} exited while starting:\n{tail}")
            latest: dict[str, tuple[int, set[int]]] = {}
            for name in names:
                for e in self.workers[name].events("leader_assigned"):
                    if e.get("topic") == self.topic:
                        latest[name] = (int(e["leader_epoch"]), set(e.get("partitions") or []))
            epochs = {epoch for epoch, _ in latest.values()}
            covered = set().union(*(ps for _, ps in latest.values())) if latest else set()
            settled = len(latest) == len(names) and len(epochs) == 1
            if settled and covered == set(range(self.partitions)):
                return epochs.pop()
            time.sleep(0.2)
        raise TimeoutError(f"workers {names} did not settle into one generation in {timeout_s} s")

    def close(self) -> None:
        """Stop every worker and the broker, delete the namespaces (idempotent)."""
        for w in self.workers.values():
            with contextlib.suppress(Exception):
                w.process.terminate()
        deadline = time.monotonic() + 15
        for w in self.workers.values():
            proc = w.process.process
            if proc is None:
                continue
            with contextlib.suppress(Exception):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            with contextlib.suppress(Exception):
                w.process.kill()
        if self.broker is not None:
            with contextlib.suppress(Exception):
                self.broker.stop()
            self.broker = None
        self.lab.close()
