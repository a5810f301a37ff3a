"""Leader failover and fencing on the real broker: two ``queueflow leader`` workers, one of them
SIGKILLed or frozen with SIGSTOP while members in this process keep consuming."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_share_groups import LEADER_SETTINGS, MEMBER_SETTINGS, consumer, produce

from queueflow import ACCEPT, ShareConsumer, ShareRecord
from queueflow.testing import LeaderWorker

#: The leaders' Faust consumer group: a lost leader's partitions move after 6 s, and the
#: stall guard steps down after 6 + 1 s.
FAUST_ENV = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}
STALL_LIMIT_S = 7.0
RECORDS = 100
#: What the working member can hold at a leader change: the batch it is handling and the one
#: it prefetched (``max.poll.records`` each).
IN_FLIGHT_PER_CHANGE = 2 * int(MEMBER_SETTINGS["max.poll.records"])


def start_pair(
    prefix: str,
    topic_factory: Callable[..., str],
    bootstrap: str,
    tmp: Path,
    settings: Mapping[str, int | str] = LEADER_SETTINGS,
) -> tuple[str, str, list[LeaderWorker]]:
    """A 1-partition topic holding RECORDS records and two leader workers of a new app:
    ``(topic, app_id, workers)``."""
    topic = topic_factory(1)
    app_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    asyncio.run(produce(bootstrap, topic, RECORDS))
    workers = [
        LeaderWorker(app_id, [topic], bootstrap, tmp / name, settings, env=FAUST_ENV).start()
        for name in ("a", "b")
    ]
    return topic, app_id, workers


def current_leader(workers: list[LeaderWorker], topic: str) -> LeaderWorker:
    """The worker that became live on the topic's request partition in the latest generation."""
    best: tuple[int, LeaderWorker] | None = None
    for worker in workers:
        for event in worker.events("leader_live"):
            epoch = int(event["leader_epoch"])
            if event.get("topic") == topic and (best is None or epoch > best[0]):
                best = (epoch, worker)
    assert best is not None, "no worker became live: " + workers[0].log_tail()
    return best[1]


async def wait_for(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.2)


@dataclass
class Ledger:
    """What the working member saw: delivery counts per offset and when records arrived."""

    deliveries: dict[int, list[int]] = field(default_factory=dict)
    arrivals: list[float] = field(default_factory=list)

    @property
    def accepted(self) -> set[int]:
        return set(self.deliveries)

    def assert_only_in_flight_redelivered(self, in_flight: int) -> None:
        """At most ``in_flight`` records were delivered again (what the members held at the
        leader changes, their locks expired during the takeover), and every delivery had a
        higher delivery count than the one before: counts are never repeated (a changelog
        write is acknowledged before the acquisition is answered:
        ``queueflow.leader.state.durability=acked``) and never lower."""
        twice = {o: c for o, c in self.deliveries.items() if len(c) > 1}
        # A count may be skipped (a ShareFetch answer lost with its leader), never repeated.
        bad = {o: c for o, c in twice.items() if any(b <= a for a, b in itertools.pairwise(c))}
        assert not bad, bad
        assert len(twice) <= in_flight, twice


async def work(c: ShareConsumer, ledger: Ledger, until: Callable[[], bool], timeout_s: float):
    """Poll and ACCEPT until ``until()``, within a timeout."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, (
            f"timed out after {timeout_s} s with {len(ledger.accepted)} records accepted"
        )
        for record in await c.poll(timeout_ms=500):
            ledger.deliveries.setdefault(record.offset, []).append(record.delivery_count)
            ledger.arrivals.append(time.monotonic())
            c.acknowledge(record, ACCEPT)


async def members_under_way(
    bootstrap: str, app_id: str, topic: str, group: str
) -> tuple[ShareConsumer, ShareConsumer, set[int], Ledger]:
    """A holder member that acquired records and sits on them, and a working member that has
    accepted 20 records: the state a leader change should find."""
    holder, worker = consumer(bootstrap, app_id, group), consumer(bootstrap, app_id, group)
    await holder.subscribe([topic])
    await worker.subscribe([topic])
    held = await hold_some(holder)
    ledger = Ledger()
    await work(worker, ledger, lambda: len(ledger.accepted) >= 20, 60)
    return holder, worker, held, ledger


async def hold_some(c: ShareConsumer) -> set[int]:
    """Acquire records and never acknowledge them (the member stays alive)."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the holding member acquired nothing"
        records = await c.poll(timeout_ms=500)
        if records:
            return {r.offset for r in records}


