"""A share agent that ACCEPTs every record, run by test_assignor_upgrade as Faust workers
(``QUEUEFLOW_ROLE`` ``leader`` or ``member``). Each delivery is one JSON line
``{"i": n, "worker": $UPGRADE_WORKER}`` in ``$AGENT_LEDGER`` (env: see agent_env)."""

from __future__ import annotations

import json
import os

import queueflow
from tests.integration.agent_env import app_from_env

app, topic, ledger = app_from_env()
worker = os.environ.get("UPGRADE_WORKER", "?")


@app.share_agent(topic, group="upgrade", concurrency=2)
async def handle(record: queueflow.ShareRecord) -> object:
    ledger.write(json.dumps({"i": record.value["i"], "worker": worker}) + "\n")
    return queueflow.ACCEPT
