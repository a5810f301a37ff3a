"""A share agent (ACCEPTs everything, one ledger line per delivery), run by test_interrupts.py.

With ``AGENT_GATE=1`` a Faust service registered before the agent holds the worker's start-up:
Faust starts an app's services one after the other once the app has started, and this one logs
``agent_env.GATE_LINE`` (on stderr) and returns only when the worker is told to stop (or after
:data:`GATE_S`). A SIGTERM sent on that line lands, every time, where it once did by chance:
while Faust starts the worker's services, before the share agent's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import mode

import queueflow
from tests.integration.agent_env import GATE_LINE, app_from_env

#: Seconds the gate holds at most.
GATE_S = 120.0

app, topic, ledger = app_from_env()


class Gate(mode.Service):
    """Holds the start-up of the services registered after it until the worker stops."""

    async def on_start(self) -> None:
        print(GATE_LINE, file=sys.stderr, flush=True)
        await self.wait_for_stopped(asyncio.sleep(GATE_S))


if os.environ.get("AGENT_GATE") == "1":
    app.service(Gate)


@app.share_agent(topic, group="joining", concurrency=2)
async def handle(record: queueflow.ShareRecord) -> object:
    ledger.write(json.dumps({"i": record.value["i"], "pid": os.getpid()}) + "\n")
    return queueflow.ACCEPT
