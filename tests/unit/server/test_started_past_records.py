"""A group that starts at ``latest`` with records already in the partition says so once,
naming the records skipped and the setting that changes it (the README example's pitfall)."""

from __future__ import annotations

import asyncio

from queueflow.structs import ShareRecord
from queueflow.testing import ShareAgentHarness


async def handler(record: ShareRecord) -> None:
    return None


def skipped_logs(reset: str) -> tuple[list[dict[str, object]], int]:
    async def scenario() -> tuple[list[dict[str, object]], int]:
        h = ShareAgentHarness(
            handler, topic="jobs", group="g", group_config={"share.auto.offset.reset": reset}
        )
        for _ in range(5):  # before the group's first fetch
            h.put(b"job")
        async with h:
            await h.run_until_idle()
            h.put(b"later")
            assert (await h.run_until_idle()).done
            logs = [e for e in h.logs if e.get("event") == "share_partition_started_past_records"]
            return logs, sum(1 for r in h.records() if r.deliveries)

    return asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_group_starting_at_latest_logs_the_records_it_skips() -> None:
    logs, handled = skipped_logs("latest")
    (logged,) = logs
    assert logged["records_skipped"] == 5 and logged["auto_offset_reset"] == "latest"
    assert "share.auto.offset.reset=earliest" in str(logged["note"])
    assert handled == 1  # only the record produced after the start


def test_a_group_starting_at_earliest_skips_nothing_and_says_nothing() -> None:
    logs, handled = skipped_logs("earliest")
    assert logs == [] and handled == 6
