"""Helpers for testing code that uses queueflow (in the manner of ``structlog.testing``).

* :class:`ShareAgentHarness`: run share agents in memory against the real engine, coordinator
  and leaders on a fake clock (docs/guide.md "Testing your share agents").
* :class:`FakeClock`: a clock that moves only when told to, for the engine, leaders and members.
* :class:`LeaderWorker`: a leader-only queueflow worker in a subprocess (``queueflow leader``),
  for integration tests against a real broker.
* :class:`WorkerProcess`: any worker subprocess (start with env, wait for Faust's ready line,
  SIGTERM/SIGKILL/SIGSTOP, log tail); :func:`faust_worker_argv` builds a ``faust worker`` argv.
* :func:`events`: queueflow's JSON log events (``QUEUEFLOW_LOG_FORMAT=json``) in a log file.
* :func:`produce`: produce records to a real cluster and wait for their acknowledgements.
"""

from __future__ import annotations

from queueflow.engine.state import RecordState
from queueflow.testing.clock import FakeClock
from queueflow.testing.harness import (
    Delivery,
    HandlerError,
    HarnessTimeout,
    IdleReport,
    Outcome,
    RecordHistory,
    RecordRef,
    ShareAgentHarness,
    SharePartitionState,
)
from queueflow.testing.kafka import produce
from queueflow.testing.logs import JSON_LOG_ENV, event_time, events, parse_events
from queueflow.testing.workers import LeaderWorker, WorkerProcess, faust_worker_argv

__all__ = [
    "JSON_LOG_ENV",
    "Delivery",
    "FakeClock",
    "HandlerError",
    "HarnessTimeout",
    "IdleReport",
    "LeaderWorker",
    "Outcome",
    "RecordHistory",
    "RecordRef",
    "RecordState",
    "ShareAgentHarness",
    "SharePartitionState",
    "WorkerProcess",
    "event_time",
    "events",
    "faust_worker_argv",
    "parse_events",
    "produce",
]
