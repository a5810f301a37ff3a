"""Reading queueflow's JSON log events back from a worker's log file.

With ``QUEUEFLOW_LOG_FORMAT=json`` (see :mod:`queueflow.logging`) every queueflow event is one
JSON object per line with the keys ``event``, ``level``, ``logger``, ``timestamp`` (ISO 8601,
UTC) and the event's own key-values. Faust's text lines are interleaved; they are skipped.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable
from typing import Any

__all__ = ["JSON_LOG_ENV", "event_time", "events", "parse_events"]

#: Environment for a worker process whose queueflow events should be JSON lines.
JSON_LOG_ENV = {"QUEUEFLOW_LOG_FORMAT": "json"}


def parse_events(lines: Iterable[str], name: str | None = None) -> list[dict[str, Any]]:
    """The queueflow events among ``lines``, in order: each a dict with at least ``event``.

    Args:
        lines: log lines (text); those not starting with ``{``, not JSON objects or without an
            ``event`` key are skipped.
        name: keep only events with this ``event`` name.
    """
    out: list[dict[str, Any]] = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut short by a SIGKILL, or a JSON-looking text line
        is_event = isinstance(event, dict) and "event" in event
        if is_event and (name is None or event["event"] == name):
            out.append(event)
    return out


def events(
    path: str | os.PathLike[str], name: str | None = None, *, offset: int = 0
) -> list[dict[str, Any]]:
    """The queueflow JSON events in the log file ``path`` (empty if it does not exist).

    Args:
        path: a worker's log file (its stdout and stderr).
        name: keep only events with this ``event`` name, e.g. ``"leader_assigned"``.
        offset: byte offset to start reading at (e.g. where the latest run of the worker began).
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    return parse_events(text.splitlines(), name)


def event_time(event: dict[str, Any]) -> float:
    """The event's ``timestamp`` as seconds since the epoch (comparable with ``time.time()``).

    Raises:
        KeyError: the event has no ``timestamp``.
        ValueError: it is not ISO 8601.
    """
    text = str(event["timestamp"]).replace("Z", "+00:00")
    stamp = datetime.datetime.fromisoformat(text)
    if stamp.tzinfo is None:  # the contract says UTC
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp()
