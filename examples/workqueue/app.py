"""A work queue: jobs shared by any number of workers, retried with back-off when they fail
transiently, and sent to a dead-letter topic when they can't succeed.

Run a worker with ``faust -A examples.workqueue.app worker`` (``python -m examples.workqueue``
runs the whole example: a broker, jobs, three workers on a two-partition topic).

Per delivery, a job is tried up to twice with exponential back-off (stamina). If it still fails
transiently it is RELEASEd, so any worker gets it again (its delivery count goes up), and after
``MAX_DELIVERIES`` deliveries it is given up: REJECTed with a dead letter. An invalid job is
dead-lettered at once. Only an ACCEPTed job publishes its result; a RELEASEd one publishes
nothing, a REJECTed one only its dead letter (a copy of the job with
``queueflow.dead_letter.*`` headers saying why).
"""

from __future__ import annotations

import os
from typing import Any

import stamina

import queueflow
from queueflow import ACCEPT, REJECT, RELEASE, DeadLetter, Result, ShareRecord

PREFIX = os.environ.get("EXAMPLE_PREFIX", "workqueue")
#: Deliveries of a job that keeps failing before it is dead-lettered.
MAX_DELIVERIES = 3
#: Attempts per delivery (with back-off between them).
ATTEMPTS = 2

app = queueflow.App(
    f"{PREFIX}-app",
    broker=os.environ.get("EXAMPLE_BROKER", "kafka://127.0.0.1:9092"),
    share_settings={
        # Jobs enqueued before the first worker started are work too.
        "share.auto.offset.reset": "earliest",
        # Above MAX_DELIVERIES: the handler gives up first, with a dead letter.
        "group.share.delivery.count.limit": MAX_DELIVERIES + 2,
    },
)
jobs = app.topic(f"{PREFIX}-jobs", value_serializer="json")
results = app.topic(f"{PREFIX}-results", value_serializer="json")


class TransientError(Exception):
    """The job failed, but may succeed if tried again."""


class InvalidJob(ValueError):
    """The job can never succeed."""


def run_job(job: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The work itself: square ``job["n"]``. A job fails transiently on its first
    ``job["flaky"]`` attempts (``attempt`` counts from 1 across deliveries).

    Raises:
        InvalidJob: ``n`` is not an integer.
        TransientError: the attempt failed transiently.
    """
    n = job.get("n")
    if not isinstance(n, int):
        raise InvalidJob(f"n must be an integer, got {n!r}")
    if attempt <= job.get("flaky", 0):
        raise TransientError(f"attempt {attempt} of job {job['id']} failed")
    return {"id": job["id"], "square": n * n, "attempt": attempt}


@app.share_agent(jobs, group="workers", sink=[results], dead_letter=f"{PREFIX}-dead-letters")
async def work(record: ShareRecord) -> Any:
    job = record.value
    done_before = (record.delivery_count - 1) * ATTEMPTS  # attempts of earlier deliveries
    try:
        async for attempt in stamina.retry_context(
            on=TransientError, attempts=ATTEMPTS, wait_initial=0.05, wait_max=0.5
        ):
            with attempt:
                result = run_job(job, done_before + attempt.num)
    except InvalidJob as exc:
        return Result(REJECT, [DeadLetter(reason=str(exc))])
    except TransientError as exc:
        if record.delivery_count >= MAX_DELIVERIES:
            reason = f"gave up after {record.delivery_count} deliveries: {exc}"
            return Result(REJECT, [DeadLetter(reason=reason)])
        return RELEASE  # delivered again, to any worker
    return Result(ACCEPT, [result])
