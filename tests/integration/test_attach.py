"""``queueflow.attach`` (docs/guide.md "Existing Faust apps") on the real broker: a plain
``faust.App`` with a share agent and its own Faust agent, as one worker (role ``all``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from test_share_agent import agent_worker, wait_for_ledger

from queueflow.devtools.broker import create_topic
from queueflow.testing import produce as produce_records

RECORDS = 20


def test_attach_adds_share_groups_to_an_existing_faust_app(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """Every share record is handled once by the attached share agent, the app's own agent
    still reads its topic, and SIGTERM drains the share agent (``attach`` hooks the app's
    stop) and the worker exits 0."""
    topic = topic_factory(2)
    create_topic(kafka_bootstrap, f"{topic}-plain", 1)

    async def produce() -> None:
        await produce_records(
            kafka_bootstrap, topic, [f"s{i}" for i in range(RECORDS)], partitions=2
        )
        await produce_records(kafka_bootstrap, f"{topic}-plain", ["p0", "p1", "p2"])

    asyncio.run(produce())
    with agent_worker("tests.integration.attach_app", topic, kafka_bootstrap, tmp_path) as (
        worker,
        ledger,
        log,
        _web_port,
    ):
        lines = wait_for_ledger(
            worker,
            ledger,
            log,
            lambda x: sum("share" in e for e in x) >= RECORDS and sum("plain" in e for e in x) >= 3,
        )
    code = worker.wait(timeout=60)
    text = log.read_text()
    handled = Counter(e["share"] for e in lines if "share" in e)
    assert handled == Counter(f"s{i}" for i in range(RECORDS)), handled
    assert {e["delivery_count"] for e in lines if "share" in e} == {1}
    assert sorted(e["plain"] for e in lines if "plain" in e) == ["p0", "p1", "p2"]
    assert "share_agent_drained" in text, text[-3000:]
    assert code == 0, text[-3000:]
