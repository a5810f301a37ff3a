"""The ledger example (:mod:`examples.ledger`) in the user test harness: with key-ordered
sharing over several members and handler tasks, each account's postings come out once and in
``seq`` order, and the balances computed from them are those of the transactions applied one by
one."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ is not installed
    sys.path.insert(0, str(ROOT))

from examples.ledger.__main__ import (  # noqa: E402
    expected_balances,
    make_transactions,
    out_of_order,
)
from examples.ledger.app import PREFIX, post  # noqa: E402
from examples.ledger.balances import apply  # noqa: E402
from queueflow.testing import RecordState, ShareAgentHarness  # noqa: E402

TRANSACTIONS, POSTINGS = f"{PREFIX}-transactions", f"{PREFIX}-postings"


def test_each_accounts_postings_come_out_once_and_in_order() -> None:
    txns = make_transactions(120, accounts=6)

    async def scenario() -> list[dict[str, Any]]:
        async with ShareAgentHarness(post, members=3, topics={TRANSACTIONS: 1, POSTINGS: 2}) as h:
            for txn in txns:
                h.put(txn, key=txn["account"].encode())
            assert (await h.run_until_idle(timeout_s=60)).done
            assert {r.state for r in h.records(topic=TRANSACTIONS)} == {RecordState.ACKNOWLEDGED}
            return [json.loads(r.value or b"") for r in h.sent(POSTINGS)]

    postings = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert sorted((p["account"], p["seq"]) for p in postings) == sorted(
        (t["account"], t["seq"]) for t in txns
    )
    assert out_of_order(postings) == 0
    state: dict[str, Any] = defaultdict(lambda: None)
    for posting in postings:
        state[posting["account"]] = apply(state[posting["account"]], posting)
    assert dict(state) == expected_balances(txns)


def test_out_of_order_postings_are_counted() -> None:
    posts = [{"account": "a", "seq": 2, "amount": 5}, {"account": "a", "seq": 1, "amount": -9}]
    assert out_of_order(posts) == 1
    assert apply(apply(None, posts[0]), posts[1])["out_of_order"] == 2  # both out of turn
