"""A share agent whose handler does 100 ms of blocking work on the event loop, run by
test_adaptive_acquisition.

Records are JSON ``{"i": n}``. Four handler tasks, a 2 s acquisition lock: the four tasks
don't overlap (each call holds the loop), so the agent finishes 10 records/s, not the 40/s its
call time suggests. The handler appends ``{"i", "delivery_count"}`` to ``$AGENT_LEDGER`` and
ACCEPTs.
"""

from __future__ import annotations

import json
import time

import queueflow
from tests.integration.agent_env import app_from_env

app, topic, ledger = app_from_env()


@app.share_agent(topic, group="busy", concurrency=4, lock_duration_ms=2000)
async def handle(record: queueflow.ShareRecord) -> object:
    time.sleep(0.1)  # CPU work on the loop (the guide says: don't), as the old demo did
    ledger.write(json.dumps({"i": record.value["i"], "delivery_count": record.delivery_count}))
    ledger.write("\n")
    return queueflow.ACCEPT
