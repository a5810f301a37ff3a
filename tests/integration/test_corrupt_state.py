"""A corrupt share-partition state record in the changelog, on the real broker: the leader
refuses that share-partition with a clear error and keeps serving the others."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from test_share_groups import LEADER_SETTINGS, consumer, poll_until, produce

from queueflow.errors import ErrorCode
from queueflow.protocol import topics
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

#: The refusal is checked as key=value text ("group=broken"): the worker logs in console format.
CONSOLE_LOGS = {"QUEUEFLOW_LOG_FORMAT": "console"}

RECORDS = 10


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (
            json.dumps({"v": 99, "t": "snapshot"}).encode(),
            "unknown share-partition state format version 99",
        ),
        (b"\x00not json", "corrupt share-partition state"),
    ],
    ids=["unknown-version", "garbage"],
)
def test_corrupt_state_is_refused_not_reset(
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    tmp_path: Path,
    value: bytes,
    problem: str,
) -> None:
    topic = topic_factory(1)
    app_id = f"qf-corrupt-{uuid.uuid4().hex[:8]}"
    asyncio.run(produce(kafka_bootstrap, topic, RECORDS))
    # A first worker creates the internal topics; then the state record is corrupted.
    LeaderWorker(
        app_id, [topic], kafka_bootstrap, tmp_path / "first", LEADER_SETTINGS
    ).start().stop()
    changelog = f"{app_id}-{topics.state_table(topic)}-changelog"

    asyncio.run(
        produce_records(kafka_bootstrap, changelog, [value], keys=[b"S/broken/0"], partition=0)
    )

    async def scenario() -> tuple[list[int], Exception | None, int]:
        broken = consumer(kafka_bootstrap, app_id, "broken")
        healthy = consumer(kafka_bootstrap, app_id, "healthy")
        await broken.subscribe([topic])
        await healthy.subscribe([topic])
        # Other share groups of the same partition are served ...
        served = await poll_until(healthy, lambda seen: len(seen) >= RECORDS)
        # ... the corrupt one is refused, every time, with the error naming it.
        deadline = time.monotonic() + 30
        got = 0
        while (topic, 0) not in broken.partition_errors:
            assert time.monotonic() < deadline, "no ShareFetch error within 30 s"
            got += len(await broken.poll(timeout_ms=500))
        got += len(await broken.poll(timeout_ms=1500))
        error = broken.partition_errors.get((topic, 0))
        await broken.close()
        await healthy.close()
        return sorted(r.offset for r in served), error, got

    with LeaderWorker(
        app_id, [topic], kafka_bootstrap, tmp_path / "second", LEADER_SETTINGS, env=CONSOLE_LOGS
    ) as leader:
        served, error, got = asyncio.run(scenario())
        log = leader.log_text()
    assert served == list(range(RECORDS))
    assert got == 0
    assert error is not None
    assert error.code is ErrorCode.CORRUPT_STATE  # type: ignore[attr-defined]
    assert problem in str(error)
    assert f"group=broken topic={topic} partition=0" in str(error)
    refused = [line for line in log.splitlines() if "share_partition_refused" in line]
    assert refused and "group=broken" in refused[0] and problem in refused[0]
