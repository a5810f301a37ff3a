"""The previous queueflow release, for the rolling-upgrade test (docs/operations.md, "Upgrades").

:data:`PREVIOUS_RELEASE` is the one place that names it. There are no release tags yet: it is
the last commit whose CI passed. To bump it after a release, set it to that release's commit (or
tag) and run ``pytest tests/integration/test_rolling_upgrade.py``; a wire or state
incompatibility between the two shows up there.

:func:`previous_release_python` builds a second venv without downloading anything: ``python -m
venv --without-pip`` with a ``.pth`` file that puts the previous release's source
(``git archive <commit> queueflow examples``) first and this venv's site-packages (the same
dependencies) after it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["PREVIOUS_RELEASE", "is_release", "previous_release_python", "release_env"]

#: The previous release: the last commit whose CI passed (bump: see the module docstring).
PREVIOUS_RELEASE = "ca0da06"
#: Seconds each build step (git, venv) may take.
_STEP_TIMEOUT_S = 120


def previous_release_python(repo: Path, directory: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """Build the previous release's venv in ``directory``; returns its Python interpreter.

    Its source is in ``directory / "src"`` (``queueflow`` and ``examples``): run its processes
    there (``cwd``) with :func:`release_env`.

    Raises:
        RuntimeError: ``repo`` has no commit ``commit`` (a shallow clone): the message says how
            to fetch the full history.
        subprocess.CalledProcessError: git, tar or venv failed.
    """
    found = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        timeout=_STEP_TIMEOUT_S,
        check=False,
    )
    if found.returncode != 0:
        raise RuntimeError(
            f"the rolling-upgrade test needs the previous release, commit {commit}, but the "
            f"repository at {repo} does not have it (a shallow clone?): run "
            "`git fetch --unshallow` (or clone with full history), or bump PREVIOUS_RELEASE in "
            "tests/integration/previous_release.py"
        )
    src = directory / "src"
    src.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "-C", str(repo), "archive", commit, "queueflow", "examples"],
        stdout=subprocess.PIPE,
    )
    try:
        subprocess.run(
            ["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True, timeout=_STEP_TIMEOUT_S
        )
    finally:
        assert archive.stdout is not None
        archive.stdout.close()
        if archive.wait(timeout=_STEP_TIMEOUT_S) != 0:
            raise subprocess.CalledProcessError(archive.returncode, archive.args)
    venv = directory / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        timeout=_STEP_TIMEOUT_S,
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=_STEP_TIMEOUT_S,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]  # this venv's: the same dependencies
    # Lines of a .pth are appended to sys.path in order: the release's source before ours (whose
    # own .pth files, e.g. this checkout's editable install, are not processed from there).
    Path(site, "queueflow-previous-release.pth").write_text(f"{src}\n{ours}\n")
    return python


def release_env(src: Path) -> dict[str, str]:
    """Environment overrides for a process of the release in ``src``: no ``PYTHONPATH`` of this
    checkout (so ``import queueflow`` finds the release's)."""
    return {"PYTHONPATH": str(src)}


def is_release(python: Path, src: Path) -> bool:
    """Whether ``python`` imports ``queueflow`` from ``src`` (a check of the build)."""
    out = subprocess.run(
        [str(python), "-c", "import queueflow; print(queueflow.__file__)"],
        capture_output=True,
        text=True,
        cwd=src,
        env={**os.environ, **release_env(src)},
        timeout=_STEP_TIMEOUT_S,
        check=True,
    ).stdout.strip()
    return Path(out).resolve().is_relative_to(src.resolve())
