"""The exactly-once check of a chaos run (``--exactly-once``): results counted downstream.

In that mode the share agent publishes one result per ACCEPTed record (the record's id) to
``<topic>-results`` with ``processing_guarantee="exactly_once"``. After the run the results topic
is read as a downstream application would, with ``isolation_level="read_committed"``, and each
id's results are counted against the handlers' ledger:

* ``results_duplicates``: ids with more than one committed result (target 0);
* ``results_missing``: ids whose last handled delivery ended in ACCEPT without a committed
  result (target 0);
* ``results_unexpected``: ids with a committed result although no delivery of theirs ended in
  ACCEPT last (a result of a RELEASEd, raised or REJECTed delivery; target 0).

A handler may see a record more than once (its member was killed before the transaction
committed); only its committed results count.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from examples.chaos.ledger import Ledger

__all__ = ["check_results", "read_results", "results_topic"]


def results_topic(topic: str) -> str:
    """The results topic of the chaos topic ``topic``."""
    return f"{topic}-results"


async def read_results(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 120.0
) -> Counter[int]:
    """Committed results per id in ``topic`` (``partitions`` partitions; read_committed, from
    the start to the end offsets taken when called).

    Raises:
        TimeoutError: the end was not reached within ``timeout_s``.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    counts: Counter[int] = Counter()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        # read_committed: the end offsets are the last stable offsets (nothing is open now).
        ends = await consumer.end_offsets(tps)

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in tps])

        async def drain() -> None:
            while await behind():
                batches = await consumer.getmany(*tps, timeout_ms=500)
                for records in batches.values():
                    for record in records:
                        counts[int(record.value)] += 1

        await asyncio.wait_for(drain(), timeout_s)
    finally:
        await consumer.stop()
    return counts


def check_results(ledger: Ledger, counts: Counter[int], records: int) -> dict[str, Any]:
    """The exactly-once counts of a run (see the module docstring) with up to 10 sample ids of
    each kind."""
    duplicates, missing, unexpected = [], [], []
    for record_id in range(records):
        lines = sorted(ledger.lines.get(record_id, []), key=lambda e: e["t"])
        accepted_last = bool(lines) and lines[-1]["o"] == "ACCEPT"
        n = counts.get(record_id, 0)
        if n > 1:
            duplicates.append(record_id)
        if accepted_last and n == 0:
            missing.append(record_id)
        if n and not accepted_last:
            unexpected.append(record_id)
    return {
        "results_records": sum(counts.values()),
        "results_ids": len(counts),
        "results_duplicates": len(duplicates),
        "results_missing": len(missing),
        "results_unexpected": len(unexpected),
        "results_duplicates_sample": duplicates[:10],
        "results_missing_sample": missing[:10],
        "results_unexpected_sample": unexpected[:10],
    }
