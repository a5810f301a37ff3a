"""A share agent with every kind of handler outcome, run by test_share_agent as a Faust worker.

Records are JSON ``{"i": n}`` (or junk bytes). The handler appends one JSON line per delivery
to ``$AGENT_LEDGER`` and:

* i % 5 == 0: raises on the first delivery (→ RELEASE, delivered again), then ACCEPTs;
* i % 5 == 1: returns junk on the first delivery (→ RELEASE), then returns None (→ ACCEPT);
* i % 5 == 2: REJECTs;
* otherwise ACCEPTs.
"""

from __future__ import annotations

import json

import queueflow
from tests.integration.agent_env import app_from_env

app, topic, ledger = app_from_env()


@app.share_agent(topic, group="outcomes", concurrency=4)
async def handle(record: queueflow.ShareRecord) -> object:
    i = record.value["i"]
    ledger.write(json.dumps({"i": i, "delivery_count": record.delivery_count}) + "\n")
    if i % 5 == 0 and record.delivery_count == 1:
        raise RuntimeError(f"handler failure on {i}")
    if i % 5 == 1 and record.delivery_count == 1:
        return "not an outcome"
    if i % 5 == 2:
        return queueflow.REJECT
    return None if i % 5 == 1 else queueflow.ACCEPT
