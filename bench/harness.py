"""Plumbing shared by the benchmark driver (``bench.suite``) and its worker processes.

Worker side (runs inside every consumer process):

* :class:`Stats` holds the process's counters and a daemon thread that rewrites them, as one JSON
  object, to ``$BENCH_STATS`` every 250 ms (atomically: write + rename) and once more at exit. The
  driver reads these files; it never relies on consumer-group lag.
* :func:`go` / :func:`wait_go`: every consumer waits for the driver's go-file before it consumes,
  so all of them start together once they have joined their group.

Driver side:

* :class:`Worker` / :class:`Fleet`: subprocesses with their stats files, always killed in
  ``finally`` (SIGTERM, then SIGKILL);
* :func:`produce`: N records of a fixed size, round-robin over partitions (librdkafka);
* :func:`payload`: a record value whose first 8 bytes are the produce time (``time.time()``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from queueflow.testing import WorkerProcess

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
_STAMP = struct.Struct(">d")


# --------------------------------------------------------------------------------------------
# worker side
# --------------------------------------------------------------------------------------------


class Stats:
    """Counters of one consumer process, mirrored to a JSON file by a daemon thread.

    Attributes:
        done: records finished (acknowledged ACCEPT/REJECT, or consumed for plain consumers).
        released: records acknowledged RELEASE (delivered again later).
        delivered: records handed to the handler (deliveries, redeliveries included).
        first: wall-clock time of the first delivery (``time.time()``), or None.
        last: wall-clock time of the last finished record (acknowledgement answered / consumed).
        probe: optional callable returning extra fields (e.g. the assignment), called by the
            writer thread.
    """

    def __init__(self, path: str | None = None, interval_s: float = 0.25) -> None:
        self.path = path if path is not None else os.environ.get("BENCH_STATS")
        self.interval_s = interval_s
        self.done = 0
        self.released = 0
        self.delivered = 0
        self.first: float | None = None
        self.last: float | None = None
        self.probe: Callable[[], dict[str, Any]] | None = None
        self.on_stop_file: Callable[[], None] | None = None
        self.extra: dict[str, Any] = {}
        go_path = os.environ.get("BENCH_GO")
        self._stop_path = f"{go_path}.stop" if go_path else None
        self._quiet_path = f"{go_path}.quiet" if go_path else None
        self._stopped = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if self.path:
            atexit.register(self.flush)

    def start(self) -> Stats:
        if self.path and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="bench-stats", daemon=True)
            self._thread.start()
        return self

    def delivery(self, now: float | None = None) -> None:
        self.delivered += 1
        if self.first is None:
            self.first = time.time() if now is None else now

    def snapshot(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "pid": os.getpid(),
            "done": self.done,
            "released": self.released,
            "delivered": self.delivered,
            "first": self.first,
            "last": self.last,
            "written": time.time(),
        }
        if self.probe is not None:
            with contextlib.suppress(Exception):
                body.update(self.probe())
        body.update(self.extra)
        return body

    def flush(self) -> None:
        if not self.path:
            return
        with self._lock:
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.snapshot(), f)
            os.replace(tmp, self.path)

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval_s)
            if not self._stopped and self._stop_path and os.path.exists(self._stop_path):
                self._stopped = True
                if self.on_stop_file is not None:
                    with contextlib.suppress(Exception):
                        self.on_stop_file()
                self.extra["stopped"] = True
            if self._quiet_path and os.path.exists(self._quiet_path):
                continue  # the driver measures idle CPU: these writes would be most of it
            with contextlib.suppress(Exception):
                self.flush()


def go(path: str | None = None) -> bool:
    """True once the driver has created the go-file (``$BENCH_GO``); no file configured: True."""
    path = path if path is not None else os.environ.get("BENCH_GO")
    return not path or os.path.exists(path)


async def wait_go(path: str | None = None, timeout_s: float = 600) -> None:
    """Wait (asynchronously) for the go-file."""
    deadline = time.monotonic() + timeout_s
    while not go(path) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


def stamp_of(value: bytes) -> float:
    """The produce time embedded by :func:`payload`."""
    return float(_STAMP.unpack_from(value)[0])


# --------------------------------------------------------------------------------------------
# driver side
# --------------------------------------------------------------------------------------------


def payload(size: int, now: float | None = None) -> bytes:
    """A record value of ``size`` bytes whose first 8 hold ``now`` (default ``time.time()``)."""
    head = _STAMP.pack(time.time() if now is None else now)
    return head + b"x" * max(size - len(head), 0)


def produce(
    bootstrap: str, topic: str, count: int, size: int, partitions: int, timeout_s: float = 300
) -> float:
    """Produce ``count`` records of ``size`` bytes, round-robin over ``partitions``.

    Returns:
        Seconds it took.

    Raises:
        RuntimeError: not every record was acknowledged within ``timeout_s``.
    """
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 512 * 1024,
            "queue.buffering.max.messages": 200_000,
            "acks": 1,
            "compression.type": "none",
        }
    )
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    started = time.monotonic()
    deadline = started + timeout_s
    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic, payload(size), partition=i % partitions, on_delivery=on_delivery
                )
                break
            except BufferError:
                # librdkafka's queue is full: serve delivery reports until there is room.
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"produce to {topic}: queue still full after {timeout_s} s"
                    ) from None
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(timeout_s)
    if left or failed:
        raise RuntimeError(f"produce to {topic}: {left} unacknowledged, errors {failed[:3]}")
    return time.monotonic() - started


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes (Linux ``/proc``), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds used so far by ``pid`` (Linux ``/proc``), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Worker(WorkerProcess):
    """A benchmark subprocess: its argv, environment, log file and stats file.

    A :class:`queueflow.testing.WorkerProcess` run from the repository root (so queueflow's
    events are JSON lines in its log), plus the stats file it reports to (``BENCH_STATS``).
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str], run_dir: Path) -> None:
        super().__init__(argv, run_dir / f"{name}.log", env, cwd=ROOT)
        self.name = name
        self.stats_path = run_dir / f"{name}.stats.json"
        self.env.setdefault("BENCH_STATS", str(self.stats_path))
        self.cpu_at_go: float | None = None

    @property
    def pid(self) -> int:  # type: ignore[override]
        assert self.process is not None
        return self.process.pid

    def stats(self) -> dict[str, Any]:
        return read_json(self.stats_path) or {}

    def log_tail(self, lines: int = 25) -> str:
        return super().log_tail(lines)

    def signal(self, sig: int) -> None:
        self.send_signal(sig)

    def reap(self, timeout_s: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)


