"""The nemesis of ``make partition-test``: each scenario cuts links while both ends live, holds
the cut, restores it, and measures how the group heals.

Every scenario returns one dict for the run's JSON line:

* ``name``, ``host`` (what was cut), ``cut_s`` (how long the cut lasted);
* ``heal_s``: from the link restored until the cut host's worker handled a record again (its
  member is back in the share group and fetching; ``null`` if it did not within the bound);
* ``stall_s``: the longest time, from the cut until healed, in which no worker handled any
  record (0-ish: the rest of the group kept making progress);
* the one-way case also gives ``lapsed_before_successor_s``: how long before the successor went
  live (``leader_live`` at a higher epoch) the cut leader's lease lapsed
  (``leader_lease_lapsed``); it must be positive.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from examples.chaos.ledger import Ledger
from examples.partition.lab import PartitionCluster
from queueflow.testing.logs import event_time

__all__ = ["Nemesis"]

#: How long after a restore a healed host gets to handle a record again (s).
HEAL_BOUND_S = 90.0


class Nemesis:
    """Cuts and restores links of a :class:`PartitionCluster` under load, measuring healing.

    Args:
        cluster: the running cluster.
        ledger: the handlers' ledger (:class:`examples.chaos.ledger.Ledger`), polled here.
        progress: where to say what it does.
    """

    def __init__(
        self, cluster: PartitionCluster, ledger: Ledger, progress: Callable[[str], None] = print
    ) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.progress = progress
        #: (time, pid) of every handled record seen so far, in ledger order.
        self.handled: list[tuple[float, int]] = []

    def _poll(self) -> None:
        for record_id in self.ledger.poll():
            line = self.ledger.lines[record_id][-1]
            self.handled.append((float(line["t"]), int(line["pid"])))

    def _handled_by(self, name: str, after: float) -> float | None:
        pids = set(self.cluster.workers[name].pids)
        times = [t for t, pid in self.handled if pid in pids and t > after]
        return min(times) if times else None

    def _wait_handled(self, name: str, after: float, bound_s: float = HEAL_BOUND_S) -> float | None:
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            self._poll()
            seen = self._handled_by(name, after)
            if seen is not None:
                return seen
            time.sleep(0.2)
        return None

    def _stall(self, t0: float, t1: float) -> float:
        times = sorted(t for t, _ in self.handled if t0 <= t <= t1)
        edges = [t0, *times, t1]
        return max(b - a for a, b in itertools.pairwise(edges)) if times else t1 - t0

    def _live_after(self, partitions: set[int], epoch_above: int, bound_s: float) -> float | None:
        """When another worker went live on one of ``partitions`` at a higher leader epoch."""
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            for w in self.cluster.workers.values():
                for e in w.events("leader_live"):
                    if int(e["partition"]) in partitions and int(e["leader_epoch"]) > epoch_above:
                        return event_time(e)
            time.sleep(0.2)
        return None

    def _led_by(self, name: str) -> tuple[set[int], int]:
        """The partitions ``name`` leads now and their newest leader epoch."""
        parts, epoch = set(), -1
        for e in self.cluster.workers[name].events("leader_assigned"):
            if e.get("topic") == self.cluster.topic:
                parts, epoch = set(e.get("partitions") or []), int(e["leader_epoch"])
        return {int(p) for p in parts}, epoch

    def _finish(self, result: dict[str, Any], name: str, cut_at: float, restored: float) -> None:
        healed = self._wait_handled(name, restored)
        result["cut_s"] = round(restored - cut_at, 2)
        result["heal_s"] = None if healed is None else round(max(healed - restored, 0.0), 2)
        self._poll()
        result["stall_s"] = round(self._stall(cut_at, healed or time.time()), 2)
        self.progress(f"  {result}")

    # -- the scenarios ----------------------------------------------------------------------

    def one_way(self, name: str) -> dict[str, Any]:
        """Leader ``name`` can't reach the broker, its members still reach it (its packets to
        the broker are dropped): it must stop serving before its successor goes live."""
        lab, host = self.cluster.lab, self.cluster.workers[name].host
        led, epoch = self._led_by(name)
        self.progress(f"one-way: {name} leads {sorted(led)} (epoch {epoch}); dropping -> broker")
        cut_at = time.time()
        lab.drop(host, [lab.gateway])
        successor = self._live_after(led, epoch, 60.0)
        lapses = [
            event_time(e)
            for e in self.cluster.workers[name].events("leader_lease_lapsed")
            if event_time(e) >= cut_at
        ]
        lab.allow(host)
        restored = time.time()
        result: dict[str, Any] = {"name": "one_way", "host": name}
        result["lapsed_before_successor_s"] = (
            round(successor - lapses[0], 2) if successor is not None and lapses else None
        )
        self._finish(result, name, cut_at, restored)
        return result

    def member_leader(self, member: str, leader: str, hold_s: float = 10.0) -> dict[str, Any]:
        """The direct path between ``member`` and ``leader`` cut both ways for ``hold_s``;
        both still reach the broker (the member re-routes through the request topics)."""
        lab = self.cluster.lab
        a, b = self.cluster.workers[member].host, self.cluster.workers[leader].host
        self.progress(f"member-leader: cutting {member} <-> {leader} for {hold_s:g} s")
        cut_at = time.time()
        lab.cut_between(a, b)
        self._hold(hold_s)
        lab.join(a, b)
        restored = time.time()
        result: dict[str, Any] = {"name": "member_leader", "host": f"{member}<->{leader}"}
        self._finish(result, member, cut_at, restored)
        return result

    def isolate(self, name: str) -> dict[str, Any]:
        """Worker ``name`` cut from everything until a successor is live on its partitions."""
        lab, host = self.cluster.lab, self.cluster.workers[name].host
        led, epoch = self._led_by(name)
        self.progress(f"isolate: {name} (leads {sorted(led)}, epoch {epoch})")
        cut_at = time.time()
        lab.isolate(host)
        if led:
            self._live_after(led, epoch, 60.0)
        else:
            self._hold(self.cluster.session_timeout_s + 4)
        lab.reconnect(host)
        restored = time.time()
        result: dict[str, Any] = {"name": "isolate", "host": name}
        self._finish(result, name, cut_at, restored)
        return result

    def flapping(
        self, name: str, cycles: int = 6, down_s: float = 2.0, up_s: float = 2.0
    ) -> dict[str, Any]:
        """Worker ``name``'s link down ``down_s`` / up ``up_s``, ``cycles`` times."""
        lab, host = self.cluster.lab, self.cluster.workers[name].host
        self.progress(f"flapping: {name}, {cycles} x ({down_s:g} s down, {up_s:g} s up)")
        cut_at = time.time()
        for i in range(cycles):
            lab.isolate(host)
            self._hold(down_s)
            lab.reconnect(host)
            if i < cycles - 1:
                self._hold(up_s)
        restored = time.time()
        result: dict[str, Any] = {"name": "flapping", "host": name, "cycles": cycles}
        self._finish(result, name, cut_at, restored)
        return result

    def _hold(self, seconds: float) -> None:
        """Keep a cut for ``seconds`` (the nemesis' schedule), reading the ledger meanwhile."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self._poll()
            time.sleep(min(0.2, max(until - time.monotonic(), 0)))
