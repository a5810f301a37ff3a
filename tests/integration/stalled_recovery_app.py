"""A share-agent app whose table recovery is reported stuck, run by test_share_agent.

Faust's table recovery has been seen to hang for good after a worker was frozen (it waited
for changelog records that never came). That can't be caused on demand, so this app makes
the worker's :class:`~queueflow.engine.fencing.RecoveryWatch` report a stall at its first
check: the test sees what the worker does then (it stops, non-zero, saying why).
"""

from __future__ import annotations

import queueflow
from queueflow.engine.fencing import RecoveryWatch
from tests.integration.agent_env import app_from_env


def _always_stalled(self: RecoveryWatch, in_recovery: bool, remaining: int, now_ms: int) -> int:
    return self.limit_ms


RecoveryWatch.check = _always_stalled  # type: ignore[method-assign]

app, topic, ledger = app_from_env()


@app.share_agent(topic, group="stalled")
async def handle(record: queueflow.ShareRecord) -> object:
    return queueflow.ACCEPT
