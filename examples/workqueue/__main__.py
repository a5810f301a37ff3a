"""``python -m examples.workqueue``: the work queue, run for real.

Starts a local broker (or uses ``$QUEUEFLOW_BROKER``), enqueues ``--jobs`` jobs on a
two-partition topic, runs three workers (more workers than partitions: two with role ``all``,
one ``member``), reads the results and dead-letter topics as a downstream application would
(read_committed) and checks them against what each job must do: every valid job that succeeds
within ``MAX_DELIVERIES`` deliveries has exactly one result, every other job exactly one dead
letter. Prints one JSON line; exit status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from examples.runner import ExampleRun
from examples.workqueue.app import ATTEMPTS, MAX_DELIVERIES

__all__ = ["expected_fate", "main", "make_jobs"]


def make_jobs(count: int) -> list[dict[str, Any]]:
    """``count`` jobs: every tenth is invalid, the others fail transiently ``id % 8`` times."""
    return [
        {"id": i, "n": "not a number" if i % 10 == 9 else i, "flaky": i % 8} for i in range(count)
    ]


def expected_fate(job: dict[str, Any]) -> str:
    """``"result"`` or ``"dead"``: what must become of ``job``."""
    if not isinstance(job["n"], int) or job["flaky"] >= ATTEMPTS * MAX_DELIVERIES:
        return "dead"
    return "result"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.workqueue", description=__doc__)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args(argv)
    jobs = make_jobs(args.jobs)
    with ExampleRun("workqueue") as run:
        topics = {name: run.topic(name, 2) for name in ("jobs", "results", "dead-letters")}
        run.produce(topics["jobs"], [(job["id"], job) for job in jobs])
        run.say(f"enqueued {len(jobs)} jobs to {topics['jobs']}; starting 3 workers")
        for role in ("all", "all", "member"):
            run.worker("examples.workqueue.app", role)
        out = run.read_until(
            {topics["results"]: 2, topics["dead-letters"]: 2},
            lambda o: sum(len(v) for v in o.values()) >= len(jobs),
            args.timeout,
        )
        results = Counter(value["id"] for _, value, _ in out[topics["results"]])
        dead = Counter(value["id"] for _, value, _ in out[topics["dead-letters"]])
        reasons = Counter(
            headers.get("queueflow.dead_letter.reason", "?").split(":")[0]
            for _, _, headers in out[topics["dead-letters"]]
        )
        want = {job["id"]: expected_fate(job) for job in jobs}
        wrong = [
            i
            for i, fate in want.items()
            if (results[i], dead[i]) != ((1, 0) if fate == "result" else (0, 1))
        ]
        summary = {
            "jobs": len(jobs),
            "results": sum(results.values()),
            "dead_letters": sum(dead.values()),
            "dead_letter_reasons": dict(reasons),
            "wrong": len(wrong),
            "seconds": run.seconds,
        }
        if wrong:
            run.say(f"CHECK FAILED for jobs {wrong[:10]}")
        print(json.dumps(summary), flush=True)
        return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
