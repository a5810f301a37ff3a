"""Interrupting what starts brokers and workers leaves none behind, and a worker's SIGTERM
while it joins its group (a rebalance) is a clean exit (docs/operations.md "Stopping and
interrupting").

* a pytest session that started its broker and a worker, SIGTERMed (as ``timeout``, CI or a
  process manager stop ``make test``): the session's teardown stops both;
* ``make demo`` (``python -m examples.demo``) and ``make chaos`` (``python -m examples.chaos``)
  SIGTERMed once their workers run; ``make demo`` interrupted (Ctrl-C) while its broker starts:
  one line, no traceback, exit 130;
* a share-agent worker SIGTERMed while Faust starts its services, joining its app (a
  rebalance): exit 0.

Every process these start carries a marker in its environment (inherited by the broker JVM and
the workers), so "none left" means no process on the machine has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from queueflow.testing import WorkerProcess, faust_worker_argv
from queueflow.testing import produce as produce_records
from tests.integration.agent_env import GATE_LINE

ROOT = Path(__file__).resolve().parents[2]
MARK = "QF_INTERRUPT_MARK"
#: Seconds for the interrupted process to start its broker and workers.
START_TIMEOUT_S = 120.0
#: Seconds for it to exit after the signal, and for what it started to be gone.
EXIT_TIMEOUT_S = 60.0


def marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command) of every process whose environment has ``QF_INTERRUPT_MARK=<mark>``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if needle not in environ.split(b"\0"):
                continue
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] == "Z":
                continue  # exited, not yet reaped: nothing runs
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        found.append((int(entry.name), cmd[:200]))
    return found


def wait_until(what: str, done: Callable[[], bool], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s:\n{tail(log)}"
        time.sleep(0.2)


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"


@dataclasses.dataclass
class Marked:
    """A process started with a marker, and its output."""

    proc: subprocess.Popen[bytes]
    mark: str
    log: Path

    def descendants(self) -> list[tuple[int, str]]:
        """What runs with its marker: itself and everything it started."""
        return marked(self.mark)


@contextlib.contextmanager
def marked_process(argv: list[str], log: Path, **env: str) -> Iterator[Marked]:
    """Run ``argv`` with a fresh marker (and ``env``), without ``$QUEUEFLOW_BROKER`` (so it
    starts a broker of its own); on the way out, SIGKILL whatever still has the marker."""
    mark = uuid.uuid4().hex
    full_env = {k: v for k, v in os.environ.items() if k != "QUEUEFLOW_BROKER"}
    full_env.update(env, **{MARK: mark, "PYTHONPATH": str(ROOT)})
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        yield Marked(proc, mark, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pid, _ in marked(mark):  # a failed test must not leave them behind either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def assert_all_gone(run: Marked) -> None:
    """Within :data:`EXIT_TIMEOUT_S`, nothing with the run's marker is left."""
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while run.descendants() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.descendants() == [], f"left behind:\n{run.descendants()}\n{tail(run.log)}"


def test_sigterm_of_a_test_session_stops_its_broker_and_worker(tmp_path: Path) -> None:
    pids_file, log = tmp_path / "pids.json", tmp_path / "session.log"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    argv += ["--basetemp", str(tmp_path / "inner"), "tests/integration/interrupted_session.py"]
    with marked_process(argv, log, QF_INTERRUPT_PIDS=str(pids_file)) as run:
        wait_until(
            "the broker and the worker up",
            lambda: pids_file.exists() or run.proc.poll() is not None,
            START_TIMEOUT_S,
            log,
        )
        assert run.proc.poll() is None, tail(log)
        pids = json.loads(pids_file.read_text())
        assert {pid for pid, _ in run.descendants()} >= set(pids.values())

        run.proc.send_signal(signal.SIGTERM)

        code = run.proc.wait(timeout=EXIT_TIMEOUT_S)
        assert code == pytest.ExitCode.INTERRUPTED, tail(log)
        assert_all_gone(run)


