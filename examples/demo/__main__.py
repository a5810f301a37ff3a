"""``make demo``: share groups on real input, end to end, on a real Kafka broker.

1. start the local broker (or use ``$QUEUEFLOW_BROKER``);
2. create a 2-partition topic and enqueue one record per Python source file of the standard
   library and of the installed site-packages (key: the path, value: the file's bytes);
3. start 4 Faust worker processes (more workers than partitions): 2 with role ``all``
   (coordinator, share-partition leaders and the share agent) and 2 consumer-only (role
   ``member``); each parses files with ``ast`` and REJECTs those that don't parse;
4. print how to watch it (``queueflow share-groups --describe`` and the dashboard at
   ``http://127.0.0.1:<port>/queueflow/`` of each worker), progress, then a summary whose last
   line is one JSON object, with ``lock_expired_in_queue`` (records whose lock expired, or was
   about to, while they waited in a member's queue) and ``given_back_unstarted`` (records given
   back before that), summed over the workers' ``/metrics`` (``DEMO_SCREENSHOT=path`` also
   saves a screenshot of the dashboard mid-drain, with headless Chromium: see
   :mod:`queueflow.devtools.browser`);
5. check itself against a direct ``ast.parse`` of every file, and exit non-zero on a mismatch;
6. stop the workers and the broker it started, also on SIGINT/SIGTERM (the broker JVM and the
   workers also get SIGTERM from the kernel if this process dies, see
   :mod:`queueflow.devtools.children`).

``--max-files N`` enqueues only the first N files (a quick look; the check is the same).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

from aiokafka import AIOKafkaProducer

from queueflow import logging as qf_logging
from queueflow.devtools.broker import LocalBroker, bootstrap_from_env, create_topic, find_free_ports
from queueflow.testing import WorkerProcess, faust_worker_argv

PARTITIONS = 2
WORKERS = (("all", 0), ("all", 1), ("member", 2), ("member", 3))
MAX_FILE_BYTES = 8 * 1024 * 1024
TIMEOUT_S = 900
#: Seconds between two progress lines while enqueueing.
ENQUEUE_PROGRESS_S = 5.0
ROOT = Path(__file__).resolve().parents[2]


def source_files() -> list[Path]:
    """Every .py file of the standard library (without the base interpreter's site-packages)
    and of this environment's site-packages, de-duplicated by real path."""
    paths = sysconfig.get_paths()
    stdlib = Path(paths["stdlib"]).resolve()
    site = {Path(paths["purelib"]).resolve(), Path(paths["platlib"]).resolve()}
    found: dict[Path, Path] = {}
    for p in stdlib.rglob("*.py"):
        if "site-packages" not in p.relative_to(stdlib).parts:
            found.setdefault(p.resolve(), p)
    for root in site:
        for p in root.rglob("*.py"):
            found.setdefault(p.resolve(), p)
    return sorted(p for p in found.values() if p.is_file())


def parses(source: bytes) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


async def enqueue(bootstrap: str, topic: str, files: list[Path]) -> dict[str, bool]:
    """Produce one record per file; return path → whether ``ast.parse`` accepts it.

    Says every :data:`ENQUEUE_PROGRESS_S` seconds how far it got (each file is read and parsed
    here, for the check: ~80 s for ~25,000 files on 2 cores).
    """
    expected: dict[str, bool] = {}
    started = time.monotonic()
    next_say = started + ENQUEUE_PROGRESS_S
    size = 0
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        max_request_size=MAX_FILE_BYTES + 4096,
        linger_ms=5,
        compression_type=None,
    )
    await producer.start()
    try:
        pending = []
        for path in files:
            data = path.read_bytes()
            if len(data) > MAX_FILE_BYTES:
                continue
            expected[str(path)] = parses(data)
            pending.append(await producer.send(topic, data, key=str(path).encode()))
            size += len(data)
            if time.monotonic() >= next_say:
                next_say = time.monotonic() + ENQUEUE_PROGRESS_S
                print(
                    f"  enqueued {len(expected):,}/{len(files):,} files "
                    f"({100 * len(expected) // len(files)} %), {size / 1e6:.0f} MB, "
                    f"{time.monotonic() - started:.0f} s",
                    flush=True,
                )
        await asyncio.gather(*pending)
        print(
            f"  enqueued {len(expected):,} files, {size / 1e6:.0f} MB, in "
            f"{time.monotonic() - started:.0f} s",
            flush=True,
        )
    finally:
        await producer.stop()
    return expected


