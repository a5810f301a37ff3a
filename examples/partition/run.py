"""One ``make partition-test`` run: workers on separate hosts under load, the nemesis' four
scenarios, then every record checked (lost, duplicates) and the JSON line built."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.chaos.ledger import Ledger
from examples.partition.lab import PartitionCluster
from examples.partition.nemesis import Nemesis
from queueflow.testing import produce

__all__ = ["PartitionConfig", "repeated_delivery_counts", "run"]

#: The hosts: three workers that lead, coordinate and handle, two that only handle.
ROLES = {"w1": "all", "w2": "all", "w3": "all", "m1": "member", "m2": "member"}


@dataclass
class PartitionConfig:
    """Parameters of one run."""

    records: int = 20_000
    #: records produced per second while the nemesis works
    rate: int = 150
    partitions: int = 3
    session_timeout_s: float = 6.0
    #: bound (s) for every record to be handled after the last scenario
    drain_timeout_s: float = 240.0


class Load:
    """Produces ids 1..``records`` at ``rate`` per second from a thread (the root namespace;
    :mod:`examples.chaos.app` makes every multiple of its poison modulus, 0 too, raise)."""

    def __init__(self, bootstrap: str, topic: str, records: int, rate: int, partitions: int):
        self.bootstrap, self.topic = bootstrap, topic
        self.records, self.rate, self.partitions = records, rate, partitions
        self.produced = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="partition-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            while self.produced < self.records and not self._stop.is_set():
                due = min(self.records, int((time.monotonic() - started) * self.rate) + self.rate)
                ids = [str(i) for i in range(self.produced + 1, due + 1)]  # 0 is chaos' poison
                if ids:
                    asyncio.run(
                        produce(
                            self.bootstrap,
                            self.topic,
                            ids,
                            keys=ids,
                            partitions=self.partitions,
                            acks="all",
                            enable_idempotence=True,
                        )
                    )
                    self.produced = due
                self._stop.wait(0.5)
        except BaseException as exc:  # reported by the run
            self.error = exc

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def run(
    config: PartitionConfig, run_dir: Path, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """One run; returns the JSON line's fields. Cleans up (workers, broker, namespaces)."""
    started = time.monotonic()
    with PartitionCluster(
        run_dir, ROLES, config.partitions, config.session_timeout_s, progress
    ) as cluster:
        leaders = [n for n, r in ROLES.items() if r != "member"]
        for name in leaders:
            cluster.start_worker(name)
        generation = cluster.wait_settled(leaders)
        progress(f"leaders settled in generation {generation}: {cluster.leaders()}")
        for name in ROLES:
            if ROLES[name] == "member":
                cluster.start_worker(name)
        ledger = Ledger(run_dir / "ledger")
        nemesis = Nemesis(cluster, ledger, progress)
        load = Load(
            cluster.bootstrap, cluster.topic, config.records, config.rate, config.partitions
        )
        load.start()
        scenarios: list[dict[str, Any]] = []
        try:
            nemesis._hold(5.0)  # the members joined and handle records
            scenarios.append(nemesis.one_way(_leader_of(cluster, 0)))
            cluster.wait_settled(leaders)
            scenarios.append(nemesis.member_leader("m1", _leader_of(cluster, 1)))
            scenarios.append(nemesis.isolate(_leader_of(cluster, 2)))
            cluster.wait_settled(leaders)
            scenarios.append(nemesis.flapping(_leader_of(cluster, 0)))
            load.join(config.records / config.rate + 120)
        finally:
            load.stop()
        summary = _drain(cluster, ledger, load.produced, config.drain_timeout_s, progress)
        if load.error is not None:
            summary["load_error"] = repr(load.error)
        restarts = sum(max(w.incarnation - 1, 0) for w in cluster.workers.values())
    return {
        "test": "partition",
        **summary,
        "scenarios": scenarios,
        "worker_restarts": restarts,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def _leader_of(cluster: PartitionCluster, partition: int) -> str:
    leaders = cluster.leaders()
    return leaders.get(partition) or next(iter(leaders.values()))


def _drain(
    cluster: PartitionCluster,
    ledger: Ledger,
    produced: int,
    timeout_s: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Wait until every produced id was ACCEPTed (at most ``timeout_s``), then count."""
    progress(f"draining: {produced} records produced")
    deadline = time.monotonic() + timeout_s
    accepted: set[int] = set()
    while time.monotonic() < deadline:
        ledger.poll()
        accepted = {
            i for i, lines in ledger.lines.items() if any(e["o"] == "ACCEPT" for e in lines)
        }
        if len(accepted & set(range(1, produced + 1))) == produced:
            break
        for w in cluster.workers.values():  # a worker that died is restarted, and counted
            if w.incarnation and not w.alive():
                progress(f"  worker {w.name} exited; restarting it")
                with contextlib.suppress(Exception):
                    cluster.start_worker(w.name)
        time.sleep(0.5)
    accepts = Counter(i for i, lines in ledger.lines.items() for e in lines if e["o"] == "ACCEPT")
    lost = sorted(set(range(1, produced + 1)) - accepted)
    return {
        "records": produced,
        "lost": len(lost),
        "lost_sample": lost[:10],
        "duplicates": sum(n - 1 for n in accepts.values() if n > 1),
        "redelivered": sum(1 for lines in ledger.lines.values() if len(lines) > 1),
        **repeated_delivery_counts(ledger.lines),
    }


def repeated_delivery_counts(lines: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """The records a handler saw more than once with the same delivery count: two leaders
    handed the same record out (a semantics bug), unlike a redelivery, which counts up
    (KIP-932 "Delivery count"). ``lines``: the ledger's lines by record id (``dc``: the
    delivery count, ``p``: the partition).

    Returns:
        ``repeated_delivery_counts`` (how many records), ``repeated_by_partition`` and
        ``repeated_sample`` (up to 10 ids), for the JSON line.
    """
    repeated = sorted(
        i for i, seen in lines.items() if len({int(e["dc"]) for e in seen}) < len(seen)
    )
    by_partition = Counter(str(lines[i][0].get("p")) for i in repeated)
    return {
        "repeated_delivery_counts": len(repeated),
        "repeated_by_partition": dict(sorted(by_partition.items())),
        "repeated_sample": repeated[:10],
    }
