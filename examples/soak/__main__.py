"""``make soak``: a long run under steady load and SIGKILLs; nothing lost, nothing growing
(docs/operations.md).

1. start a local broker, then the chaos workers (:mod:`examples.chaos.app`; 2 ``all`` and 4
   ``member`` by default) on a 3-partition topic; their handlers ACCEPT every record;
2. produce records ``b"<id>"`` at ``--rate`` records/s (default: half the S1(a) rate of the last
   ``make bench``, ``bench/results/latest.json``, else 10,000/s) for ``--minutes`` (30);
3. every ``--kill-interval`` seconds (30) SIGKILL a random worker and start it again;
4. every ``--sample`` seconds (10) sample the RSS and open file descriptors of every process
   (each worker slot, the broker, this driver) from ``/proc``, the size of the state changelogs
   in the broker's log directory and of each worker's data directory (RocksDB);
5. stop producing and killing, and wait until every record is done (the group's lag is 0);
6. check: every sampled record (``id % --ledger-every == 0``; the handlers' ledger) has an
   ACCEPT, and every series is flat after warm-up (:func:`examples.soak.flat.flatness`). Print a
   table of the series and one JSON line; exit 1 if a record was lost or a series grew.

Linux only (``/proc``). The samples go to ``.queueflow/soak/<time>/samples.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from examples.chaos.config import DEFAULT_SHARE_SETTINGS, ROOT
from examples.chaos.ledger import Ledger, terminal_line
from examples.chaos.report import say
from examples.chaos.run import queueflow_version
from examples.chaos.workers import Worker, stop_all, wait_for_leaders
from examples.soak.flat import flatness
from queueflow import logging as qf_logging
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import LocalBroker, create_topic, find_free_ports
from queueflow.kafka.config import KafkaClientConfig

MIB = 1 << 20
#: Absolute allowances of the flatness check, per kind of series.
SLACK = {"rss": 16 * MIB, "fds": 16, "bytes": 8 * MIB}


def default_rate() -> int:
    """Half the S1(a) rate of the last ``make bench`` (records/s), else 10,000."""
    try:
        results = json.loads((ROOT / "bench" / "results" / "latest.json").read_text())
        return max(int(results["S1"]["a"]["rate"] / 2), 100)
    except (OSError, ValueError, KeyError, TypeError):
        return 10_000


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m examples.soak", description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=None, help="records/s (default: half S1(a))")
    ap.add_argument("--kill-interval", type=float, default=30.0, help="s between SIGKILLs")
    ap.add_argument("--sample", type=float, default=10.0, help="s between samples")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--all-workers", type=int, default=2)
    ap.add_argument("--member-workers", type=int, default=4)
    ap.add_argument("--ledger-every", type=int, default=50, help="ledger 1 record in N")
    ap.add_argument("--drain-timeout", type=float, default=600.0)
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of samples ignored")
    ap.add_argument("--seed", type=int, default=None)
    return ap.parse_args(argv)


# -- sampling --------------------------------------------------------------------------------
def proc_rss_fds(pid: int | None) -> tuple[int, int] | None:
    """(RSS bytes, open file descriptors) of ``pid`` from /proc, or None if it is gone."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
        )
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None
    return rss_kb * 1024, fds


def tree_bytes(path: Path, match: str | None = None) -> int:
    """Bytes on disk of the files under ``path`` (only in directories whose name contains
    ``match``): allocated blocks, not sizes, since Kafka preallocates 10 MiB sparse index
    files for each active segment, which would hide the logs' own growth."""
    total = 0
    for root, _dirs, files in os.walk(path):
        if match is not None and match not in root:
            continue
        for name in files:
            with contextlib.suppress(OSError):  # a file RocksDB or Kafka just deleted
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def sample(t: float, workers: list[Worker], broker: LocalBroker) -> dict[str, Any]:
    row: dict[str, Any] = {"t": round(t, 1)}
    for w in workers:
        got = proc_rss_fds(w.pid if w.alive() else None)
        if got is not None:
            row[f"rss/w{w.slot}-{w.role}"], row[f"fds/w{w.slot}-{w.role}"] = got
        row[f"bytes/rocksdb-w{w.slot}"] = tree_bytes(w.datadir)
    for name, pid in (("broker", broker.pid()), ("driver", os.getpid())):
        got = proc_rss_fds(pid)
        if got is not None:
            row[f"rss/{name}"], row[f"fds/{name}"] = got
    row["bytes/changelogs"] = tree_bytes(broker.log_dirs, match="-changelog-")
    return row


