"""py-spy profiles of the queueflow processes during S1(a), summarised by component."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from bench import harness
from bench.context import Context
from bench.harness import PYTHON, Fleet

__all__ = ["COMPONENTS", "finish_profilers", "start_profilers", "summarize_profile"]


def start_profilers(
    ctx: Context, fleet: Fleet, name: str, leader: harness.Worker | None
) -> list[Any]:
    """py-spy on the leader (or the ``all`` worker) and one member, ``--gil``: only samples of
    threads holding the GIL, so time spent runnable but waiting for a CPU (2 cores, shared with
    the broker) or for I/O is not counted as work."""
    pyspy = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
    if not Path(pyspy).exists():
        return []
    workers = ([leader] if leader is not None else []) + fleet.workers
    targets = [(w.name, w.pid) for w in workers[:2]]
    procs = []
    for label, pid in targets:
        # raw (collapsed stacks, flamegraph.pl input) for the tables, and an SVG flame graph
        for fmt, suffix in (("raw", "pyspy.txt"), ("flamegraph", "pyspy.svg")):
            out = ctx.run_dir / f"{name}-{label}.{suffix}"
            argv = [
                pyspy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                "100",
                "--nonblocking",
                "--gil",
                "--full-filenames",
                "--format",
                fmt,
                "--output",
                str(out),
                "--duration",
                str(int(ctx.args.profile_seconds)),
            ]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append((label if fmt == "raw" else None, out, proc))
    return procs


def finish_profilers(procs: list[Any]) -> dict[str, Any]:
    out = {}
    for _label, _path, proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
    for label, path, proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if label is not None:
            out[label] = summarize_profile(path) if path.exists() else {"error": "no profile"}
    return out


#: Where time goes, by the file of a frame: (component, path fragment). The first match wins for
#: self time (leaf frame); inclusive time counts a sample once per component on its stack.
COMPONENTS = (
    ("JSON encode/decode", "/json/"),
    ("structlog", "/structlog/"),
    ("logging (stdlib)", "/logging/"),
    ("prometheus_client", "/prometheus_client/"),
    ("RocksDB store (faust/stores, rocksdict)", "/faust/stores/"),
    ("RocksDB store (faust/stores, rocksdict)", "/rocksdict/"),
    ("Faust streams/conductor/consumer", "/faust/"),
    ("mode (Faust's service lib)", "/mode/"),
    ("aiokafka consumer (fetch, parse)", "/aiokafka/consumer/"),
    ("aiokafka producer", "/aiokafka/producer/"),
    ("aiokafka client/conn/protocol", "/aiokafka/"),
    ("queueflow engine (share/)", "/queueflow/share/"),
    ("queueflow", "/queueflow/"),
    ("asyncio event loop, tasks, selectors", "/asyncio/"),
    ("asyncio event loop, tasks, selectors", "/selectors.py"),
    ("threading (stats thread wakeups)", "/threading.py"),
    ("bench harness (stats thread)", "/bench/"),  # self time only: its wrappers time queueflow
)


_DISPATCH = ("Handle._run ", "BaseEventLoop._run_once ", "Thread.run ")


def _component(frame: str) -> str:
    for name, fragment in COMPONENTS:
        if fragment in frame:
            return name
    return "other"


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and total sample counts per function and per component from py-spy's raw
    (collapsed, flamegraph.pl-compatible) output."""
    self_counts: dict[str, int] = {}
    total_counts: dict[str, int] = {}
    comp_self: dict[str, int] = {}
    comp_total: dict[str, int] = {}
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ")]
        if frames and frames[0].startswith("thread "):
            frames = frames[1:]
        samples += count
        if not frames:
            continue
        leaf = _frame_name(frames[-1])
        self_counts[leaf] = self_counts.get(leaf, 0) + count
        for name in {_frame_name(f) for f in frames}:
            total_counts[name] = total_counts.get(name, 0) + count
        leaf_component = _component(frames[-1])
        comp_self[leaf_component] = comp_self.get(leaf_component, 0) + count
        # Inclusive: only frames below the event loop's dispatch of a callback, so the process's
        # bootstrap (runpy, click, faust.cli, mode.worker, run_forever) counts for nothing.
        dispatch = [i for i, f in enumerate(frames) if f.startswith(_DISPATCH)]
        below = frames[dispatch[-1] + 1 :] if dispatch else frames
        for name in {_component(f) for f in below} - {"bench harness (stats thread)"}:
            comp_total[name] = comp_total.get(name, 0) + count

    def table(counts: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(100 * c / max(samples, 1), 1)) for name, c in ranked]

    return {
        "samples": samples,
        "file": str(path),
        "self_pct": table(self_counts),
        "total_pct": table(total_counts),
        "component_self_pct": table(comp_self),
        "component_inclusive_pct": table(comp_total),
    }


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``; py-spy's own idle marker kept."""
    func, _, where = frame.partition(" (")
    where = where.rstrip(")")
    file = where.rsplit(":", 1)[0]
    match = re.search(r"(?:site-packages|lib/python\d+\.\d+)/(.*)$", file)
    short = match.group(1) if match else "/".join(Path(file).parts[-2:])
    return f"{func} ({short})"
