"""Worker processes for integration tests against a real broker.

* :class:`LeaderWorker`: a leader-only queueflow worker in a subprocess (``queueflow leader``),
  for integration tests against a real broker. Start it, point
  :class:`~queueflow.ShareConsumer` or share agents at the same app id, stop or kill it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from queueflow.devtools.broker import find_free_ports
from queueflow.settings import SETTINGS


class LeaderWorker:
    """A ``queueflow leader`` process: share-group coordinator and share-partition leaders.

    Args:
        app_id: the app id members use.
        topics: source topics to lead (they must exist).
        bootstrap: ``host:port`` of the cluster.
        datadir: Faust data directory (RocksDB); a new one forces recovery from the changelogs.
        settings: share-group settings by KIP-932 name, e.g.
            ``{"group.share.record.lock.duration.ms": 2000}``.
        log_path: where the worker's output goes (default ``datadir/worker.log``).
        env: extra environment variables, e.g. Faust's ``BROKER_SESSION_TIMEOUT`` (s).
    """

    READY_LINE = "[^Worker]: Ready"

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
        self.process: subprocess.Popen[bytes] | None = None
        self.extra_env = dict(env or {})
        self._log_start = 0

    def _env(self) -> dict[str, str]:
        by_name = {s.name: s for s in SETTINGS}
        env = dict(os.environ)
        for name, value in self.settings.items():
            env[by_name[name].env] = str(value)
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 90.0) -> LeaderWorker:
        """Start the worker and wait until Faust reports it ready (tables recovered).

        Raises:
            RuntimeError: the worker exited or wasn't ready within ``timeout_s``; the message
                has the end of its log.
        """
        self.datadir.parent.mkdir(parents=True, exist_ok=True)
        (web_port,) = find_free_ports(1)
        argv = [
            sys.executable,
            "-m",
            "queueflow",
            "leader",
            "--app",
            self.app_id,
            "--broker",
            f"kafka://{self.bootstrap}",
            "--datadir",
            str(self.datadir),
            "--web-port",
            str(web_port),
            "-l",
            "info",
        ]
        for topic in self.topics:
            argv += ["--topic", topic]
        start_size = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log_start = start_size
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self._env())
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"leader worker exited with {self.process.returncode}:\n" + self.log_tail()
                )
            with open(self.log_path, "rb") as f:
                f.seek(start_size)
                if self.READY_LINE.encode() in f.read():
                    return self
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"leader worker not ready within {timeout_s} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        """Everything the worker logged since its last :meth:`start`."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def pause(self) -> None:
        """SIGSTOP: the process freezes (a GC pause or a VM freeze, as the group sees it)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the worker's log."""
        if not self.log_path.exists():
            return ""
        text = self.log_path.read_bytes().decode(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is flushed)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def __enter__(self) -> LeaderWorker:
        if self.process is None or self.process.poll() is not None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
