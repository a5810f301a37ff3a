"""Share agents for test_redelivery (issue scenarios of docs/concepts.md "Delivery counts" and
"Throttled delivery"). Env: ``AGENT_APP_ID``, ``AGENT_BROKER``, ``HUNG_TOPIC``,
``POISON_TOPIC``, ``AGENT_LEDGER``; records are JSON ``{"i": n}``.

* ``hung`` (concurrency 4, 5 s lock, delivery count limit 2): the 10 records of :data:`HUNG`
  never return (cancelled at their deadline: a failed attempt each time); the others are
  ACCEPTed. Records 0..3 hang first, so the records fetched with them wait behind all four
  handler tasks, on both of their deliveries.
* ``poison`` (a batch handler, up to 8 records a batch, limit 3): raises for any batch
  holding record 3.

Each handler call appends ``{"agent", "i", "delivery_count", "batch"}`` lines to the ledger.
"""

from __future__ import annotations

import asyncio
import json
import os

import queueflow

HUNG = frozenset([0, 1, 2, 3, 40, 41, 42, 43, 44, 45])  # their handlers never return
POISON = 3

app = queueflow.App(
    os.environ["AGENT_APP_ID"],
    broker=os.environ["AGENT_BROKER"],
    share_settings={"share.auto.offset.reset": "earliest"},
    group_configs={
        "hung": {"share.delivery.count.limit": 2, "share.record.lock.duration.ms": 5000},
        "poison": {"share.delivery.count.limit": 3},
    },
)
hung_topic = app.topic(os.environ["HUNG_TOPIC"], value_serializer="json")
poison_topic = app.topic(os.environ["POISON_TOPIC"], value_serializer="json")
ledger = open(os.environ["AGENT_LEDGER"], "a", buffering=1)  # noqa: SIM115


def note(agent: str, record: queueflow.ShareRecord, batch: int = 1) -> None:
    entry = {"agent": agent, "i": record.value["i"], "delivery_count": record.delivery_count}
    ledger.write(json.dumps({**entry, "batch": batch}) + "\n")


@app.share_agent(hung_topic, group="hung", concurrency=4)
async def hung(record: queueflow.ShareRecord) -> object:
    if record.value["i"] in HUNG:
        await asyncio.Event().wait()  # never returns
    note("hung", record)
    return queueflow.ACCEPT


# concurrency 8: the agent's flow control then acquires 8 records per ShareFetch from the
# start (half of 2 x concurrency), so the poison record shares its batch with 7 neighbours.
@app.share_agent(poison_topic, group="poison", concurrency=8, batch=True, batch_size=10)
async def poison(records: list[queueflow.ShareRecord]) -> object:
    for record in records:
        note("poison", record, len(records))
    if any(record.value["i"] == POISON for record in records):
        raise RuntimeError(f"record {POISON} is poison")
    return queueflow.ACCEPT
