"""A per-account ledger: account transactions shared by any number of workers, each account's
transactions posted in order and exactly once.

Run a worker with ``faust -A examples.ledger.app worker`` (``python -m examples.ledger`` runs
the whole example). Transactions (``{"account": "a3", "seq": 17, "amount": -250}``, keyed by
account) are shared with ``ordering="key"``: records with the same key are never in flight at
two members at once and are handled in offset order, while different accounts spread over all
members and handler tasks. Each transaction is posted to the ``postings`` topic keyed by
account, exactly once (``processing_guarantee="exactly_once"``), so the downstream Faust agent
that keeps the balances (:mod:`examples.ledger.balances`) sees each account's postings once and
in order, and can apply an order-dependent rule: a withdrawal larger than the balance is
declined.

Without ``ordering="key"`` two handler tasks (or two workers) can post one account's
transactions out of order; the balances agent counts that as ``out_of_order``.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import queueflow
from queueflow import ACCEPT, Result, Send, ShareRecord

PREFIX = os.environ.get("EXAMPLE_PREFIX", "ledger")

app = queueflow.App(
    f"{PREFIX}-app",
    broker=os.environ.get("EXAMPLE_BROKER", "kafka://127.0.0.1:9092"),
    share_settings={
        "share.auto.offset.reset": "earliest",
        # Leaders apply transactional acknowledgements (docs/architecture.md).
        "queueflow.processing.guarantee": "exactly_once",
    },
)
transactions = app.topic(f"{PREFIX}-transactions", key_serializer="raw", value_serializer="json")
postings = app.topic(f"{PREFIX}-postings", key_serializer="raw", value_serializer="json")


@app.share_agent(
    transactions,
    group="posters",
    concurrency=8,
    ordering="key",
    processing_guarantee="exactly_once",
)
async def post(record: ShareRecord) -> Any:
    txn = record.value
    # Uneven work: without key ordering, a later transaction of an account would often
    # overtake an earlier one.
    await asyncio.sleep(random.uniform(0, 0.004))
    posting = {**txn, "offset": record.offset}
    return Result(ACCEPT, [Send(postings, posting, key=txn["account"].encode())])
