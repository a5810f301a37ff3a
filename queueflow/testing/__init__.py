"""Helpers for testing code that uses queueflow (in the manner of ``structlog.testing``).

* :class:`FakeClock`: a clock that moves only when told to, for the engine, leaders and members.
* :class:`LeaderWorker`: a leader-only queueflow worker in a subprocess (``queueflow leader``),
  for integration tests against a real broker.
"""

from __future__ import annotations

from queueflow.testing.clock import FakeClock
from queueflow.testing.workers import LeaderWorker

__all__ = ["FakeClock", "LeaderWorker"]