def test_killed_leader_fails_over_and_acquired_records_become_available(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic, app_id, workers = start_pair("qf-failover", topic_factory, kafka_bootstrap, tmp_path)
    try:

        async def scenario() -> tuple[set[int], Ledger, float, LeaderWorker]:
            holder, worker, held, ledger = await members_under_way(
                kafka_bootstrap, app_id, topic, "failover"
            )
            dead = current_leader(workers, topic)
            dead.kill()
            killed_at = time.monotonic()
            before = len(ledger.arrivals)
            await work(worker, ledger, lambda: len(ledger.arrivals) > before, 90)
            takeover_s = ledger.arrivals[before] - killed_at
            everything = set(range(RECORDS))
            await work(worker, ledger, lambda: ledger.accepted >= everything, 90)
            await worker.close()
            await holder.close()
            return held, ledger, takeover_s, dead

        held, ledger, takeover_s, dead = asyncio.run(scenario())
    finally:
        for w in workers:
            w.kill()
    survivor = next(w for w in workers if w is not dead)
    print(f"\nleader takeover after SIGKILL: {takeover_s:.2f} s (Faust session timeout 6 s)")
    assert ledger.accepted == set(range(RECORDS))
    assert "share_partition_restored" in survivor.log_text()
    # What the dead leader had Acquired for the holder came back Available, counted once more.
    assert {o: ledger.deliveries[o] for o in held} == {o: [2] for o in held}
    ledger.assert_only_in_flight_redelivered(IN_FLIGHT_PER_CHANGE)


def test_frozen_leader_steps_down_and_its_successor_serves(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic, app_id, workers = start_pair("qf-fence", topic_factory, kafka_bootstrap, tmp_path)
    try:

        async def scenario() -> tuple[Ledger, LeaderWorker, set[int]]:
            holder, worker, held, ledger = await members_under_way(
                kafka_bootstrap, app_id, topic, "fence"
            )
            frozen = current_leader(workers, topic)
            frozen.pause()
            paused_at = time.monotonic()
            before = len(ledger.arrivals)
            # The successor serves while the old leader is frozen ...
            await work(worker, ledger, lambda: len(ledger.arrivals) > before, 90)
            # ... and the freeze outlasts the stall limit before the old leader wakes up.
            await asyncio.sleep(max(0.0, paused_at + STALL_LIMIT_S + 2 - time.monotonic()))
            frozen.resume()
            await wait_for(
                lambda: bool(frozen.events("leader_stepped_down")),
                "the woken leader to step down",
                30,
            )
            await produce(kafka_bootstrap, topic, RECORDS)  # offsets RECORDS .. 2*RECORDS-1
            everything = set(range(2 * RECORDS))
            await work(worker, ledger, lambda: ledger.accepted >= everything, 120)
            await worker.close()
            await holder.close()
            return ledger, frozen, held

        ledger, frozen, held = asyncio.run(scenario())
    finally:
        for w in workers:
            w.kill()
    step_down = next(
        line for line in frozen.log_text().splitlines() if "leader_stepped_down" in line
    )
    assert "FENCED_STATE_EPOCH" in step_down
    assert "stalled for" in step_down
    assert ledger.accepted == set(range(2 * RECORDS))
    # Held records came back once the successor took over; the old leader's return moves the
    # partition again (Faust's eager rebalance), so what was in flight then comes back too.
    assert {o: ledger.deliveries[o][0] for o in held} == dict.fromkeys(held, 2)
    ledger.assert_only_in_flight_redelivered(2 * (IN_FLIGHT_PER_CHANGE + len(held)))


#: The takeover tests' lock (15 s) outlasts a SIGKILLed leader's takeover (the 6 s Faust
#: session timeout and the restore, ~7 s).
LONG_LOCK_MS = 15000
LONG_LOCK_SETTINGS = {**LEADER_SETTINGS, "group.share.record.lock.duration.ms": LONG_LOCK_MS}


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_takeover_within_the_lock_redelivers_nothing(
    how: str, kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """The leader is stopped (SIGTERM, a planned move) or SIGKILLed while the member holds an
    acquired, unacknowledged batch (and what it prefetched). The successor restores the locks
    (docs/concepts.md): the member's ACCEPT of that batch, sent after the change, is taken, and
    every record is delivered exactly once, with delivery count 1."""
    topic, app_id, workers = start_pair(
        f"qf-takeover-{how}", topic_factory, kafka_bootstrap, tmp_path, LONG_LOCK_SETTINGS
    )
    try:

        async def scenario() -> tuple[Ledger, list[int], float]:
            worker = consumer(kafka_bootstrap, app_id, "takeover")
            await worker.subscribe([topic])
            ledger = Ledger()
            await work(worker, ledger, lambda: len(ledger.accepted) >= 20, 60)
            held: list[ShareRecord] = []
            deadline = time.monotonic() + 60
            while not held:
                assert time.monotonic() < deadline, "nothing acquired"
                held = await worker.poll(timeout_ms=500)
            for record in held:
                ledger.deliveries.setdefault(record.offset, []).append(record.delivery_count)
            old = current_leader(workers, topic)
            changed_at = time.monotonic()
            if how == "sigkill":
                old.kill()
            else:
                old.worker.terminate()  # a graceful stop: its partitions move at once
            # The held batch is acknowledged to the successor, once it is live and the old
            # leader is gone.
            await wait_for(lambda: not old.worker.alive(), "the old leader to exit", 60)
            await wait_for(
                lambda: current_leader(workers, topic) is not old, "the successor to be live", 60
            )
            live_s = time.monotonic() - changed_at
            for record in held:
                worker.acknowledge(record, ACCEPT)
            await work(worker, ledger, lambda: ledger.accepted >= set(range(RECORDS)), 90)
            done_s = time.monotonic() - changed_at
            await worker.close()
            return ledger, [r.offset for r in held], live_s, done_s

        ledger, held, live_s, done_s = asyncio.run(scenario())
    finally:
        for w in workers:
            w.kill()
    print(f"\n{how}: successor live {live_s:.1f} s after the change, all done at {done_s:.1f} s")
    assert held and live_s < LONG_LOCK_MS / 1000, live_s  # the batch's lock outlasted it
    assert ledger.accepted == set(range(RECORDS))
    assert {o: c for o, c in ledger.deliveries.items() if c != [1]} == {}
