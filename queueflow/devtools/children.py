"""Child processes that do not outlive the process that started them.

The local broker runs in its own session (so a Ctrl-C in a terminal reaches the Python process
that started it, which then stops the broker cleanly), and a SIGKILL of that Python process runs
no cleanup at all. On Linux, :func:`parent_death_signal` makes the kernel send the child a
signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``, see ``man 2 prctl``), so neither a
broker JVM nor a worker is left behind. Elsewhere it does nothing: cleanup then relies on the
parent's signal handlers and ``finally`` blocks.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["parent_death_signal", "supports_parent_death_signal"]

#: ``PR_SET_PDEATHSIG`` from ``<linux/prctl.h>``.
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved once, in the parent: the function passed as preexec_fn runs between fork and exec,
# where loading a library is not safe.
_PRCTL = _load_prctl()


def supports_parent_death_signal() -> bool:
    """True where :func:`parent_death_signal` has an effect (Linux)."""
    return _PRCTL is not None


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``sig`` when its parent dies.

    "Parent" is the *thread* that starts the child (Linux semantics): start children that must
    outlive a short-lived thread from a long-lived one (the main thread).

    Args:
        sig: the signal the child receives (default SIGTERM: a broker's controlled shutdown, a
            worker's graceful leave).

    Returns:
        The function for ``preexec_fn=``, or None where the platform has no such mechanism
        (``preexec_fn=None`` is Popen's default).
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os.kill(os.getpid(), sig)

    return preexec
