"""The handlers' ledgers: one JSON line per delivery, appended by every worker process."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from examples.chaos.config import FAILED, TERMINAL

__all__ = ["Ledger", "terminal_line"]


class Ledger:
    """Reads the per-process ledger files incrementally."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self.lines: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.starts: list[dict[str, Any]] = []
        self.bad_lines = 0
        self.count = 0

    def poll(self) -> set[int]:
        """Read what was appended since the last call; returns the ids with new lines."""
        touched: set[int] = set()
        if not self.directory.exists():
            return touched
        for path in sorted(self.directory.glob("*.jsonl")):
            pos = self.offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(pos)
                data = f.read()
            end = data.rfind(b"\n") + 1  # only complete lines
            if end == 0:
                continue
            self.offsets[path] = pos + end
            for raw in data[:end].splitlines():
                if not raw.strip():
                    continue
                try:
                    entry = json.loads(raw)
                except ValueError:
                    self.bad_lines += 1
                    continue
                if "id" in entry:
                    self.lines[int(entry["id"])].append(entry)
                    touched.add(int(entry["id"]))
                    self.count += 1
                elif entry.get("event") == "start":
                    self.starts.append(entry)
        return touched


def terminal_line(lines: list[dict[str, Any]], limit: int) -> dict[str, Any] | None:
    """The first delivery (in time) that ended the record: ACCEPT, REJECT, or a failed delivery
    at the delivery count limit (the leader Archives the record)."""
    for e in sorted(lines, key=lambda e: e["t"]):
        if e["o"] in TERMINAL or (e["o"] in FAILED and int(e["dc"]) >= limit):
            return e
    return None
