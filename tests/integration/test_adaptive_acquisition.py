"""Adaptive acquisition on the real broker (docs/concepts.md "Adaptive acquisition"): a member
whose handlers slow down holds no more records than it starts within their locks, so none
expires in its queue and every record is handled once, on its first delivery."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_share_agent import _get, agent_worker, produce, wait_for_ledger

FAST, SLOW = 400, 120


def _sum(text: str, name: str, group: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("group") == group
    )


def test_handlers_that_slow_down_let_no_lock_expire_in_the_queue(
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """400 records that take no time, then 120 that take 150 ms each, on one partition, 4
    handler tasks, 2 s locks. The fast records grow the batches; when the handlers slow down
    (27 records/s), what is queued by then takes longer than the lock to start. With the
    handling rate followed within a few calls and the records that would not start in time
    given back early (undelivered), no lock expires in the queue and every record is handled
    once with delivery count 1."""
    monkeypatch.setenv("AGENT_FAST", str(FAST))
    topic = topic_factory(1)
    total = FAST + SLOW
    asyncio.run(produce(kafka_bootstrap, topic, count=total, junk=False))
    with agent_worker("tests.integration.slowing_agent_app", topic, kafka_bootstrap, tmp_path) as (
        worker,
        ledger,
        log,
        web_port,
    ):
        lines = wait_for_ledger(
            worker, ledger, log, lambda x: {e["i"] for e in x} >= set(range(total))
        )
        metrics = _get(f"http://127.0.0.1:{web_port}/metrics")
    expired = _sum(metrics, "queueflow_records_lock_expired_unhandled_total", "slowing")
    given_back = _sum(metrics, "queueflow_records_given_back_unstarted_total", "slowing")
    counts = Counter(e["delivery_count"] for e in lines)
    handled = Counter(e["i"] for e in lines)
    assert expired == 0, (expired, given_back, counts)
    assert counts == {1: total}, (counts, given_back)  # each handled once, first delivery
    assert set(handled.values()) == {1}
    assert "acquisition_lock_expired_before_handling" not in log.read_text()
