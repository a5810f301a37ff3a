"""A share agent in group ``mixed`` that ACCEPTs every record and appends ``{"i": n}`` to
``$AGENT_LEDGER``, run by test_kafka_listener's mixed group (its worker also runs the
Kafka-protocol listener, ``QUEUEFLOW_KAFKA_LISTENER``)."""

from __future__ import annotations

import json

import queueflow
from tests.integration.agent_env import app_from_env

app, topic, ledger = app_from_env()


@app.share_agent(topic, group="mixed", concurrency=2)
async def handle(record: queueflow.ShareRecord) -> object:
    ledger.write(json.dumps({"i": record.value["i"]}) + "\n")
    return queueflow.ACCEPT
