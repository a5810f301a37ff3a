"""The chaos run's worker processes: start, SIGKILL and restart them, wait for the leaders."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from examples.chaos.config import ROOT
from queueflow.testing import WorkerProcess, events, faust_worker_argv

__all__ = ["Worker", "stop_all", "wait_for_leaders"]

#: Seconds between two looks at the leaders' logs while they settle.
_SETTLE_POLL_S = 0.2


class Worker:
    """One worker slot: a ``faust worker`` process, restarted with the same data directory.

    Its output goes to ``<run_dir>/w<slot>.log`` (every incarnation, separated by marker lines;
    queueflow's events as JSON lines), its ledger to
    ``<run_dir>/ledger/w<slot>-<incarnation>.jsonl``.

    Args:
        slot: the slot number.
        role: ``QUEUEFLOW_ROLE`` of the process (``all``, ``leader`` or ``member``).
        run_dir: the run's directory.
        env: environment of every incarnation (the ``CHAOS_*`` parameters).
        log_level: Faust's ``-l``.
    """

    def __init__(
        self, slot: int, role: str, run_dir: Path, env: dict[str, str], log_level: str
    ) -> None:
        self.slot = slot
        self.role = role
        self.datadir = run_dir / f"w{slot}"
        self.log_path = run_dir / f"w{slot}.log"
        self.ledger_dir = run_dir / "ledger"
        self.env = env
        self.log_level = log_level
        self.incarnation = 0
        self.started_at = 0.0
        argv = faust_worker_argv(
            "examples.chaos.app", self.datadir, loglevel=log_level, without_web=True
        )
        self.worker = WorkerProcess(argv, self.log_path, env, cwd=ROOT)

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The process of the latest incarnation."""
        return self.worker.process

    @property
    def pid(self) -> int | None:
        return self.worker.pid

    def alive(self) -> bool:
        return self.worker.alive()

    def start(self) -> None:
        """Start the next incarnation (without waiting for it to be ready)."""
        self.incarnation += 1
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        env = {
            "QUEUEFLOW_ROLE": self.role,
            "PYTHONUNBUFFERED": "1",
            "CHAOS_LEDGER": str(self.ledger_dir / f"w{self.slot}-{self.incarnation}.jsonl"),
        }
        header = (
            f"\n===== chaos: slot {self.slot} role {self.role} incarnation "
            f"{self.incarnation} at {time.time():.3f} ====="
        )
        self.worker.start(env, header=header)
        # Which process wrote the lines that follow (see analysis.worker_log_events).
        with open(self.log_path, "ab") as log:
            log.write(f"===== chaos: slot {self.slot} pid {self.pid} =====\n".encode())
        self.started_at = time.monotonic()

    def kill(self) -> None:
        """SIGKILL and reap the current incarnation (if alive)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.worker.kill()

    def terminate(self) -> None:
        """SIGTERM the current incarnation (if alive), without waiting."""
        self.worker.terminate()


def wait_for_leaders(
    leaders: Sequence[Worker],
    topic: str,
    partitions: int,
    progress: Callable[[str], None],
    timeout_s: float = 90.0,
) -> None:
    """Wait until every leader-role worker has logged ``leader_assigned`` for one Faust
    generation and together they lead all ``partitions`` of ``topic`` (the Faust group has
    settled). Raises RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        latest: dict[int, tuple[int, set[int]]] = {}
        for w in leaders:
            for event in events(w.log_path, "leader_assigned"):
                if event.get("topic") == topic:
                    parts = {int(p) for p in event.get("partitions") or []}
                    latest[w.slot] = (int(event["leader_epoch"]), parts)
        epochs = {epoch for epoch, _ in latest.values()}
        covered = set().union(*(parts for _, parts in latest.values())) if latest else set()
        if len(latest) == len(leaders) and len(epochs) == 1 and covered == set(range(partitions)):
            progress(f"leaders settled in Faust generation {epochs.pop()}")
            return
        time.sleep(_SETTLE_POLL_S)
    raise RuntimeError(f"the leader workers did not settle into one generation in {timeout_s} s")


def stop_all(workers: Sequence[Worker], timeout_s: float = 20.0) -> None:
    """SIGTERM every worker, SIGKILL those still alive after ``timeout_s``."""
    for w in workers:
        with contextlib.suppress(Exception):
            w.terminate()
    deadline = time.monotonic() + timeout_s
    for w in workers:
        if w.process is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        with contextlib.suppress(Exception):
            w.kill()
