"""What the driver did to the run, and when: kills, restarts, exits, broker stop and start."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Event"]


@dataclass
class Event:
    """One action of the driver (or a worker exiting by itself).

    Attributes:
        t: wall-clock time (``time.time()``, s), comparable with ledger and log times.
        kind: ``start``, ``kill``, ``restart``, ``exit``, ``broker_stop``, ``broker_start``,
            ``broker_kill`` or ``broker_fenced`` (the broker named in ``detail`` on a cluster).
        slot: the worker slot, -1 for broker events.
        role: the worker's role (``all``, ``leader``, ``member``), "" for broker events.
        pid: the process id concerned, if any.
        detail: e.g. an exit code.
    """

    t: float  # wall clock, comparable with ledger times
    kind: str  # kill | restart | exit | broker_stop | broker_start | broker_kill | broker_fenced
    slot: int = -1
    role: str = ""
    pid: int | None = None
    detail: str = ""
