"""A share agent whose handler slows down, run by test_adaptive_acquisition.

Records are JSON ``{"i": n}``. Four handler tasks, a 2 s acquisition lock. Records below
``$AGENT_FAST`` take no time (the agent's batches grow to what fast handlers get through);
from there on each call awaits 150 ms (4 tasks: about 27 records/s, 53 per lock). The handler
appends ``{"i", "delivery_count"}`` to ``$AGENT_LEDGER`` and ACCEPTs.
"""

from __future__ import annotations

import asyncio
import json
import os

import queueflow
from tests.integration.agent_env import app_from_env

app, topic, ledger = app_from_env()
FAST = int(os.environ["AGENT_FAST"])


@app.share_agent(topic, group="slowing", concurrency=4, lock_duration_ms=2000)
async def handle(record: queueflow.ShareRecord) -> object:
    if record.value["i"] >= FAST:
        await asyncio.sleep(0.15)
    ledger.write(json.dumps({"i": record.value["i"], "delivery_count": record.delivery_count}))
    ledger.write("\n")
    return queueflow.ACCEPT
