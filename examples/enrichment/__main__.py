"""``python -m examples.enrichment``: enrichment exactly once, run for real, with a SIGKILL.

Starts a local broker (or uses ``$QUEUEFLOW_BROKER``), enqueues ``--orders`` orders on a
two-partition topic, runs two queueflow workers (roles ``all`` and ``member``) and the totals
worker (:mod:`examples.enrichment.totals`), SIGKILLs the ``member`` worker once a third of the
results are out and starts it again. Then it checks, as a downstream application reading
read_committed: every order of a known customer has exactly one enriched result, every other
order exactly one dead letter, and the totals table (its changelog) holds each customer's
exact spend and order count. Prints one JSON line; exit status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from examples.enrichment.app import CUSTOMERS
from examples.runner import ExampleRun, Output
from queueflow.devtools.broker import create_topic

__all__ = ["expected_totals", "main", "make_orders"]


def make_orders(count: int) -> list[dict[str, Any]]:
    """``count`` orders over the known customers; every 25th names an unknown one."""
    return [
        {"order": i, "customer": "c99" if i % 25 == 24 else f"c{i % 8}", "amount": 100 + i}
        for i in range(count)
    ]


def expected_totals(orders: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """customer -> {"spend", "orders"} over the orders of known customers."""
    totals: dict[str, dict[str, int]] = {}
    for order in orders:
        if order["customer"] in CUSTOMERS:
            entry = totals.setdefault(order["customer"], {"spend": 0, "orders": 0})
            entry["spend"] += order["amount"]
            entry["orders"] += 1
    return totals


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.enrichment", description=__doc__)
    ap.add_argument("--orders", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args(argv)
    orders = make_orders(args.orders)
    want = expected_totals(orders)
    valid = sum(entry["orders"] for entry in want.values())
    with ExampleRun("enrichment") as run:
        topics = {name: run.topic(name, 2) for name in ("orders", "enriched", "dead-letters")}
        changelog = f"{run.prefix}-totals-totals-changelog"  # Faust's name for the table's
        create_topic(run.bootstrap, changelog, 2, config={"cleanup.policy": "compact"})
        run.produce(topics["orders"], [(order["order"], order) for order in orders])
        run.say(f"enqueued {len(orders)} orders; starting 2 queueflow workers and the totals one")
        run.worker("examples.enrichment.totals")
        run.worker("examples.enrichment.app", "all")
        member = run.worker("examples.enrichment.app", "member")
        killed: list[int] = []

        def kill_once(out: Mapping[str, list[Output]]) -> None:
            if not killed and len(out[topics["enriched"]]) >= valid // 3:
                killed.append(member.pid or 0)
                run.say(f"SIGKILL the member worker (pid {member.pid}) and start it again")
                member.kill()
                member.start()

        def done(out: Mapping[str, list[Output]]) -> bool:
            kill_once(out)
            latest = {key: value for key, value, _ in out.get(changelog, [])}
            return (
                len(out[topics["enriched"]]) >= valid
                and len(out[topics["dead-letters"]]) >= len(orders) - valid
                and latest == want
            )

        out = run.read_until(
            {topics["enriched"]: 2, topics["dead-letters"]: 2, changelog: 2}, done, args.timeout
        )
        results = Counter(value["order"] for _, value, _ in out[topics["enriched"]])
        dead = Counter(value["order"] for _, value, _ in out[topics["dead-letters"]])
        duplicates = sum(n - 1 for n in results.values() if n > 1)
        summary = {
            "orders": len(orders),
            "enriched": sum(results.values()),
            "duplicates": duplicates,
            "dead_letters": sum(dead.values()),
            "customers": len(want),
            "totals_exact": True,
            "kills": len(killed),
            "seconds": run.seconds,
        }
        print(json.dumps(summary), flush=True)
        return 1 if duplicates else 0


if __name__ == "__main__":
    sys.exit(main())
