"""``make chaos-cluster``: the broker side of a chaos run on a 3-broker cluster.

:class:`ClusterNemesis` runs in its own thread beside the worker kills of :func:`run`: once
``broker_kill_at`` of the records are done it SIGKILLs one broker for good (a random one) and
waits until the controller has fenced it; once ``broker_roll_at`` are done it restarts the other
brokers one at a time, as a rolling restart does: controlled shutdown, ``broker_down_s`` seconds
down, start, and wait until every partition's replicas on live brokers are back in sync before
the next one. With one broker gone and another restarting, one replica of each partition is in
sync: below ``min.insync.replicas=2``, so every ``acks=all`` write (queueflow's changelogs,
requests and replies, Faust's offset commits) is refused with ``NOT_ENOUGH_REPLICAS`` until the
restarted broker has caught up; the workers must ride through that without losing an
acknowledgement.

The brokers it restarts are children of its thread (``die_with_parent``): the thread stays
alive until :meth:`ClusterNemesis.release`, called once the cluster is stopped.
"""

from __future__ import annotations

import contextlib
import datetime
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from examples.chaos.config import ChaosConfig
from examples.chaos.timeline import Event
from queueflow.devtools.broker.cluster import LocalCluster

__all__ = ["ClusterNemesis"]

#: Seconds the controller may take to fence a SIGKILLed broker (broker.session.timeout.ms is
#: 9 s; a loaded machine adds to it).
FENCE_TIMEOUT_S = 60.0
#: Seconds a restarted broker may take to serve and to have its replicas in sync again.
RESTART_TIMEOUT_S = 180.0


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(
        timespec="milliseconds"
    )


class ClusterNemesis:
    """Kill one broker for good, then roll-restart the others (module docstring).

    Args:
        cluster: the running cluster (3 brokers).
        config: the run's parameters (``broker_kill_at``, ``broker_roll_at``,
            ``broker_down_s``, ``seed``).
        progress: where progress lines go.
    """

    def __init__(
        self, cluster: LocalCluster, config: ChaosConfig, progress: Callable[[str], None]
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.progress = progress
        self.rng = random.Random(config.seed ^ 0x5EED)
        #: what happened to the brokers, in order (wall-clock times): kill, fenced, stop,
        #: start, in_sync; each with its node id.
        self.log: list[dict[str, Any]] = []
        self.error: str | None = None
        self.done = threading.Event()
        #: when the scenario ended (``time.time()``), None before
        self.done_at: float | None = None
        self._release = threading.Event()
        self._thread: threading.Thread | None = None
        self._events: list[Event] = []
        self._done_fraction: Callable[[], float] = lambda: 0.0

    def begin(self, events: list[Event], done_fraction: Callable[[], float]) -> None:
        """Start the thread; ``events`` gets the run's broker events, ``done_fraction`` says
        which fraction of the records has a terminal outcome."""
        self._events = events
        self._done_fraction = done_fraction
        self._thread = threading.Thread(target=self._main, name="cluster-nemesis", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Let the thread end (after the cluster is stopped: its brokers die with it)."""
        self._release.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def summary(self) -> dict[str, Any]:
        """The JSON line's ``cluster`` entry: brokers, what happened when, how long each
        restarted broker took to serve and to be in sync again."""
        return {
            "brokers": len(self.cluster.brokers),
            "scenario_completed": self.done.is_set() and self.error is None,
            "error": self.error,
            "broker_events": self.log,
        }

    def _note(self, kind: str, node: int, **extra: Any) -> float:
        t = time.time()
        self.log.append({"t": _iso(t), "kind": kind, "node": node, **extra})
        return t

    def _wait_fraction(self, fraction: float) -> bool:
        while not self._release.is_set():
            if self._done_fraction() >= fraction:
                return True
            time.sleep(0.2)
        return False

    def _main(self) -> None:
        try:
            self._scenario()
        except Exception as exc:  # reported in the summary; the run goes on
            self.error = repr(exc)
            self.progress(f"  cluster nemesis failed: {exc!r}")
        finally:
            self.done_at = time.time()
            self.done.set()
        self._release.wait()

    def _scenario(self) -> None:
        c, cfg = self.cluster, self.config
        if not self._wait_fraction(cfg.broker_kill_at):
            return
        victim = self.rng.choice([b.node_id for b in c.brokers])
        self.progress(f"  cluster: SIGKILL broker {victim} (for good)")
        t = self._note("kill", victim)
        self._events.append(Event(t, "broker_kill", detail=f"broker {victim}"))
        c.kill_broker(victim)
        deadline = time.monotonic() + FENCE_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a client may still try the dead broker
                if victim not in c.live_brokers():
                    break
            time.sleep(0.5)
        fenced = self._note("fenced", victim, after_s=round(time.time() - t, 1))
        self._events.append(Event(fenced, "broker_fenced", detail=f"broker {victim}"))
        if not self._wait_fraction(cfg.broker_roll_at):
            return
        for node in [b.node_id for b in c.brokers if b.node_id != victim]:
            self.progress(f"  cluster: rolling restart of broker {node}")
            t = self._note("stop", node)
            self._events.append(Event(t, "broker_stop", detail=f"broker {node}"))
            c.stop_broker(node)
            time.sleep(cfg.broker_down_s)
            c.start_broker(node, RESTART_TIMEOUT_S)
            started = self._note("start", node, down_s=round(time.time() - t, 1))
            self._events.append(Event(started, "broker_start", detail=f"broker {node}"))
            waited = c.wait_in_sync(RESTART_TIMEOUT_S)
            self._note("in_sync", node, after_start_s=round(waited, 1))
            self.progress(f"  cluster: broker {node} back and in sync after {waited:.1f} s")
