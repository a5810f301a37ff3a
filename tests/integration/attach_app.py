"""An existing Faust app (``faust.App``, Faust's own defaults) given share groups with
``queueflow.attach``, as docs/guide.md "Existing Faust apps" shows, run by test_attach as a
Faust worker. The share agent ACCEPTs every record of ``$AGENT_TOPIC``; a plain Faust agent
reads ``$AGENT_TOPIC-plain``. Both append one JSON line per record to ``$AGENT_LEDGER``."""

from __future__ import annotations

import json
import os

import faust

import queueflow

app = faust.App(os.environ["AGENT_APP_ID"], broker=os.environ["AGENT_BROKER"])
groups = queueflow.attach(app, settings={"share.auto.offset.reset": "earliest"})
jobs = app.topic(os.environ["AGENT_TOPIC"], value_serializer="raw")
ledger = open(os.environ["AGENT_LEDGER"], "a", buffering=1)  # noqa: SIM115


@groups.share_agent(jobs, group="attached", concurrency=2)
async def handle(record: queueflow.ShareRecord) -> queueflow.AcknowledgeType:
    line = {"share": record.value.decode(), "delivery_count": record.delivery_count}
    ledger.write(json.dumps(line) + "\n")
    return queueflow.ACCEPT


@app.agent(app.topic(os.environ["AGENT_TOPIC"] + "-plain", value_serializer="raw"))
async def plain(stream: faust.StreamT[bytes]) -> None:
    async for value in stream:
        ledger.write(json.dumps({"plain": value.decode()}) + "\n")
