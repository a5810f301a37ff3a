"""The work-queue example (:mod:`examples.workqueue`) in the user test harness: retries with
back-off, RELEASE and dead letters, with more members than partitions."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import stamina

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ is not installed
    sys.path.insert(0, str(ROOT))

import queueflow  # noqa: E402
from examples.workqueue.__main__ import expected_fate, make_jobs  # noqa: E402
from examples.workqueue.app import ATTEMPTS, MAX_DELIVERIES, PREFIX, work  # noqa: E402
from queueflow.testing import RecordState, ShareAgentHarness  # noqa: E402

JOBS, RESULTS, DEAD = f"{PREFIX}-jobs", f"{PREFIX}-results", f"{PREFIX}-dead-letters"


def harness() -> ShareAgentHarness:
    return ShareAgentHarness(
        work,
        members=3,
        topics={JOBS: 2, RESULTS: 2, DEAD: 1},
        group_config={"share.delivery.count.limit": MAX_DELIVERIES + 2},
    )


def test_every_job_ends_in_exactly_one_result_or_one_dead_letter() -> None:
    jobs = make_jobs(40)

    async def scenario() -> None:
        async with harness() as h:
            refs = {job["id"]: h.put(job, key=str(job["id"]).encode()) for job in jobs}
            assert (await h.run_until_idle(timeout_s=30)).done
            results = Counter(json.loads(r.value)["id"] for r in h.sent(RESULTS))
            dead = Counter(json.loads(r.value)["id"] for r in h.dead_letters())
            for job in jobs:
                fate = expected_fate(job)
                assert (results[job["id"]], dead[job["id"]]) == (
                    (1, 0) if fate == "result" else (0, 1)
                ), job
            # a job that needs three deliveries was RELEASEd twice, then ACCEPTed
            ref = refs[5]  # flaky 5: attempts 1..5 fail, the 6th (third delivery) succeeds
            three = h.history(ref.offset, partition=ref.partition)
            assert three.outcome_types == [queueflow.RELEASE] * 2 + [queueflow.ACCEPT]
            assert three.state is RecordState.ACKNOWLEDGED
            # the dead letters say why, and come from REJECTs (Archived)
            reasons = {dict(r.headers)["queueflow.dead_letter.reason"] for r in h.dead_letters()}
            assert any(reason.startswith(b"gave up after 3 deliveries") for reason in reasons)
            assert any(reason.startswith(b"n must be an integer") for reason in reasons)

    with stamina.set_testing(True, attempts=ATTEMPTS):  # retries without waiting
        asyncio.run(scenario())
