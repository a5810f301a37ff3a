"""A share agent whose handler is slower than its acquisition lock, run by test_share_agent.

Records are JSON ``{"i": n}``. One handler task, a 1 s lock; the first delivery of record 0
blocks the event loop for 2.5 s (so no handler deadline can cancel it), and the record fetched
with it waits past its lock deadline. The handler appends
``{"i", "delivery_count", "late"}`` to ``$AGENT_LEDGER`` (``late``: it was called after the
record's lock deadline) and ACCEPTs.
"""

from __future__ import annotations

import json
import time

import queueflow
from tests.integration.agent_env import app_from_env

app, topic, ledger = app_from_env()


@app.share_agent(topic, group="slow", concurrency=1, lock_duration_ms=1000)
async def handle(record: queueflow.ShareRecord) -> object:
    i = record.value["i"]
    late = time.monotonic() >= record.lock_deadline
    ledger.write(json.dumps({"i": i, "delivery_count": record.delivery_count, "late": late}) + "\n")
    if i == 0 and record.delivery_count == 1:
        # Blocking work, longer than the 1 s acquisition lock: an awaiting handler would be
        # cancelled at its deadline (before the lock expires) instead.
        time.sleep(2.5)
    return queueflow.ACCEPT
