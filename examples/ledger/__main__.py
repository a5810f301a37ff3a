"""``python -m examples.ledger``: a per-account ledger with key-ordered sharing, exactly once,
run for real, with a SIGKILL.

Starts a local broker (or uses ``$QUEUEFLOW_BROKER``), enqueues ``--transactions`` account
transactions (deposits and withdrawals, keyed by account) on a two-partition topic, runs two
queueflow workers (roles ``all`` and ``member``, 8 handler tasks each) and the balances worker
(:mod:`examples.ledger.balances`), SIGKILLs the ``member`` worker once a third of the postings
are out and starts it again. Then it checks, as a downstream application reading
read_committed: every transaction has exactly one posting, each account's postings are in
``seq`` order, and the balances table (its changelog) holds each account's balance as if its
transactions were applied one by one in order (withdrawals beyond the balance declined).
Prints one JSON line; exit status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from examples.ledger.balances import apply
from examples.runner import ExampleRun, Output
from queueflow.devtools.broker import create_topic

__all__ = ["expected_balances", "main", "make_transactions", "out_of_order"]


def make_transactions(count: int, accounts: int = 20, seed: int = 7) -> list[dict[str, Any]]:
    """``count`` transactions over ``accounts`` accounts, each account's numbered from 1."""
    rng = random.Random(seed)
    seqs: Counter[str] = Counter()
    out = []
    for _ in range(count):
        account = f"a{rng.randrange(accounts)}"
        seqs[account] += 1
        amount = rng.choice([1, -1]) * rng.randrange(10, 500)
        out.append({"account": account, "seq": seqs[account], "amount": amount})
    return out


def expected_balances(txns: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """account -> its state after its transactions, applied in order."""
    state: dict[str, dict[str, Any]] = {}
    for txn in txns:
        state[txn["account"]] = apply(state.get(txn["account"]), txn)
    return state


def out_of_order(postings: Sequence[dict[str, Any]]) -> int:
    """Postings whose ``seq`` is not above their account's previous posting's."""
    last: dict[str, int] = defaultdict(int)
    bad = 0
    for posting in postings:
        if posting["seq"] <= last[posting["account"]]:
            bad += 1
        last[posting["account"]] = posting["seq"]
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.ledger", description=__doc__)
    ap.add_argument("--transactions", type=int, default=600)
    ap.add_argument("--accounts", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args(argv)
    txns = make_transactions(args.transactions, args.accounts)
    want = expected_balances(txns)
    with ExampleRun("ledger") as run:
        topics = {name: run.topic(name, 2) for name in ("transactions", "postings")}
        changelog = f"{run.prefix}-balances-balances-changelog"  # Faust's name for the table's
        create_topic(run.bootstrap, changelog, 2, config={"cleanup.policy": "compact"})
        run.produce(topics["transactions"], [(t["account"], t) for t in txns])
        run.say(f"enqueued {len(txns)} transactions of {len(want)} accounts; starting workers")
        run.worker("examples.ledger.balances")
        run.worker("examples.ledger.app", "all")
        member = run.worker("examples.ledger.app", "member")
        killed: list[int] = []

        def kill_once(out: Mapping[str, list[Output]]) -> None:
            if not killed and len(out[topics["postings"]]) >= len(txns) // 3:
                killed.append(member.pid or 0)
                run.say(f"SIGKILL the member worker (pid {member.pid}) and start it again")
                member.kill()
                member.start()

        def latest(out: Mapping[str, list[Output]]) -> dict[str, Any]:
            return {key: value for key, value, _ in out.get(changelog, [])}

        def done(out: Mapping[str, list[Output]]) -> bool:
            kill_once(out)
            seen = latest(out)
            return len(out[topics["postings"]]) >= len(txns) and all(
                (seen.get(account) or {}).get("seq") == state["seq"]
                for account, state in want.items()
            )

        out = run.read_until({topics["postings"]: 2, changelog: 2}, done, args.timeout)
        postings = [value for _, value, _ in out[topics["postings"]]]
        counts = Counter((p["account"], p["seq"]) for p in postings)
        duplicates = sum(n - 1 for n in counts.values() if n > 1)
        by_partition: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for posting in postings:  # read in order per partition; an account is on one
            by_partition[posting["account"]].append(posting)
        disorder = sum(out_of_order(ps) for ps in by_partition.values())
        summary = {
            "transactions": len(txns),
            "accounts": len(want),
            "postings": len(postings),
            "duplicates": duplicates,
            "out_of_order": disorder,
            "balances_exact": latest(out) == want,
            "declined": sum(s["declined"] for s in want.values()),
            "kills": len(killed),
            "seconds": run.seconds,
        }
        print(json.dumps(summary), flush=True)
        return 0 if summary["balances_exact"] and not duplicates and not disorder else 1


if __name__ == "__main__":
    sys.exit(main())
