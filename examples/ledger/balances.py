"""The downstream Faust agent of :mod:`examples.ledger.app`: each account's balance, applied
posting by posting in order, exactly once.

Run it with ``faust -A examples.ledger.balances worker``. It reads the postings (keyed by
account, so an account's postings reach one partition in the order they were committed) with
Faust's own ``processing_guarantee="exactly_once"``. A withdrawal larger than the balance is
declined, so the balance depends on the order of the postings; a posting whose ``seq`` is not
the account's next one is counted in ``out_of_order`` (with ``ordering="key"``: never).
"""

from __future__ import annotations

import os
from typing import Any

import faust

PREFIX = os.environ.get("EXAMPLE_PREFIX", "ledger")

app = faust.App(
    f"{PREFIX}-balances",
    broker=os.environ.get("EXAMPLE_BROKER", "kafka://127.0.0.1:9092"),
    processing_guarantee="exactly_once",
    topic_partitions=2,
)
postings = app.topic(f"{PREFIX}-postings", key_serializer="raw", value_serializer="json")
#: account -> {"balance", "seq" (the last applied), "declined", "out_of_order"}
balances = app.Table("balances", default=dict, partitions=2)


def apply(entry: dict[str, Any] | None, posting: dict[str, Any]) -> dict[str, Any]:
    """``entry`` (an account's state, or None) after ``posting``. Pure."""
    state = dict(entry or {"balance": 0, "seq": 0, "declined": 0, "out_of_order": 0})
    if posting["seq"] != state["seq"] + 1:
        state["out_of_order"] += 1
    state["seq"] = max(state["seq"], posting["seq"])
    if state["balance"] + posting["amount"] < 0:
        state["declined"] += 1
    else:
        state["balance"] += posting["amount"]
    return state


@app.agent(postings)
async def keep_balances(stream: faust.StreamT) -> None:
    async for event in stream.events():
        account = event.key.decode()
        balances[account] = apply(balances[account] or None, event.value)
