"""Worker processes for integration tests, benchmarks and chaos runs against a real broker.

* :class:`WorkerProcess`: any subprocess (typically ``faust ... worker``) whose output is
  appended to a log file; start it with extra environment, wait for Faust's ``[^Worker]: Ready``
  line, SIGTERM / SIGKILL / SIGSTOP it, read its log and its queueflow JSON events.
* :class:`LeaderWorker`: a leader-only queueflow worker (``queueflow leader``) built on it.
  Start it, point :class:`~queueflow.ShareConsumer` or share agents at the same app id, stop or
  kill it.

Every process started here gets ``QUEUEFLOW_LOG_FORMAT=json`` (unless ``json_logs=False``), so
tools read queueflow's events with :func:`queueflow.testing.events` instead of regexes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from queueflow.devtools.broker import find_free_ports
from queueflow.devtools.children import parent_death_signal
from queueflow.settings import SETTINGS
from queueflow.testing.logs import JSON_LOG_ENV, events

__all__ = ["READY_LINE", "LeaderWorker", "WorkerProcess", "faust_worker_argv"]

#: What a Faust worker logs once it is ready (tables recovered, agents started).
READY_LINE = "[^Worker]: Ready"
_W = TypeVar("_W", bound="WorkerProcess")

#: Seconds between two looks at the log while waiting for :data:`READY_LINE`.
_READY_POLL_S = 0.2


def faust_worker_argv(
    app: str,
    datadir: Path,
    *,
    loglevel: str = "info",
    web_port: int | None = None,
    without_web: bool = False,
) -> list[str]:
    """``python -m faust -A <app> --datadir <datadir> worker -l <loglevel> ...``.

    Args:
        app: the Faust app's module (``-A``), e.g. ``"examples.chaos.app"``.
        datadir: Faust's data directory (RocksDB tables).
        loglevel: ``-l`` (``info`` avoids Faust's spinner, which sets the root logger to DEBUG).
        web_port: ``--web-port``; None picks a free port (unless ``without_web``).
        without_web: ``--without-web`` instead of a web port.
    """
    argv = [sys.executable, "-m", "faust", "-A", app, "--datadir", str(datadir), "worker"]
    argv += ["-l", loglevel]
    if without_web:
        return [*argv, "--without-web"]
    if web_port is None:
        (web_port,) = find_free_ports(1)
    return [*argv, "--web-port", str(web_port)]


class WorkerProcess:
    """A subprocess whose stdout and stderr are appended to ``log_path``.

    Args:
        argv: the command line.
        log_path: the log file (appended to; its parent is created).
        env: environment on top of ``os.environ`` (and of ``QUEUEFLOW_LOG_FORMAT=json``).
        cwd: working directory of the process (default: this process's).
        json_logs: set ``QUEUEFLOW_LOG_FORMAT=json`` (an ``env`` entry still wins).
        die_with_parent: on Linux, the process gets SIGTERM (a graceful stop) when the thread
            that started it dies, even by SIGKILL, so an interrupted test session or example
            run leaves no worker behind (see :mod:`queueflow.devtools.children`). Start it from
            a thread that lives as long as the worker should (the main thread).
    """

    READY_LINE = READY_LINE

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        *,
        cwd: Path | None = None,
        json_logs: bool = True,
        die_with_parent: bool = True,
    ) -> None:
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env: dict[str, str] = dict(env or {})
        self.cwd = cwd
        self.json_logs = json_logs
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None
        #: Byte offset of the log where the latest start began.
        self.log_start = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self: _W, env: Mapping[str, str] | None = None, header: str | None = None) -> _W:
        """Launch the process (without waiting for it to be ready); returns ``self``.

        Args:
            env: environment for this start only, on top of the constructor's.
            header: a line written to the log just before the launch (a run marker).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ)
        if self.json_logs:
            full_env.update(JSON_LOG_ENV)
        full_env.update(self.env)
        full_env.update(env or {})
        self.log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            if header is not None:
                log.write(f"{header}\n".encode())
                log.flush()
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=parent_death_signal() if self.die_with_parent else None,
            )
        return self

    def wait_ready(self, timeout_s: float = 90.0, what: str = "worker") -> None:
        """Wait until the log shows :attr:`READY_LINE` after the latest start.

        Raises:
            RuntimeError: the process exited, or was not ready within ``timeout_s`` seconds
                (then it is killed); the message has the end of its log.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"{what} exited with {code}:\n{self.log_tail()}")
            if self.READY_LINE in self.log_text():
                return
            time.sleep(_READY_POLL_S)
        self.kill()
        raise RuntimeError(f"{what} not ready within {timeout_s} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int | None:
        """The process id of the latest start, or None before the first."""
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        """True if started and not exited."""
        return self.process is not None and self.process.poll() is None

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` if the process is alive (a race with its exit is ignored)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: the process freezes (a GC pause or a VM freeze, as the group sees it)."""
        self.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self.send_signal(signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM without waiting (a graceful shutdown starts)."""
        self.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGCONT (if paused) and SIGTERM, then SIGKILL after ``timeout_s`` seconds."""
        if self.alive():
            assert self.process is not None
            self.resume()
            self.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self, timeout_s: float = 30.0) -> None:
        """SIGKILL (a crash: nothing is flushed) and reap it within ``timeout_s`` seconds.

        Raises:
            subprocess.TimeoutExpired: it was not reaped in time (should not happen).
        """
        if self.alive():
            assert self.process is not None
            self.process.kill()
            self.process.wait(timeout=timeout_s)

    # -- output ------------------------------------------------------------------------------

    def log_text(self) -> str:
        """Everything the process logged since its latest :meth:`start`."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the whole log (all starts)."""
        try:
            text = self.log_path.read_bytes().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(text[-lines:])

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """queueflow's JSON log events since the latest start (see :func:`events`)."""
        return events(self.log_path, name, offset=self.log_start)


