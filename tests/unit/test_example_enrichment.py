"""The enrichment example (:mod:`examples.enrichment`) in the user test harness: an
exactly_once share agent, its results and dead letters committed with its outcomes, and a
member crashed with its transaction open publishing nothing."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ is not installed
    sys.path.insert(0, str(ROOT))

import queueflow  # noqa: E402
from examples.enrichment.__main__ import make_orders  # noqa: E402
from examples.enrichment.app import CUSTOMERS, PREFIX, enrich  # noqa: E402
from queueflow.testing import RecordState, ShareAgentHarness  # noqa: E402

ORDERS, ENRICHED, DEAD = f"{PREFIX}-orders", f"{PREFIX}-enriched", f"{PREFIX}-dead-letters"


def harness(members: int = 1, partitions: int = 2) -> ShareAgentHarness:
    return ShareAgentHarness(
        enrich, members=members, topics={ORDERS: partitions, ENRICHED: 2, DEAD: 1}
    )


def test_every_order_ends_in_exactly_one_result_or_one_dead_letter() -> None:
    orders = make_orders(50)

    async def scenario() -> None:
        async with harness(members=2) as h:
            assert h.settings.processing_guarantee.value == "exactly_once"
            assert all(m.transactions is not None for m in h.members)
            for order in orders:
                h.put(order, key=str(order["order"]).encode())
            assert (await h.run_until_idle(timeout_s=30)).done
            results = [json.loads(r.value or b"") for r in h.sent(ENRICHED)]
            dead = Counter(json.loads(r.value or b"")["order"] for r in h.dead_letters())
            enriched = Counter(r["order"] for r in results)
            for order in orders:
                known = order["customer"] in CUSTOMERS
                assert (enriched[order["order"]], dead[order["order"]]) == (
                    (1, 0) if known else (0, 1)
                ), order
            for result, record in zip(results, h.sent(ENRICHED), strict=True):
                assert result["region"] == CUSTOMERS[result["customer"]]["region"]
                assert record.key == result["customer"].encode()  # keyed by customer
            assert all(r.state is not None for r in h.records())
            assert {r.state for r in h.records()} == {
                RecordState.ACKNOWLEDGED,
                RecordState.ARCHIVED,
            }

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_member_crashed_with_its_transaction_open_publishes_nothing() -> None:
    async def scenario() -> None:
        # One partition: both members fetch it (with two, each has its own until the crashed
        # member's session expires).
        async with harness(members=2, partitions=1) as h:
            h.cluster.hold_commits()
            ref = h.put({"order": 1, "customer": "c1", "amount": 10}, key=b"1")
            await h.run_until_idle()
            assert h.cluster.commits_held == 1
            (delivery,) = h.history(ref.offset, partition=ref.partition).deliveries
            await h.stop_member(delivery.member, crash=True)
            h.cluster.release_commits()
            assert h.sent(ENRICHED) == []
            # The transaction timeout (10 s) aborts it; the 30 s lock then ends.
            await h.advance(31_000)
            (result,) = h.sent(ENRICHED)
            assert json.loads(result.value or b"")["order"] == 1
            record = h.history(ref.offset, partition=ref.partition)
            assert record.outcome_types == [queueflow.ACCEPT]
            assert [d.delivery_count for d in record.deliveries] == [1, 2]

    asyncio.run(asyncio.wait_for(scenario(), 60))
