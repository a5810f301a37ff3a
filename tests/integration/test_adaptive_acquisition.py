"""Adaptive acquisition on the real broker (docs/concepts.md "Adaptive acquisition"): a member
whose handlers are slower than their call time suggests holds no more records than it starts
within their locks, so none expires in its queue and every record is delivered once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_share_agent import _get, agent_worker, produce, wait_for_ledger

RECORDS = 120


def _sum(text: str, name: str, group: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("group") == group
    )


def test_a_member_blocking_its_loop_holds_only_what_it_starts_within_the_locks(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """100 ms handler calls that block the event loop, 4 handler tasks, 2 s locks, 120 records
    on one partition: 10 records/s, where the call time says 40/s (enough for 40 records per
    half lock). Sized from the call time, the queue holds records past their locks; sized from
    the measured rate, no lock expires in the queue and every record is delivered once."""
    topic = topic_factory(1)
    asyncio.run(produce(kafka_bootstrap, topic, count=RECORDS, junk=False))
    with agent_worker(
        "tests.integration.busy_loop_agent_app", topic, kafka_bootstrap, tmp_path
    ) as (worker, ledger, log, web_port):
        lines = wait_for_ledger(
            worker, ledger, log, lambda x: {e["i"] for e in x} >= set(range(RECORDS))
        )
        metrics = _get(f"http://127.0.0.1:{web_port}/metrics")
    expired = _sum(metrics, "queueflow_records_lock_expired_unhandled_total", "busy")
    counts = Counter(e["delivery_count"] for e in lines)
    assert expired == 0, (expired, counts)
    assert counts == {1: RECORDS}, counts  # each handled once, on its first delivery
    assert "acquisition_lock_expired_before_handling" not in log.read_text()
