"""Headless Chromium for the dashboard's test and screenshot (Debian's ``chromium`` package).

:func:`chromium` finds the browser and, on a Debian/Ubuntu machine where this process may install
packages (root), installs it with ``apt-get`` when it is missing; otherwise it fails saying what to
install. :func:`dump_dom` and :func:`screenshot` run it once on a URL: the page's scripts run for
a virtual-time budget first, so what they return is the page after its first polls.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from queueflow.errors import ConfigurationError

__all__ = ["CHROMIUM_PACKAGE", "chromium", "dump_dom", "screenshot"]

#: The Debian package that provides ``/usr/bin/chromium``.
CHROMIUM_PACKAGE = "chromium"
_NAMES = ("chromium", "chromium-browser", "google-chrome")
_TIMEOUT_S = 120.0


def chromium(install: bool = True) -> str:
    """The path of a Chromium executable.

    Args:
        install: when none is found, install Debian's ``chromium`` package with ``apt-get``
            (``apt-get update`` first) if this process runs as root (or ``sudo`` works without
            a password) on a machine that has ``apt-get``.

    Raises:
        ConfigurationError: no Chromium, and it could not be installed; the message says how.
    """
    found = _which()
    if found is not None or not install:
        if found is None:
            raise ConfigurationError(_missing("install=False"))
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        raise ConfigurationError(_missing("no apt-get on this machine"))
    prefix: list[str] = []
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None or subprocess.run([sudo, "-n", "true"], capture_output=True).returncode:
            raise ConfigurationError(_missing("not root, and no password-less sudo"))
        prefix = [sudo, "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        [*prefix, apt, "update", "-q"],
        [*prefix, apt, "install", "-y", "-q", "--no-install-recommends", CHROMIUM_PACKAGE],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        if done.returncode:
            raise ConfigurationError(
                _missing(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr[-500:]}")
            )
    found = _which()
    if found is None:
        raise ConfigurationError(_missing(f"apt-get installed {CHROMIUM_PACKAGE}, no executable"))
    return found


def dump_dom(url: str, budget_ms: int = 4000) -> str:
    """The page at ``url`` as HTML after its scripts ran for ``budget_ms`` of virtual time.

    Raises:
        ConfigurationError: no Chromium (see :func:`chromium`).
        RuntimeError: Chromium failed or printed nothing; the message has its stderr.
    """
    done = _run(["--dump-dom", url], budget_ms)
    if not done.stdout.strip():
        raise RuntimeError(f"chromium printed no DOM for {url}: {done.stderr[-1000:]}")
    return done.stdout


def screenshot(
    url: str, path: Path, width: int = 1280, height: int = 900, budget_ms: int = 4000
) -> Path:
    """Save a PNG of the page at ``url`` (``width`` x ``height`` CSS pixels) to ``path``, after
    its scripts ran for ``budget_ms`` of virtual time.

    Raises:
        ConfigurationError: no Chromium. RuntimeError: no PNG was written.
    """
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    done = _run([f"--screenshot={path}", f"--window-size={width},{height}", url], budget_ms)
    if not path.is_file() or path.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot of {url}: {done.stderr[-1000:]}")
    return path


def _run(args: list[str], budget_ms: int) -> subprocess.CompletedProcess[str]:
    argv = [
        chromium(),
        "--headless",
        "--no-sandbox",  # as root (CI containers) Chromium refuses to start sandboxed
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--virtual-time-budget={budget_ms}",
        *args,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S)
    if done.returncode:
        raise RuntimeError(
            f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr[-1000:]}"
        )
    return done


def _which() -> str | None:
    for name in _NAMES:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def _missing(why: str) -> str:
    return (
        f"headless Chromium is needed and was not found on PATH ({', '.join(_NAMES)}), and could "
        f"not be installed ({why}); install it: 'apt-get install --no-install-recommends "
        f"{CHROMIUM_PACKAGE}' (Debian/Ubuntu), or put a Chromium or Chrome on PATH"
    )
