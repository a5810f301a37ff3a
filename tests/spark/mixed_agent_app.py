"""The Faust side of test_mixed_group: a worker (role ``all``: leaders, coordinator and a share
agent) whose agent is a member of the share group ``mixed``, next to a Spark query.

Configured by env vars: ``AGENT_APP_ID``, ``AGENT_BROKER``, ``AGENT_TOPIC``, ``AGENT_LEDGER``.
Records are JSON ``{"i": n}``. The handler takes 20 ms per record (concurrency 2, so about
100 records/s: the Spark query gets a real share of the work), appends
``{"i", "partition", "delivery_count"}`` to the ledger and ACCEPTs.
"""

from __future__ import annotations

import asyncio
import json
import os

import queueflow

app = queueflow.App(
    os.environ["AGENT_APP_ID"],
    broker=os.environ["AGENT_BROKER"],
    share_settings={
        "share.auto.offset.reset": "earliest",
        # The agent learns within 0.5 s that the Spark query took one of the partitions.
        "group.share.heartbeat.interval.ms": 500,
        "queueflow.lock.check.interval.ms": 100,
    },
)
topic = app.topic(os.environ["AGENT_TOPIC"], value_serializer="json")
ledger = open(os.environ["AGENT_LEDGER"], "a", buffering=1)  # noqa: SIM115


@app.share_agent(topic, group="mixed", concurrency=2)
async def handle(record: queueflow.ShareRecord) -> object:
    await asyncio.sleep(0.02)  # some work per record
    line = {"i": record.value["i"], "partition": record.partition}
    ledger.write(json.dumps({**line, "delivery_count": record.delivery_count}) + "\n")
    return queueflow.ACCEPT
