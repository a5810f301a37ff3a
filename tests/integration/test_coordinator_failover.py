"""The share-group coordinator is fenced the way leaders are, on the real broker: the worker that
hosts the coordinator is frozen (SIGSTOP) past its Faust session while members work, another
worker takes the coordinator over, and the frozen one, woken, steps down without having acted
as coordinator again; the members keep working throughout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from test_failover import (
    RECORDS,
    STALL_LIMIT_S,
    Ledger,
    members_under_way,
    start_pair,
    wait_for,
    work,
)
from test_share_groups import produce

from queueflow.testing import LeaderWorker

#: What the frozen coordinator must not do once woken (it is no longer the coordinator).
COORDINATOR_ACTIONS = ("member_session_expired", "share_group_epoch", "share_group_admin_request")


def coordinator_epoch(worker: LeaderWorker) -> int:
    """The newest coordinator epoch ``worker`` went live under (-1: never)."""
    return max((int(e["coordinator_epoch"]) for e in worker.events("coordinator_live")), default=-1)


def test_frozen_coordinator_steps_down_and_members_keep_working(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic, app_id, workers = start_pair("qf-coord-fence", topic_factory, kafka_bootstrap, tmp_path)
    try:

        async def scenario() -> tuple[Ledger, LeaderWorker, list[str]]:
            holder, worker, _held, ledger = await members_under_way(
                kafka_bootstrap, app_id, topic, "coord-fence"
            )
            frozen = max(workers, key=coordinator_epoch)
            successor = next(w for w in workers if w is not frozen)
            frozen_epoch = coordinator_epoch(frozen)
            assert frozen_epoch >= 0, frozen.log_tail()
            seen_before = len(frozen.events())
            frozen.pause()
            paused_at = time.monotonic()
            await wait_for(
                lambda: coordinator_epoch(successor) > frozen_epoch,
                "the other worker to take the coordinator over",
                60,
            )
            # The members heartbeat to the new coordinator and keep consuming.
            before = len(ledger.arrivals)
            await work(worker, ledger, lambda: len(ledger.arrivals) > before + 5, 90)
            await asyncio.sleep(max(0.0, paused_at + STALL_LIMIT_S + 2 - time.monotonic()))
            frozen.resume()
            await wait_for(
                lambda: bool(frozen.events("coordinator_stepped_down")),
                "the woken coordinator to step down",
                30,
            )
            await produce(kafka_bootstrap, topic, RECORDS)
            everything = set(range(2 * RECORDS))
            await work(worker, ledger, lambda: ledger.accepted >= everything, 120)
            await worker.close()
            await holder.close()
            # What the frozen worker did from its freeze until a rebalance (maybe) gave it the
            # coordinator partition again, under a new coordinator epoch.
            woken: list[str] = []
            for event in frozen.events()[seen_before:]:
                if event["event"] == "coordinator_assigned" and event["partitions"]:
                    break
                woken.append(event["event"])
            return ledger, frozen, woken

        ledger, frozen, woken = asyncio.run(scenario())
    finally:
        for w in workers:
            w.kill()
    step_down = frozen.events("coordinator_stepped_down")[0]
    print(f"\nstepped down: {step_down['reason']}")
    assert step_down["code"] == "FENCED_STATE_EPOCH"
    assert "stalled for" in step_down["reason"] or "taken over" in step_down["reason"]
    # Woken, it stepped down before acting as the coordinator: no expiry, no epoch bump, no
    # admin request (so no ReleaseMember or ResetSharePartition either).
    assert "coordinator_stepped_down" in woken
    assert not [e for e in woken if e in COORDINATOR_ACTIONS], woken
    assert ledger.accepted == set(range(2 * RECORDS))