def test_sigterm_of_make_demo_stops_its_broker_and_workers(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    argv = [sys.executable, "-m", "examples.demo", "--max-files", "40"]
    with marked_process(argv, log) as run:
        wait_until(
            "the demo's workers started",
            lambda: "started 4 workers" in tail(log, 100_000) or run.proc.poll() is not None,
            START_TIMEOUT_S,
            log,
        )
        assert run.proc.poll() is None, tail(log)
        assert len(run.descendants()) >= 6, run.descendants()  # itself, the JVM, 4 workers

        run.proc.send_signal(signal.SIGTERM)

        code = run.proc.wait(timeout=EXIT_TIMEOUT_S)
        assert code == 128 + signal.SIGTERM, tail(log)
        assert_all_gone(run)


def test_ctrl_c_while_the_demo_starts_its_broker_stops_it_without_a_traceback(
    tmp_path: Path,
) -> None:
    log = tmp_path / "demo.log"
    argv = [sys.executable, "-m", "examples.demo", "--max-files", "40"]
    with marked_process(argv, log) as run:
        wait_until(
            "the demo's broker starting",
            lambda: "starting the Kafka" in tail(log, 100_000) or run.proc.poll() is not None,
            START_TIMEOUT_S,
            log,
        )
        assert run.proc.poll() is None, tail(log)

        run.proc.send_signal(signal.SIGINT)

        code = run.proc.wait(timeout=EXIT_TIMEOUT_S)
        assert code == 130, tail(log)
        assert "Traceback" not in tail(log, 100_000), tail(log)
        assert "interrupted: the demo's workers and broker are stopped" in tail(log), tail(log)
        assert_all_gone(run)


def test_sigterm_of_make_chaos_stops_its_broker_and_workers(tmp_path: Path) -> None:
    log = tmp_path / "chaos.log"
    argv = [sys.executable, "-m", "examples.chaos", "--records", "300", "--all-workers", "1"]
    argv += ["--member-workers", "1", "--kill-interval", "0", "--no-broker-restart"]
    argv += ["--run-dir", str(tmp_path / "run")]
    with marked_process(argv, log) as run:
        wait_until(
            "the chaos run's workers started",
            lambda: "started 2 workers" in tail(log, 100_000) or run.proc.poll() is not None,
            START_TIMEOUT_S,
            log,
        )
        assert run.proc.poll() is None, tail(log)
        assert len(run.descendants()) >= 4, run.descendants()  # itself, the JVM, 2 workers

        run.proc.send_signal(signal.SIGTERM)

        code = run.proc.wait(timeout=EXIT_TIMEOUT_S)
        assert code == 128 + signal.SIGTERM, tail(log)
        assert_all_gone(run)


def test_a_worker_sigterm_while_it_starts_exits_0(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """The second worker of an app, joining it (a rebalance of the app's Faust group), is
    SIGTERMed while Faust starts its services, before its share agent's (held there by the
    gate of :mod:`tests.integration.gated_agent_app`): it stops cleanly, exit 0 (it used to
    start the stopped agent: IllegalTransitionError, exit 1). The first worker is unaffected
    and handles every record."""
    topic = topic_factory(2)
    records = 20
    values = [json.dumps({"i": i}) for i in range(records)]
    asyncio.run(produce_records(kafka_bootstrap, topic, values))
    ledger = tmp_path / "ledger.jsonl"
    env = {
        "AGENT_APP_ID": f"qf-join-{uuid.uuid4().hex[:8]}",
        "AGENT_TOPIC": topic,
        "AGENT_BROKER": f"kafka://{kafka_bootstrap}",
        "AGENT_LEDGER": str(ledger),
    }
    workers = [
        WorkerProcess(
            faust_worker_argv("tests.integration.gated_agent_app", tmp_path / f"data-{i}"),
            tmp_path / f"worker-{i}.log",
            {**env, "AGENT_GATE": str(i)},
            cwd=ROOT,
        )
        for i in range(2)
    ]
    first, second = workers
    try:
        first.start()
        first.wait_ready(90, what="the first worker")
        second.start()
        wait_until(
            "the second worker starting its services",
            lambda: GATE_LINE in second.log_text() or not second.alive(),
            90,
            second.log_path,
        )

        second.terminate()

        assert second.process is not None
        code = second.process.wait(timeout=EXIT_TIMEOUT_S)
        assert code == 0, second.log_tail(80)
        assert "IllegalTransitionError" not in second.log_text()
        wait_until(
            "every record handled",
            lambda: ledger.exists() and len(ledger.read_text().splitlines()) >= records,
            60,
            first.log_path,
        )
        assert first.alive(), first.log_tail()
        first.terminate()
        assert first.process is not None
        assert first.process.wait(timeout=EXIT_TIMEOUT_S) == 0, first.log_tail(80)
        assert first.events("share_agent_drained"), first.log_tail()
    finally:
        for worker in workers:
            worker.stop()
