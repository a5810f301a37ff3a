"""The membership lease on a real broker with workers on separate hosts (network namespaces):
a leader whose packets to the broker are dropped, while its members still reach it, keeps its
event loop, loses its Faust group membership, and must stop serving before its successor goes
live; nothing is lost. ``make partition-test`` runs the long scenarios (docs/operations.md
"Network partitions"). Needs root (network namespaces)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.chaos.ledger import Ledger
from examples.partition.lab import PartitionCluster
from queueflow.devtools.netns import available, sweep
from queueflow.testing import produce
from queueflow.testing.logs import event_time

RECORDS = 400
ROLES = {"w1": "all", "w2": "all", "m1": "member"}


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PartitionCluster]:
    why = available()
    assert why is None, f"this test needs network namespaces: {why}"
    c = PartitionCluster(tmp_path, ROLES, partitions=2, session_timeout_s=5.0, progress=print)
    tag = c.lab.tag
    request.addfinalizer(lambda: sweep(tag))  # even if close() itself failed
    request.addfinalizer(c.close)
    c.start()
    yield c


def _accepted(ledger: Ledger) -> set[int]:
    ledger.poll()
    return {i for i, lines in ledger.lines.items() if any(e["o"] == "ACCEPT" for e in lines)}


def _wait(condition: object, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def test_a_leader_cut_off_from_the_broker_stops_serving_before_its_successor_serves(
    cluster: PartitionCluster,
) -> None:
    for name in ("w1", "w2"):
        cluster.start_worker(name)
    cluster.wait_settled(["w1", "w2"], timeout_s=60)
    cluster.start_worker("m1")
    ids = [str(i) for i in range(1, RECORDS + 1)]  # 0 would be the chaos app's poison
    asyncio.run(produce(cluster.bootstrap, cluster.topic, ids, keys=ids, partitions=2))
    ledger = Ledger(cluster.run_dir / "ledger")
    _wait(lambda: len(_accepted(ledger)) >= RECORDS // 4, "records handled before the cut", 30)

    name = cluster.leaders()[0]
    cut = cluster.workers[name]
    assigned = [e for e in cut.events("leader_assigned") if e.get("topic") == cluster.topic]
    led = {int(p) for p in assigned[-1].get("partitions") or []}
    epoch = int(assigned[-1]["leader_epoch"])
    cut_at = time.time()
    cluster.lab.drop(cut.host, [cluster.lab.gateway])  # its members still reach it
    successor: list[float] = []

    def successor_live() -> bool:
        for other in cluster.workers.values():
            for e in other.events("leader_live") if other is not cut else []:
                if int(e["partition"]) in led and int(e["leader_epoch"]) > epoch:
                    successor.append(event_time(e))
        return bool(successor)

    _wait(successor_live, "a successor live on the cut leader's partitions", 40)
    lapsed = [event_time(e) for e in cut.events("leader_lease_lapsed") if event_time(e) > cut_at]
    assert cut.alive(), "the cut leader must live on (a partition, not a crash)"
    assert lapsed, f"{name} never logged leader_lease_lapsed while cut off"
    assert lapsed[0] < min(successor), (
        f"{name} served until {lapsed[0]:.3f}, its successor from {min(successor):.3f}"
    )
    cluster.lab.allow(cut.host)
    _wait(lambda: len(_accepted(ledger)) == RECORDS, "every record ACCEPTed after the heal", 60)
    assert _accepted(ledger) == set(range(1, RECORDS + 1))
