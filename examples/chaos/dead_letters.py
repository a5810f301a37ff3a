"""The dead-letter check of a chaos run: every record the group archived is in its DLQ.

The run gives the group a dead-letter topic, ``<topic>-dlq`` (``errors.deadletterqueue.
topic.name``, with ``errors.deadletterqueue.copy.record.enable=true``, so each DLQ record's value
is the id). After the run the DLQ is read to its end and checked against the ledger and the
leaders' state:

* ``archived``: ids the group archived: the last delivery in the ledger was REJECTed, or failed
  (RELEASE/raise) at the delivery count limit, or the leaders' state says Archived at the limit
  (deliveries no handler saw);
* ``in_dlq``: of those, the ids found in the DLQ; ``dlq_missing`` = ``archived - in_dlq``
  (target 0);
* ``dlq_extra``: ids in the DLQ whose last delivery was ACCEPTed (a REJECT whose ACCEPTed
  redelivery followed, or an ACCEPT that never reached the leader);
* ``dlq_duplicates``: ids in the DLQ more than once (the DLQ is at least once).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from examples.chaos.config import FAILED
from examples.chaos.leader_state import ARCHIVED_AT_LIMIT
from examples.chaos.ledger import Ledger

__all__ = [
    "archived_ids",
    "check_dead_letters",
    "dead_letter_topic",
    "read_dead_letters",
    "wait_for_dead_letters",
]


def dead_letter_topic(topic: str) -> str:
    """The dead-letter topic of the chaos topic ``topic``."""
    return f"{topic}-dlq"


def archived_ids(
    ledger: Ledger, records: int, limit: int, settled: Mapping[int, str] | None = None
) -> set[int]:
    """The ids the group archived, by the ledger's last delivery of each (and the leaders'
    state for ids the ledger leaves open)."""
    out: set[int] = set()
    for i in range(records):
        lines = ledger.lines.get(i)
        if lines:
            last = max(lines, key=lambda e: e["t"])
            if last["o"] == "REJECT" or (last["o"] in FAILED and int(last["dc"]) >= limit):
                out.add(i)
                continue
        if settled is not None and settled.get(i) == ARCHIVED_AT_LIMIT:
            out.add(i)
    return out


async def read_dead_letters(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 120.0
) -> Counter[int]:
    """DLQ records per id in ``topic`` (from the start to the end offsets taken when called).

    Raises:
        TimeoutError: the end was not reached within ``timeout_s``.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    counts: Counter[int] = Counter()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to its end within {timeout_s} s")
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    if r.value is not None and r.value.isdigit():
                        counts[int(r.value)] += 1
    finally:
        await consumer.stop()
    return counts


def check_dead_letters(archived: set[int], counts: Counter[int]) -> dict[str, Any]:
    """The figures of the module docstring."""
    in_dlq = {i for i in archived if counts[i]}
    missing = sorted(archived - in_dlq)
    return {
        "archived": len(archived),
        "in_dlq": len(in_dlq),
        "dlq_missing": len(missing),
        "dlq_extra": len(set(counts) - archived),
        "dlq_duplicates": sum(1 for n in counts.values() if n > 1),
        "dlq_missing_sample": missing[:20],
    }


def wait_for_dead_letters(
    bootstrap: str, topic: str, partitions: int, expected: set[int], timeout_s: float
) -> None:
    """Wait (workers still running) until the DLQ holds every id of ``expected``, at most
    ``timeout_s``: the leaders write a record archived at the end of the run within a round."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts = asyncio.run(read_dead_letters(bootstrap, topic, partitions))
        if expected <= set(counts):
            return
        time.sleep(1.0)
