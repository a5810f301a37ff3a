"""Children that die with their parent (:mod:`queueflow.devtools.children`): a worker started
with :class:`~queueflow.testing.WorkerProcess` is gone when the process that started it is
SIGKILLed (no cleanup code runs then); one started with ``die_with_parent=False`` stays."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from queueflow.devtools.children import parent_death_signal

#: Seconds for the parent to start its child, and for the child to be gone after the SIGKILL.
TIMEOUT_S = 20.0

PARENT = textwrap.dedent(
    """
    import signal, sys
    from pathlib import Path
    from queueflow.testing import WorkerProcess

    out = Path(sys.argv[1])
    child = WorkerProcess(
        [sys.executable, "-c", "import signal; signal.pause()"],
        out.with_suffix(".log"),
        json_logs=False,
        die_with_parent=sys.argv[2] == "1",
    ).start()
    out.write_text(str(child.pid))
    signal.pause()
    """
)


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def start_parent(tmp_path: Path, die_with_parent: bool) -> tuple[subprocess.Popen[bytes], int]:
    """A Python process that starts a child with WorkerProcess; returns it and the child's pid."""
    out = tmp_path / "child.pid"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(out), "1" if die_with_parent else "0"], env=env
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not (out.exists() and out.read_text()):
        assert parent.poll() is None, f"the parent exited with {parent.returncode}"
        assert time.monotonic() < deadline, "the parent did not start its child"
        time.sleep(0.05)
    return parent, int(out.read_text())


def test_a_worker_is_stopped_when_its_parent_is_killed(tmp_path: Path) -> None:
    """Linux (``PR_SET_PDEATHSIG``), as the rest of the suite."""
    parent, child = start_parent(tmp_path, die_with_parent=True)
    assert running(child)

    parent.kill()
    parent.wait(timeout=TIMEOUT_S)

    deadline = time.monotonic() + TIMEOUT_S
    while running(child):
        assert time.monotonic() < deadline, f"pid {child} outlived its parent"
        time.sleep(0.05)


def test_a_child_started_without_it_outlives_its_parent(tmp_path: Path) -> None:
    parent, child = start_parent(tmp_path, die_with_parent=False)
    try:
        parent.kill()
        parent.wait(timeout=TIMEOUT_S)
        assert running(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_no_preexec_function_where_the_platform_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from queueflow.devtools import children

    monkeypatch.setattr(children, "_PRCTL", None)
    assert parent_death_signal() is None
    assert not children.supports_parent_death_signal()