class LeaderWorker:
    """A ``queueflow leader`` process: share-group coordinator and share-partition leaders.

    A :class:`WorkerProcess` (:attr:`worker`) with the ``queueflow leader`` command line; its
    signals and log methods are available here too.

    Args:
        app_id: the app id members use.
        topics: source topics to lead (they must exist).
        bootstrap: ``host:port`` of the cluster.
        datadir: Faust data directory (RocksDB); a new one forces recovery from the changelogs.
        settings: share-group settings by KIP-932 name, e.g.
            ``{"group.share.record.lock.duration.ms": 2000}``.
        log_path: where the worker's output goes (default ``datadir`` with suffix ``.log``).
        env: extra environment variables, e.g. Faust's ``BROKER_SESSION_TIMEOUT`` (s).
    """

    READY_LINE = READY_LINE

    def __init__(
        self,
        app_id: str,
        topics: Sequence[str],
        bootstrap: str,
        datadir: Path,
        settings: Mapping[str, int | str] | None = None,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.app_id = app_id
        self.topics = list(topics)
        self.bootstrap = bootstrap
        self.datadir = Path(datadir)
        self.settings = dict(settings or {})
        self.log_path = log_path or self.datadir.with_suffix(".log")
        by_name = {s.name: s for s in SETTINGS}
        worker_env = {by_name[name].env: str(value) for name, value in self.settings.items()}
        worker_env.update(env or {})
        self.worker = WorkerProcess([], self.log_path, worker_env)

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The process of the latest start, or None before the first."""
        return self.worker.process

    def start(self, timeout_s: float = 90.0) -> LeaderWorker:
        """Start the worker and wait until Faust reports it ready (tables recovered).

        Args:
            timeout_s: seconds to wait for readiness.

        Raises:
            RuntimeError: the worker exited or wasn't ready within ``timeout_s``; the message
                has the end of its log.
        """
        self.launch()
        self.worker.wait_ready(timeout_s, what="leader worker")
        return self

    def launch(self) -> LeaderWorker:
        """Start the worker process without waiting for it (see :meth:`start`)."""
        self.datadir.parent.mkdir(parents=True, exist_ok=True)
        (web_port,) = find_free_ports(1)  # a fresh web port per start
        #: The web port of the latest start (``/metrics``, the dashboard at ``/queueflow/``).
        self.web_port = web_port
        argv = [sys.executable, "-m", "queueflow", "leader", "--app", self.app_id]
        argv += ["--broker", f"kafka://{self.bootstrap}", "--datadir", str(self.datadir)]
        argv += ["--web-port", str(web_port), "-l", "info"]
        for topic in self.topics:
            argv += ["--topic", topic]
        self.worker.argv = argv
        self.worker.start()
        return self

    def log_text(self) -> str:
        """Everything the worker logged since its last :meth:`start`."""
        return self.worker.log_text()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the worker's log."""
        return self.worker.log_tail(lines)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """queueflow's JSON log events since the last :meth:`start`."""
        return self.worker.events(name)

    def pause(self) -> None:
        """SIGSTOP: the process freezes (a GC pause or a VM freeze, as the group sees it)."""
        self.worker.pause()

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self.worker.resume()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s`` seconds."""
        self.worker.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is flushed)."""
        self.worker.kill()

    def __enter__(self) -> LeaderWorker:
        if not self.worker.alive():
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
