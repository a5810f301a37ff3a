"""A share agent of a ``read_committed`` group, run by test_read_committed as a Faust worker
(role ``all``: it also leads the topic). Its handler appends each value it is handed to
``$AGENT_LEDGER``, one per line. The app sets ``share.isolation.level=read_committed`` for the
agent's group and for the test's ShareConsumer group ``committed-consumer``."""

from __future__ import annotations

import os

import queueflow

COMMITTED = {"share.isolation.level": "read_committed"}

app = queueflow.App(
    os.environ["AGENT_APP_ID"],
    broker=os.environ["AGENT_BROKER"],
    share_settings={"share.auto.offset.reset": "earliest"},
    group_configs={"committed-agent": COMMITTED, "committed-consumer": COMMITTED},
)
topic = app.topic(os.environ["AGENT_TOPIC"], value_serializer="raw")
ledger = open(os.environ["AGENT_LEDGER"], "a", buffering=1)  # noqa: SIM115


@app.share_agent(topic, group="committed-agent", concurrency=2)
async def handle(record: queueflow.ShareRecord) -> object:
    ledger.write(record.value.decode() + "\n")
    return queueflow.ACCEPT
