"""Leader takeover time after a crash (SIGKILL) and a planned move (SIGTERM), with the records
delivered more than once (a takeover redelivers nothing; docs/architecture.md).

Two ``queueflow leader`` workers with queueflow's default Faust group timeouts (session 10 s,
heartbeat 1 s; standby replicas 1, Faust's default) lead a 1-partition topic. A member consumes
and ACCEPTs continuously; the worker leading the share-partition gets SIGKILL (``kill`` rounds)
or SIGTERM (``term`` rounds). Per round it prints, from the signal:

* ``assigned``: the survivor is assigned the request partition (the group coordinator noticed
  the death: the session timeout dominates);
* ``live``: the survivor has read its own fence back and may hand out records;
* ``restored``: the share-partition's state is restored (from the standby copy);
* ``first record``: the member receives its first record from the survivor;
* ``redelivered``: records the member received more than once in the round (each extra
  delivery counts). The member keeps acknowledging what it holds across the move; the new
  leader keeps the old leader's acquisition locks, so this is 0 unless a lock elapsed.

Figures are printed, never asserted::

    python -m bench.bench_failover [--bootstrap HOST:PORT] [--rounds 3] [--moves kill,term]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections import Counter
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


#: Seconds the member keeps consuming after its first record from the survivor, to catch
#: redeliveries of what was in flight at the move.
AFTER_S = 5.0


async def one_round(bootstrap: str, tmp: Path, move: str = "kill") -> dict[str, float]:
    """One takeover; ``move`` is ``kill`` (SIGKILL, a crash) or ``term`` (SIGTERM, planned)."""
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
    seen: Counter[int] = Counter()
    try:
        await member.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 120
        while got < 500:
            assert time.monotonic() < deadline, "no records before the move"
            for r in await member.poll(timeout_ms=500):
                member.acknowledge(r, ACCEPT)
                seen[r.offset] += 1
                got += 1
        dead = latest_leader(workers, topic)
        survivor = next(w for w in workers if w is not dead)
        before = event_times(survivor, topic)
        if move == "kill":
            dead.kill()
        else:
            dead.worker.terminate()
        killed = time.time()
        first = None
        deadline = time.monotonic() + 120
        survivor_epoch = max(
            (int(e["leader_epoch"]) for e in survivor.events("leader_live")), default=-1
        )
        while first is None or time.time() < first + AFTER_S:
            assert time.monotonic() < deadline, "no record within 120 s of the move"
            records = await member.poll(timeout_ms=200)
            for r in records:
                member.acknowledge(r, ACCEPT)
                seen[r.offset] += 1
            live_now = max(
                (int(e["leader_epoch"]) for e in survivor.events("leader_live")), default=-1
            )
            if records and first is None and live_now > survivor_epoch:
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
            "redelivered": sum(n - 1 for n in seen.values() if n > 1),
            "records": len(seen),
        }
    finally:
        await member.close()
        for w in workers:
            w.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", help="an existing broker (default: start one)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per move")
    parser.add_argument(
        "--moves", default="kill,term", help="kill (SIGKILL), term (SIGTERM), comma-separated"
    )
    args = parser.parse_args()
    moves = [m for m in args.moves.split(",") if m]
    if not moves or any(m not in ("kill", "term") for m in moves):
        parser.error(f"--moves takes kill and/or term, got {args.moves!r}")
    with tempfile.TemporaryDirectory(prefix="qf-failover-") as tmp:
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            port, cport = find_free_ports(2)
            broker = LocalBroker(
                Path(tmp) / "broker", port=port, controller_port=cport, die_with_parent=True
            )
            broker.start(timeout_s=120)
            bootstrap = broker.bootstrap
        try:
            rounds: dict[str, list[dict[str, float]]] = {m: [] for m in moves}
            for i in range(args.rounds):
                for move in moves:
                    result = asyncio.run(one_round(bootstrap, Path(tmp), move))
                    rounds[move].append(result)
                    print(json.dumps({"move": move, "round": i + 1, **result}), flush=True)
        finally:
            if broker is not None:
                broker.stop(timeout_s=30)
    for move, results in rounds.items():
        summary = {k: round(statistics.median(r[k] for r in results), 3) for k in results[0]}
        summary["redelivered_total"] = sum(r["redelivered"] for r in results)
        print(json.dumps({"move": move, "median": summary, "faust_session_timeout_s": 10.0}))


if __name__ == "__main__":
    main()
