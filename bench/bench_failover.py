"""Leader takeover time after a SIGKILL (issue "Nothing lost", item 3).

Two ``queueflow leader`` workers with queueflow's default Faust group timeouts (session 10 s,
heartbeat 1 s; standby replicas 1, Faust's default) lead a 1-partition topic. A member consumes
and ACCEPTs continuously; the worker leading the share-partition gets SIGKILL. Per round it
prints, from the kill:

* ``assigned``: the survivor is assigned the request partition (the group coordinator noticed
  the death: the session timeout dominates);
* ``live``: the survivor has read its own fence back and may hand out records;
* ``restored``: the share-partition's state is restored (from the standby copy);
* ``first record``: the member receives its first record from the survivor.

Figures are printed, never asserted::

    python -m bench.bench_failover [--bootstrap HOST:PORT] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from queueflow import ACCEPT, ShareConsumer
from queueflow.devtools.broker import LocalBroker, create_topic, find_free_ports
from queueflow.testing import LeaderWorker, event_time, produce

SETTINGS = {"share.auto.offset.reset": "earliest"}
MEMBER = {"group.share.heartbeat.interval.ms": 1000, "max.poll.records": 50}
RECORDS = 200_000


#: The leader events whose times are reported (from the worker's JSON log lines).
LEADER_EVENTS = ("leader_assigned", "leader_live", "share_partition_restored")


def event_times(worker: LeaderWorker, topic: str) -> dict[str, list[float]]:
    """Wall-clock times of the worker's leader events for ``topic`` (their JSON timestamps)."""
    times: dict[str, list[float]] = {}
    for event in worker.events():
        if event["event"] in LEADER_EVENTS and event.get("topic") == topic:
            times.setdefault(event["event"], []).append(event_time(event))
    return times


def latest_leader(workers: list[LeaderWorker], topic: str) -> LeaderWorker:
    """The worker that became live on ``topic`` with the highest leader epoch."""
    live = [
        (int(event["leader_epoch"]), w)
        for w in workers
        for event in w.events("leader_live")
        if event.get("topic") == topic
    ]
    return max(live, key=lambda epoch_worker: epoch_worker[0])[1]


async def one_round(bootstrap: str, tmp: Path) -> dict[str, float]:
    topic = f"bench-failover-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 1)
    await produce(bootstrap, topic, [b"x" * 100] * 20_000, linger_ms=20)
    app_id = f"bench-failover-{uuid.uuid4().hex[:6]}"
    workers = [
        LeaderWorker(app_id, [topic], bootstrap, tmp / f"{app_id}-{n}", SETTINGS).start()
        for n in ("a", "b")
    ]
    member = ShareConsumer(
        "bench",
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode="explicit",
        settings=MEMBER,
    )
    try:
        await member.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 120
        while got < 500:
            assert time.monotonic() < deadline, "no records before the kill"
            for r in await member.poll(timeout_ms=500):
                member.acknowledge(r, ACCEPT)
                got += 1
        dead = latest_leader(workers, topic)
        survivor = next(w for w in workers if w is not dead)
        before = event_times(survivor, topic)
        dead.kill()
        killed = time.time()
        first = None
        deadline = time.monotonic() + 120
        while first is None:
            assert time.monotonic() < deadline, "no record within 120 s of the kill"
            records = await member.poll(timeout_ms=200)
            for r in records:
                member.acknowledge(r, ACCEPT)
            if records:
                first = time.time()
        after = event_times(survivor, topic)

        def since_kill(name: str) -> float:
            new = [t for t in after.get(name, []) if t not in before.get(name, [])]
            return round(min(new) - killed, 3) if new else float("nan")

        return {
            "assigned_s": since_kill("leader_assigned"),
            "live_s": since_kill("leader_live"),
            "restored_s": since_kill("share_partition_restored"),
            "first_record_s": round(first - killed, 3),
        }
    finally:
        await member.close()
        for w in workers:
            w.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", help="an existing broker (default: start one)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qf-failover-") as tmp:
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            port, cport = find_free_ports(2)
            broker = LocalBroker(Path(tmp) / "broker", port=port, controller_port=cport)
            broker.start(timeout_s=120)
            bootstrap = broker.bootstrap
        try:
            rounds = []
            for i in range(args.rounds):
                result = asyncio.run(one_round(bootstrap, Path(tmp)))
                rounds.append(result)
                print(json.dumps({"round": i + 1, **result}), flush=True)
        finally:
            if broker is not None:
                broker.stop(timeout_s=30)
    summary = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    print(json.dumps({"median": summary, "faust_session_timeout_s": 10.0}))


if __name__ == "__main__":
    main()
