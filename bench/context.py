"""What every benchmark scenario shares: the run's context, its constants, error capture."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import ROOT

__all__ = [
    "MEMBER_SETTINGS",
    "RECORD_SIZE",
    "RESULTS",
    "S1_PARTITIONS",
    "S1_PROCESSES",
    "S2_FAUST_LAYOUTS",
    "S2_LAYOUTS",
    "S2_SECONDS",
    "STALL_S",
    "Context",
    "guarded",
]

RESULTS = ROOT / "bench" / "results"
RECORD_SIZE = 1024
S1_PARTITIONS = 4
S1_PROCESSES = 4
#: S2 layouts: consumers -> (processes, handler concurrency per process).
S2_LAYOUTS = {1: (1, 1), 2: (2, 1), 4: (4, 1), 8: (4, 2), 16: (4, 4), 32: (4, 8)}
#: S2 plain Faust comparison: consumers -> (worker processes, agent concurrency per worker).
S2_FAUST_LAYOUTS = {1: (1, 1), 4: (4, 1), 32: (4, 8)}
S2_SECONDS = 6.0  # records per S2 run = what n ideal consumers finish in this many seconds
#: A run in which nothing finishes for this many seconds is given up (and reported).
STALL_S = 25.0
MEMBER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.heartbeat.interval.ms": 1000,
    "group.share.session.timeout.ms": 15000,
}


@dataclass
class Context:
    bootstrap: str
    run_dir: Path
    args: argparse.Namespace
    started: float = field(default_factory=time.monotonic)
    results: dict[str, Any] = field(default_factory=dict)
    #: seconds kept for the scenarios still to run (set by main before each scenario).
    reserve: float = 0.0
    #: pid of the broker JVM when this run started it (its CPU is reported per variant).
    broker_pid: int | None = None

    def remaining(self) -> float:
        """Seconds this scenario may still use: the budget left minus what later scenarios need."""
        return self.args.budget - (time.monotonic() - self.started) - self.reserve

    def timeout(self, wanted: float, floor: float = 20.0) -> float:
        """``wanted``, cut down to what the budget leaves (never below ``floor``)."""
        return max(min(wanted, self.remaining()), floor)

    def affordable(self, seconds: float, what: str, out: dict[str, Any]) -> bool:
        """True if ``seconds`` fit in the budget; otherwise record ``what`` as skipped."""
        if self.remaining() >= seconds:
            return True
        out.setdefault("skipped", []).append(f"{what} (budget: {self.remaining():.0f} s left)")
        self.say(f"skipping {what}: {self.remaining():.0f} s of budget left")
        return False

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:6.1f}s] {text}", flush=True)

    def uid(self, prefix: str) -> str:
        return f"bench-{prefix}-{uuid.uuid4().hex[:6]}"


def guarded(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one scenario; an exception becomes ``{"error", "traceback"}`` in the results and is
    printed, so that a failed scenario is never just an empty table row."""
    try:
        return run()
    except Exception as exc:
        tb = traceback.format_exc()
        print(f"scenario failed: {exc!r}\n{tb}", file=sys.stderr, flush=True)
        return {"error": repr(exc)[:500], "traceback": tb[-2000:]}