# -- the run ---------------------------------------------------------------------------------
async def produce(
    bootstrap: str, topic: str, partitions: int, rate: int, seconds: float, state: dict[str, Any]
) -> None:
    """``b"<id>"`` for id 0, 1, ... to partition ``id % partitions``, ``rate`` a second."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks=1)
    await producer.start()
    try:
        started = time.monotonic()
        next_id = 0
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * rate) + 1
            futures = []
            while next_id < due:
                value = str(next_id).encode()
                futures.append(
                    await producer.send(topic, value, key=value, partition=next_id % partitions)
                )
                next_id += 1
            if futures:
                await asyncio.gather(*futures)
            state["produced"] = next_id
            await asyncio.sleep(0.05)
    finally:
        await producer.stop()


def main(argv: Sequence[str] | None = None) -> int:
    qf_logging.configure()  # a queueflow command: its own events on stderr (json/console)
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rate = args.rate or default_rate()
    seconds = args.minutes * 60
    rng = random.Random(args.seed)
    run_dir = (ROOT / ".queueflow" / "soak" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    say(
        f"soak: {args.minutes:g} min at {rate:,} records/s, a SIGKILL every "
        f"{args.kill_interval:g} s; {run_dir}"
    )
    port, cport = find_free_ports(2)
    broker = LocalBroker(run_dir / "broker", port=port, controller_port=cport, die_with_parent=True)
    broker.start(timeout_s=120, progress=print)
    bootstrap = broker.bootstrap
    run_id = uuid.uuid4().hex[:8]
    topic, app_id = f"soak-{run_id}", f"queueflow-soak-{run_id}"
    create_topic(bootstrap, topic, args.partitions)
    settings = {
        **DEFAULT_SHARE_SETTINGS,
        "group.share.delivery.count.limit": 10,
        "queueflow.member.join.timeout.ms": 60000,
    }
    env = {
        "CHAOS_APP_ID": app_id,
        "CHAOS_TOPIC": topic,
        "CHAOS_BROKER": f"kafka://{bootstrap}",
        "CHAOS_RELEASE": "0",
        "CHAOS_REJECT": "0",
        "CHAOS_POISON_MOD": str(1 << 62),
        "CHAOS_WORK_MS": "0",
        "CHAOS_CONCURRENCY": "8",
        "CHAOS_SHARE_SETTINGS": json.dumps(settings),
        "CHAOS_LEDGER_EVERY": str(args.ledger_every),
    }
    roles = ("all",) * args.all_workers + ("member",) * args.member_workers
    workers = [Worker(i, role, run_dir, env, "info") for i, role in enumerate(roles)]
    ledger = Ledger(run_dir / "ledger")
    samples: list[dict[str, Any]] = []
    state: dict[str, Any] = {"produced": 0}
    kills = 0
    lag: int | None = None
    produced, drained_s = 0, 0.0
    started = time.monotonic()
    try:
        leaders = [w for w in workers if w.role != "member"]
        for w in leaders:
            w.start()
        wait_for_leaders(leaders, topic, args.partitions, say)
        for w in workers:
            if w.role == "member":
                w.start()
        loop = asyncio.new_event_loop()
        producing = loop.create_task(
            produce(bootstrap, topic, args.partitions, rate, seconds, state)
        )
        t0 = time.monotonic()
        next_kill, next_sample, next_print = t0 + args.kill_interval, t0, t0
        while not producing.done():
            loop.run_until_complete(asyncio.sleep(0.2))
            now = time.monotonic()
            for w in workers:  # died on its own: restart (counted in the summary)
                if (
                    w.process is not None
                    and w.process.poll() is not None
                    and now - w.started_at > 2
                ):
                    say(
                        f"  worker #{w.slot} ({w.role}) exited with {w.process.returncode}; "
                        "restarting"
                    )
                    w.start()
            if now >= next_kill:
                next_kill = now + args.kill_interval
                victim = rng.choice([w for w in workers if w.alive()] or workers)
                victim.kill()
                victim.start()
                kills += 1
            if now >= next_sample:
                next_sample = now + args.sample
                samples.append(sample(now - t0, workers, broker))
            if now >= next_print:
                next_print = now + 60
                say(f"  {now - t0:7.0f} s  produced {state['produced']:,}  kills {kills}")
        producing.result()
        produced = state["produced"]
        say(f"produced {produced:,} records in {time.monotonic() - t0:.0f} s; draining")
        admin = ShareGroupAdmin(app_id, KafkaClientConfig(bootstrap))
        deadline = time.monotonic() + args.drain_timeout
        while time.monotonic() < deadline:
            offsets = loop.run_until_complete(admin.list_offsets("chaos"))
            lag = (
                sum(o.lag or 0 for o in offsets)
                if all(o.lag is not None for o in offsets)
                else None
            )
            if lag == 0:
                break
            loop.run_until_complete(asyncio.sleep(2))
        drained_s = time.monotonic() - t0 - seconds
        loop.close()
    finally:
        stop_all(workers)
        broker.stop()
    ledger.poll()
    sampled = range(0, produced, args.ledger_every)
    lost = [i for i in sampled if terminal_line(ledger.lines.get(i, []), 10) is None]
    series: dict[str, list[float]] = {}
    for row in samples:
        for key, value in row.items():
            if key != "t":
                series.setdefault(key, []).append(float(value))
    verdicts = {
        key: flatness(values, args.warmup, 0.25, SLACK[key.split("/")[0]])
        for key, values in sorted(series.items())
    }
    say(f"{'series':32} {'warm-up':>12} {'middle':>12} {'last':>12} {'growth':>8}  flat")
    for key, v in verdicts.items():
        unit = MIB if key.split("/")[0] in ("rss", "bytes") else 1
        say(
            f"{key:32} {v.first / unit:12.1f} {v.middle / unit:12.1f} {v.last / unit:12.1f} "
            f"{v.growth:8.1%}  {'yes' if v.flat else 'NO'}"
        )
    not_flat = [k for k, v in verdicts.items() if not v.flat]
    summary = {
        "minutes": args.minutes,
        "target_rate": rate,
        "achieved_rate": round(produced / seconds),
        "records": produced,
        "kills": kills,
        "sampled_records": len(sampled),
        "lost": len(lost),
        "lost_sample": lost[:10],
        "final_lag": lag,
        "drain_s": round(drained_s, 1),
        "samples": len(samples),
        "series": len(verdicts),
        "not_flat": not_flat,
        "growth": {k: v.growth for k, v in verdicts.items() if k.startswith(("rss/w", "bytes/"))},
        "queueflow": queueflow_version(),
        "seconds": round(time.monotonic() - started),
        "run_dir": str(run_dir),
    }
    (run_dir / "samples.json").write_text(json.dumps(samples) + "\n")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary), flush=True)
    return 1 if lost or not_flat or lag != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