def screenshot(url: str, path: Path) -> None:
    """Save a screenshot of the dashboard at ``url`` to ``path`` (headless Chromium)."""
    from queueflow.devtools.browser import screenshot as take

    try:
        take(url, path, width=1280, height=1000, budget_ms=3000)
        print(f"  dashboard screenshot: {path}", flush=True)
    except Exception as exc:  # the demo's own check matters more than the picture
        print(f"  no dashboard screenshot: {exc}", flush=True)


def read_ledger(paths: list[Path]) -> list[dict[str, object]]:
    entries = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    entries.append(json.loads(line))
    return entries


#: The member metrics summed over the workers for the summary: records whose lock expired (or
#: was about to) while they waited in a member's queue, and records given back unstarted before
#: that (docs/concepts.md "Adaptive acquisition").
QUEUE_METRICS = {
    "lock_expired_in_queue": "queueflow_records_lock_expired_unhandled_total",
    "given_back_unstarted": "queueflow_records_given_back_unstarted_total",
}


def metric_sum(text: str, name: str) -> int:
    """The sum of metric ``name``'s samples (every label set) in Prometheus text ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def queue_counts(web_ports: list[int]) -> dict[str, int | None]:
    """:data:`QUEUE_METRICS` summed over the workers' ``/metrics`` pages (None when a worker's
    page can't be read: the count would be incomplete)."""
    pages = []
    for port in web_ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                pages.append(reply.read().decode())
        except OSError as exc:
            print(f"  no metrics from the worker on port {port}: {exc}", flush=True)
            return dict.fromkeys(QUEUE_METRICS)
    return {key: sum(metric_sum(p, name) for p in pages) for key, name in QUEUE_METRICS.items()}


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C: the ``finally`` of :func:`main` stops what it started."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--max-files", type=int, default=None, help="enqueue only the first N files")
    args = ap.parse_args(argv)
    qf_logging.configure()  # a queueflow command: its own events on stderr (json/console)
    signal.signal(signal.SIGTERM, _terminate)
    run_id = uuid.uuid4().hex[:8]
    run_dir = ROOT / ".queueflow" / "demo" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    broker: LocalBroker | None = None
    bootstrap = bootstrap_from_env()
    workers: list[WorkerProcess] = []
    started = time.monotonic()
    try:
        if bootstrap is None:
            port, cport = find_free_ports(2)
            broker = LocalBroker(
                run_dir / "broker", port=port, controller_port=cport, die_with_parent=True
            )
            broker.start(progress=lambda line: print(line, flush=True))
            bootstrap = broker.bootstrap
        topic = f"demo-files-{run_id}"
        create_topic(
            bootstrap, topic, PARTITIONS, config={"max.message.bytes": str(MAX_FILE_BYTES + 4096)}
        )
        files = source_files()[: args.max_files]
        print(
            f"enqueueing {len(files)} Python source files to {topic} ({PARTITIONS} partitions)",
            flush=True,
        )
        expected = asyncio.run(enqueue(bootstrap, topic, files))
        ledgers = []
        app_id = f"queueflow-demo-{run_id}"
        web_ports = find_free_ports(len(WORKERS))
        for (role, i), web_port in zip(WORKERS, web_ports, strict=True):
            ledger = run_dir / f"worker-{i}.jsonl"
            ledgers.append(ledger)
            env = dict(
                QUEUEFLOW_ROLE=role,
                DEMO_TOPIC=topic,
                DEMO_RESULTS=str(ledger),
                DEMO_BROKER=f"kafka://{bootstrap}",
                DEMO_APP_ID=app_id,
            )
            argv = faust_worker_argv(
                "examples.demo.app", run_dir / f"worker-{i}", web_port=web_port
            )
            worker = WorkerProcess(argv, run_dir / f"worker-{i}.log", env, cwd=ROOT)
            workers.append(worker.start())
        print(
            f"started {len(workers)} workers: " + ", ".join(f"#{i} {role}" for role, i in WORKERS),
            flush=True,
        )
        dashboard = f"http://127.0.0.1:{web_ports[0]}/queueflow/"
        print(
            "watch the queue drain:\n"
            f"  dashboard:  {dashboard}  (any worker's port: "
            + ", ".join(str(p) for p in web_ports)
            + f"; metrics at /metrics)\n"
            f"  CLI:        .venv/bin/queueflow share-groups --bootstrap-server {bootstrap} "
            f"--app {app_id} --describe --all-groups [--members]",
            flush=True,
        )
        shot = os.environ.get("DEMO_SCREENSHOT")
        shooter: threading.Thread | None = None
        deadline = time.monotonic() + TIMEOUT_S
        done: dict[str, str] = {}
        while time.monotonic() < deadline:
            time.sleep(2)
            entries = read_ledger(ledgers)
            done = {str(e["path"]): str(e["outcome"]) for e in entries if e["outcome"] != "RELEASE"}
            outcomes = Counter(done.values())
            elapsed = time.monotonic() - started
            print(
                f"  {elapsed:6.1f}s  {len(done)}/{len(expected)} done  accepted="
                f"{outcomes['ACCEPT']} rejected={outcomes['REJECT']}",
                flush=True,
            )
            dead = [w.process for w in workers if w.process is not None and not w.alive()]
            if dead:
                print(f"a worker exited early (code {dead[0].returncode}); see {run_dir}")
                return 1
            if shot and shooter is None and len(done) >= len(expected) // 10:
                shooter = threading.Thread(target=screenshot, args=(dashboard, Path(shot)))
                shooter.start()  # mid-drain: records in flight, members busy
            if len(done) >= len(expected):
                break
        if shooter is not None:
            shooter.join()
        seconds = round(time.monotonic() - started, 1)
        entries = read_ledger(ledgers)
        outcomes = Counter(done.values())
        summary = {
            "records": len(expected),
            "accepted": outcomes["ACCEPT"],
            "rejected": outcomes["REJECT"],
            "released": sum(1 for e in entries if e["outcome"] == "RELEASE"),
            "redelivered": sum(1 for e in entries if int(e["delivery_count"]) > 1),
            **queue_counts(web_ports),
            "workers": len(workers),
            "partitions": PARTITIONS,
            "seconds": seconds,
        }
        rejected = {p for p, o in done.items() if o == "REJECT"}
        should_reject = {p for p, ok in expected.items() if not ok}
        problems = []
        if rejected != should_reject:
            problems.append(
                f"rejected files differ from ast.parse failures: "
                f"extra={sorted(rejected - should_reject)[:5]} "
                f"missing={sorted(should_reject - rejected)[:5]}"
            )
        if summary["accepted"] + summary["rejected"] != summary["records"]:
            problems.append(
                f"accepted + rejected = {summary['accepted'] + summary['rejected']}, "
                f"records = {summary['records']}"
            )
        per_worker = Counter(str(e["pid"]) for e in entries)
        print(f"files per worker process: {sorted(per_worker.values(), reverse=True)}")
        print("files rejected (ast.parse fails):")
        for path in sorted(rejected):
            print(f"  {path}")
        for problem in problems:
            print(f"CHECK FAILED: {problem}")
        if not problems:
            print("check passed: rejected == ast.parse failures, accepted + rejected == records")
        print(json.dumps(summary))
        return 1 if problems else 0
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            if w.process is None:
                continue
            try:
                w.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        if broker is not None:
            broker.stop()
            broker.wipe()  # the demo's topic data; ledgers and worker logs stay in run_dir


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: main's finally stopped the workers and the broker
        print("interrupted: the demo's workers and broker are stopped", file=sys.stderr)
        sys.exit(130)
