"""Enrichment, exactly once: share agents enrich orders; each ACCEPT and its result commit in
one Kafka transaction.

Run a worker with ``faust -A examples.enrichment.app worker`` (``python -m
examples.enrichment`` runs the whole example). Orders (``{"order": 7, "customer": "c3",
"amount": 1250}``) are shared by any number of workers; each is enriched with its customer's
region and published to the ``enriched`` topic keyed by customer, so the downstream Faust agent
that keeps totals per customer (:mod:`examples.enrichment.totals`) owns all of a customer's
orders. With ``processing_guarantee="exactly_once"`` the result and the ACCEPT commit together:
a worker killed at any moment leaves either both or neither, and a read_committed consumer sees
each order's result exactly once. An order for an unknown customer is REJECTed to the
dead-letter topic.
"""

from __future__ import annotations

import os
from typing import Any

import queueflow
from queueflow import ACCEPT, REJECT, DeadLetter, Result, Send, ShareRecord

PREFIX = os.environ.get("EXAMPLE_PREFIX", "enrichment")

#: The reference data the orders are enriched with.
CUSTOMERS = {f"c{i}": {"region": ("north", "south", "east", "west")[i % 4]} for i in range(8)}

app = queueflow.App(
    f"{PREFIX}-app",
    broker=os.environ.get("EXAMPLE_BROKER", "kafka://127.0.0.1:9092"),
    share_settings={
        "share.auto.offset.reset": "earliest",
        # Leaders apply transactional acknowledgements (docs/architecture.md).
        "queueflow.processing.guarantee": "exactly_once",
    },
)
orders = app.topic(f"{PREFIX}-orders", value_serializer="json")
enriched = app.topic(f"{PREFIX}-enriched", key_serializer="raw", value_serializer="json")


@app.share_agent(
    orders,
    group="enrichers",
    concurrency=4,
    dead_letter=f"{PREFIX}-dead-letters",
    processing_guarantee="exactly_once",
)
async def enrich(record: ShareRecord) -> Any:
    order = record.value
    customer = CUSTOMERS.get(order["customer"])
    if customer is None:
        return Result(REJECT, [DeadLetter(reason=f"unknown customer {order['customer']!r}")])
    result = {**order, "region": customer["region"]}
    # Keyed by customer: the totals agent keeps each customer's state on one partition.
    return Result(ACCEPT, [Send(enriched, result, key=order["customer"].encode())])
