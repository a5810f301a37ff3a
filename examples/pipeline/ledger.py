"""Reading the workers' ledgers (one JSON line per delivery, see examples/pipeline/app.py)
incrementally: the driver polls them every few seconds while 336,776 flights go through, so
each poll parses only the lines appended since the last one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


class Ledgers:
    """The ledgers of all workers, folded into each flight's latest outcome.

    Args:
        paths: one ledger file per worker (they may not exist yet).
    """

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self._offsets = dict.fromkeys(paths, 0)
        #: flight key -> its latest outcome (ACCEPT or REJECT).
        self.outcomes: dict[str, str] = {}
        self.deliveries = 0
        self.redelivered = 0
        self.pids: Counter[int] = Counter()

    def poll(self) -> None:
        """Read the complete lines appended since the last poll."""
        for path in self.paths:
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[path])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # a line being written is read next time
            self._offsets[path] += end
            for line in data[:end].splitlines():
                if line.strip():
                    self._add(json.loads(line))

    def _add(self, entry: dict[str, object]) -> None:
        self.outcomes[str(entry["k"])] = str(entry["o"])
        self.deliveries += 1
        self.pids[int(str(entry["pid"]))] += 1
        if int(str(entry["dc"])) > 1:
            self.redelivered += 1

    def counts(self) -> Counter[str]:
        """Flights per latest outcome."""
        return Counter(self.outcomes.values())