class Fleet:
    """The processes of one benchmark variant; leaving the ``with`` block stops them all."""

    def __init__(self, run_dir: Path, stop_timeout_s: float = 8.0) -> None:
        self.run_dir = run_dir
        self.stop_timeout_s = stop_timeout_s
        self.workers: list[Worker] = []
        self.go_path = run_dir / "go"
        run_dir.mkdir(parents=True, exist_ok=True)
        for path in (self.go_path, Path(f"{self.go_path}.stop"), self.quiet_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def add(self, name: str, argv: list[str], env: dict[str, str]) -> Worker:
        env = dict(env, BENCH_GO=str(self.go_path))
        worker = Worker(name, argv, env, self.run_dir)
        self.workers.append(worker)
        return worker.start()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``: the later workers (members) first,
        then the first one (the leader, when there is one), so members can still leave."""
        for group in (self.workers[1:], self.workers[:1]):
            for w in group:
                w.signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_s
            for w in group:
                w.reap(max(deadline - time.monotonic(), 0.1))

    def go(self) -> float:
        """Create the go-file; returns the wall-clock time it was created."""
        for w in self.workers:
            w.cpu_at_go = cpu_seconds(w.pid)
        now = time.time()
        self.go_path.write_text(str(now))
        return now

    @property
    def quiet_path(self) -> Path:
        """While this file exists, workers write no stats (see :meth:`quiet`)."""
        return Path(f"{self.go_path}.quiet")

    def quiet(self, on: bool) -> float:
        """Stop (``on``) or resume the workers' stats writes, which cost more CPU than an idle
        worker; returns the wall-clock time of the switch."""
        if on:
            self.quiet_path.write_text("")
        else:
            with contextlib.suppress(FileNotFoundError):
                self.quiet_path.unlink()
        return time.time()

    def request_stop(self) -> None:
        """Create the stop-file: workers run their final hook (e.g. write samples) and report
        ``stopped``."""
        Path(f"{self.go_path}.stop").write_text(str(time.time()))

    def stats(self) -> list[dict[str, Any]]:
        return [w.stats() for w in self.workers]

    def dead(self) -> list[Worker]:
        return [w for w in self.workers if not w.alive()]

    def wait(
        self,
        condition: Callable[[list[dict[str, Any]]], bool],
        timeout_s: float,
        interval_s: float = 0.1,
        members: Iterable[Worker] | None = None,
    ) -> bool:
        """Poll the stats files until ``condition(stats)`` or the timeout (or a worker died).

        Returns:
            True if the condition was met.
        """
        chosen = list(members) if members is not None else self.workers
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition([w.stats() for w in chosen]):
                return True
            if any(not w.alive() for w in chosen):
                return False
            time.sleep(interval_s)
        return condition([w.stats() for w in chosen])

    def cpu_since_go(self) -> dict[str, float]:
        out = {}
        for w in self.workers:
            now = cpu_seconds(w.pid)
            if now is not None and w.cpu_at_go is not None:
                out[w.name] = round(now - w.cpu_at_go, 2)
        return out


def total(stats: list[dict[str, Any]], key: str = "done") -> int:
    return sum(int(s.get(key) or 0) for s in stats)


def span(stats: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(earliest first delivery, latest finished record) over the processes."""
    firsts = [s["first"] for s in stats if s.get("first")]
    lasts = [s["last"] for s in stats if s.get("last")]
    return (min(firsts) if firsts else None, max(lasts) if lasts else None)


def percentiles(samples: list[float], points: Iterable[float] = (50, 99, 99.9)) -> dict[str, Any]:
    """Nearest-rank percentiles of ``samples`` (any unit), keyed ``p50``, ``p99``, ``p999``."""
    out: dict[str, Any] = {"count": len(samples)}
    ordered = sorted(samples)
    for p in points:
        key = "p" + f"{p:g}".replace(".", "")
        if not ordered:
            out[key] = None
            continue
        rank = max(round(p / 100 * len(ordered) + 0.5) - 1, 0)
        out[key] = ordered[min(rank, len(ordered) - 1)]
    return out


@contextlib.contextmanager
def timed() -> Iterator[Callable[[], float]]:
    started = time.monotonic()
    yield lambda: time.monotonic() - started
