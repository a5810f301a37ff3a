"""Run by test_interrupts.py as a pytest session of its own (not collected otherwise: its
name does not start with ``test_``): it starts the session broker and a leader worker, writes
their pids to ``$QF_INTERRUPT_PIDS`` and waits to be interrupted."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from queueflow.devtools.broker import LocalBroker
from queueflow.testing import LeaderWorker

#: Seconds it waits for the signal before it gives up (the caller's timeout is shorter).
WAIT_S = 300.0


def test_waits_to_be_interrupted(
    kafka_bootstrap: str,
    local_broker: LocalBroker | None,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    assert local_broker is not None, "this session must start its own broker"
    topic = topic_factory(1)
    app_id = f"qf-interrupt-{uuid.uuid4().hex[:8]}"
    with LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "leader") as leader:
        assert leader.process is not None
        pids = {"broker": local_broker.pid(), "worker": leader.process.pid}
        Path(os.environ["QF_INTERRUPT_PIDS"]).write_text(json.dumps(pids))
        threading.Event().wait(WAIT_S)  # a signal handler raises out of the wait
