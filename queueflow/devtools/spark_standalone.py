"""A local Spark standalone cluster: one master and N workers, each its own JVM, on 127.0.0.1.

Started with the pyspark wheel's own ``bin/spark-class`` (``org.apache.spark.deploy.master.Master``
and ``org.apache.spark.deploy.worker.Worker``, see
https://spark.apache.org/docs/latest/spark-standalone.html#starting-a-cluster-manually), so
nothing beyond ``pip install 'queueflow[spark]'`` is needed. An application on it gets
executors in their own JVMs (started by the workers), each with its own Python workers: what a
real cluster does, on one machine. Small memory (daemons 256 MB, each worker offers 1 GB) and
every process in its own session, stopped on :meth:`StandaloneSpark.stop` (also when the
Python process that started them dies, on Linux).

::

    with StandaloneSpark(run_dir / "spark") as cluster:
        spark = local_session("app", master=cluster.master_url)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from queueflow.devtools.broker.java import find_java
from queueflow.devtools.broker.logtail import tail_file
from queueflow.devtools.broker.ports import find_free_ports
from queueflow.devtools.children import parent_death_signal
from queueflow.errors import QueueflowError

__all__ = ["SparkClusterError", "StandaloneSpark", "spark_home"]

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: Log lines that say the master took the lead and a worker registered with it.
MASTER_READY = "I have been elected leader"
WORKER_READY = "Successfully registered with master"


class SparkClusterError(QueueflowError):
    """The standalone cluster did not start (the message has the log's tail)."""


def spark_home() -> Path:
    """The pyspark wheel's directory (it has ``bin/spark-class`` and ``jars/``).

    Raises:
        SparkClusterError: pyspark is not installed.
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkClusterError("pyspark is not installed: pip install 'queueflow[spark]'")
    return Path(next(iter(spec.submodule_search_locations)))


class StandaloneSpark:
    """One master and ``workers`` workers of Spark's standalone cluster manager on 127.0.0.1.

    Args:
        work_dir: logs (``master.log``, ``worker-N.log``) and the workers' directories
            (executors' stdout/stderr) go here.
        workers: how many workers (each starts one executor per application core it offers).
        cores: cores each worker offers.
        memory: memory each worker offers to executors (``512m``, ``1g``).
        daemon_memory: heap of the master and worker JVMs (``SPARK_DAEMON_MEMORY``).
        env: extra environment for the daemons and, through them, the executors.
    """

    def __init__(
        self,
        work_dir: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        daemon_memory: str = "256m",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.extra_env = dict(env or {})
        self.port = 0
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>`` (after :meth:`start`)."""
        return f"spark://{HOST}:{self.port}"

    def _env(self) -> dict[str, str]:
        java = Path(find_java()).resolve()
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "JAVA_HOME": str(java.parent.parent),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            **self.extra_env,
        }

    def _launch(self, name: str, args: list[str], env: Mapping[str, str]) -> Path:
        log_path = self.work_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                cwd=self.work_dir,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its executors too: stop() signals the whole group
                preexec_fn=parent_death_signal(),
            )
        self._procs.append(proc)
        return log_path

    def start(self, timeout_s: float = 180.0, progress: Callable[[str], None] | None = None) -> str:
        """Start the master and the workers; wait until every worker registered.

        Args:
            timeout_s: the longest wait (s) for the master and for the workers each.
            progress: called with a line per step.

        Returns:
            The master URL.

        Raises:
            SparkClusterError: a daemon exited or was not ready in time (everything started is
                stopped; the message has the log's tail).
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = self._env()
        self.port, master_ui, *worker_uis = find_free_ports(2 + self.workers, HOST)
        t0 = time.monotonic()
        try:
            args = [MASTER_CLASS, "--host", HOST, "--port", str(self.port)]
            master_log = self._launch("master", [*args, "--webui-port", str(master_ui)], env)
            self._wait_for(master_log, MASTER_READY, self._procs[0], t0 + timeout_s)
            logs = []
            for i, ui in enumerate(worker_uis):
                work = self.work_dir / f"worker-{i}"
                work.mkdir(exist_ok=True)
                args = [WORKER_CLASS, "--host", HOST, "--cores", str(self.cores)]
                args += ["--memory", self.memory, "--work-dir", str(work)]
                args += ["--webui-port", str(ui), self.master_url]
                logs.append(self._launch(f"worker-{i}", args, env))
            deadline = time.monotonic() + timeout_s
            for i, log_path in enumerate(logs):
                self._wait_for(log_path, WORKER_READY, self._procs[1 + i], deadline)
        except BaseException:
            self.stop()
            raise
        if progress is not None:
            progress(
                f"Spark standalone master {self.master_url} with {self.workers} workers "
                f"({self.cores} core, {self.memory} each) in {time.monotonic() - t0:.1f} s"
            )
        return self.master_url

    def _wait_for(
        self, log_path: Path, line: str, proc: subprocess.Popen[bytes], deadline: float
    ) -> None:
        while True:
            with contextlib.suppress(OSError):
                if line in log_path.read_text(errors="replace"):
                    return
            if proc.poll() is not None:
                raise SparkClusterError(
                    f"{log_path.stem} exited with {proc.returncode} before it was ready:\n"
                    + tail_file(log_path, 20)
                )
            if time.monotonic() >= deadline:
                raise SparkClusterError(
                    f"{log_path.stem} did not log {line!r} in time:\n" + tail_file(log_path, 20)
                )
            time.sleep(0.2)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the workers (and their executors), then the master: SIGTERM to each process
        group, SIGKILL to what is left after ``timeout_s``."""
        for proc in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in reversed(self._procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            # The group: executors and Python daemons a worker started.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs = []

    def __enter__(self) -> StandaloneSpark:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
