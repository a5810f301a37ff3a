"""The downstream Faust agent of :mod:`examples.enrichment.app`: spend and order count per
customer, in a table, exactly once.

Run it with ``faust -A examples.enrichment.totals worker``. It reads the enriched orders
(keyed by customer, so each customer's orders reach one partition and its table entry lives
there) with Faust's own ``processing_guarantee="exactly_once"``: it reads read_committed (only
the results of committed share-agent transactions) and commits its table changes and its
consumer offsets in one transaction.
"""

from __future__ import annotations

import os

import faust

PREFIX = os.environ.get("EXAMPLE_PREFIX", "enrichment")

app = faust.App(
    f"{PREFIX}-totals",
    broker=os.environ.get("EXAMPLE_BROKER", "kafka://127.0.0.1:9092"),
    processing_guarantee="exactly_once",
    topic_partitions=2,
)
enriched = app.topic(f"{PREFIX}-enriched", key_serializer="raw", value_serializer="json")
#: customer -> {"spend": total amount, "orders": how many}
totals = app.Table("totals", default=dict, partitions=2)


@app.agent(enriched)
async def keep_totals(stream: faust.StreamT) -> None:
    async for event in stream.events():
        customer = event.key.decode()
        entry = totals[customer] or {"spend": 0, "orders": 0}
        totals[customer] = {
            "spend": entry["spend"] + event.value["amount"],
            "orders": entry["orders"] + 1,
        }
