"""``make chaos``: nothing lost under SIGKILLs and a broker restart (issue #3, "Nothing lost").

1. start a local broker (or use ``$QUEUEFLOW_BROKER``; then there is no broker restart);
2. start the leader-role workers (``faust -A examples.chaos.app worker``; by default 2 with role
   ``all``) and wait until their Faust group has settled (every one logged ``leader_assigned``
   for the same generation), so that no leader joins while records are in flight;
3. produce ``--records`` records ``b"<id>"`` round-robin into a ``--partitions`` topic, keeping
   each id's partition and offset, then start the ``member`` workers (by default 4). Each
   handler appends one JSON line per delivery to its process's ledger (see
   :mod:`examples.chaos.app`): REJECTs ~1 %, RELEASEs ~5 %, raises on poison records
   (``id % 997 == 0``), ACCEPTs the rest;
4. every ``--kill-interval`` seconds SIGKILL a random worker and start it again at once with the
   same data directory; once half of the records have a terminal outcome, stop the broker, wait
   ``--broker-down`` seconds and start it again (same data);
5. poll the ledgers until every produced id has a terminal outcome (or, when nothing moves for a
   while, the leaders' state says they are done with it), or ``--timeout``;
6. check the ledgers against what was produced and print one JSON line (stdout; progress goes to
   stderr). Exit status 1 if any record was lost.

Terminal outcomes: ACCEPT, REJECT, or a delivery with ``delivery_count`` = limit that ended in
RELEASE/raise (the leader Archives the record). For ids the ledger leaves open, the driver replays
the share-partition state from the leaders' state changelog (:func:`settle`): a poison record
Archived at the limit after a last delivery no handler saw (its worker was killed first) is
counted as a poison deviation, not lost. Every other id without a terminal outcome is ``lost``:
``lost_unfinished`` (still in flight when the run ended), ``lost_archived_unprocessed`` (the
leaders Archived it at the delivery limit although no handler failed it that often: deliveries
that never reached a handler) or ``lost_other``.

Duplicates: ids delivered again after a terminal outcome, or with a delivery count that the
previous delivery's outcome does not explain (it was not seen failing). They are expected for
records in flight at a kill; ``duplicates_unexplained`` counts those with no kill, leader
restart or broker restart nearby. ``diag`` (from the request and reply topics) counts ShareFetch
requests the leaders answered more than once.

Run ``python -m examples.chaos --help`` for the parameters; :func:`run` is what
``tests/integration/test_chaos.py`` calls with a smaller configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from queueflow.devtools.broker import LocalBroker, bootstrap_from_env, create_topic, find_free_ports
from queueflow.engine.state import RecordState
from queueflow.protocol.state_codec import decode_snapshot, decode_update

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = ("ACCEPT", "REJECT")
FAILED = ("RELEASE", "RAISE")

#: Share-group settings for a quick recovery (KIP-932 names; every worker gets the same).
DEFAULT_SHARE_SETTINGS: dict[str, int | str] = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 5000,
    "group.share.session.timeout.ms": 10000,
    "group.share.heartbeat.interval.ms": 1000,
    "group.share.delivery.count.limit": 5,
}


@dataclass
class ChaosConfig:
    """Parameters of one chaos run (defaults: the full run of issue #3)."""

    records: int = 50_000
    partitions: int = 3
    roles: tuple[str, ...] = ("all", "all", "member", "member", "member", "member")
    #: seconds between two SIGKILLs (0: no kills)
    kill_interval_s: float = 3.0
    #: at most this many kills (None: no limit)
    max_kills: int | None = None
    #: stop killing after this many seconds of the run (None: until every record is done)
    kill_for_s: float | None = None
    #: roles that may be killed
    kill_roles: tuple[str, ...] = ("all", "leader", "member")
    #: kill exactly these roles, in this order (a random worker of each), instead of
    #: ``max_kills`` random ones
    kill_sequence: tuple[str, ...] | None = None
    #: with ``kill_sequence``: kill number k once this fraction of the records is done, instead
    #: of every ``kill_interval_s`` (a schedule that does not depend on the machine's speed)
    kill_at: tuple[float, ...] | None = None
    #: restart the broker once (only if this run can: a LocalBroker is given)
    broker_restart: bool = True
    #: seconds the broker stays down
    broker_down_s: float = 10.0
    #: restart the broker once this fraction of the records has a terminal outcome
    broker_restart_at: float = 0.5
    #: overall bound (s) for the workers to finish every record
    timeout_s: float = 600.0
    seed: int = 0
    concurrency: int = 8
    #: mean simulated handler work (ms)
    work_ms: float = 1.0
    release_p: float = 0.05
    reject_p: float = 0.01
    poison_mod: int = 997
    share_settings: dict[str, int | str] = field(
        default_factory=lambda: dict(DEFAULT_SHARE_SETTINGS)
    )
    #: read the request and reply topics at the end: requests answered more than once
    diagnose: bool = True
    #: seconds without ledger progress after which open ids are checked against leader state
    stall_check_s: float = 15.0
    log_level: str = "info"

    @property
    def delivery_limit(self) -> int:
        return int(self.share_settings.get("group.share.delivery.count.limit", 5))

    @property
    def lock_s(self) -> float:
        return int(self.share_settings.get("group.share.record.lock.duration.ms", 30000)) / 1000


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- workers -------------------------------------------------------------------------------------
class Worker:
    """One worker slot: a ``faust worker`` process, restarted with the same data directory."""

    def __init__(
        self, slot: int, role: str, run_dir: Path, env: dict[str, str], log_level: str
    ) -> None:
        self.slot = slot
        self.role = role
        self.datadir = run_dir / f"w{slot}"
        self.log_path = run_dir / f"w{slot}.log"
        self.ledger_dir = run_dir / "ledger"
        self.env = env
        self.log_level = log_level
        self.incarnation = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.incarnation += 1
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        env = dict(
            self.env,
            QUEUEFLOW_ROLE=self.role,
            PYTHONUNBUFFERED="1",
            CHAOS_LEDGER=str(self.ledger_dir / f"w{self.slot}-{self.incarnation}.jsonl"),
        )
        with open(self.log_path, "ab") as log:
            log.write(
                f"\n===== chaos: slot {self.slot} role {self.role} incarnation "
                f"{self.incarnation} at {time.time():.3f} =====\n".encode()
            )
            log.flush()
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "faust",
                    "-A",
                    "examples.chaos.app",
                    "--datadir",
                    str(self.datadir),
                    "worker",
                    "-l",
                    self.log_level,
                    "--without-web",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started_at = time.monotonic()

    def kill(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)

    def terminate(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)


_LEADER_ASSIGNED = re.compile(r"leader_assigned\s+leader_epoch=(\d+) partitions=\[([\d, ]*)\]")


def wait_for_leaders(
    leaders: Sequence[Worker],
    topic: str,
    partitions: int,
    progress: Callable[[str], None],
    timeout_s: float = 90.0,
) -> None:
    """Wait until every leader-role worker has logged ``leader_assigned`` for one Faust
    generation and together they lead all ``partitions`` of ``topic`` (the Faust group has
    settled). Raises RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        latest: dict[int, tuple[int, set[int]]] = {}
        for w in leaders:
            text = w.log_path.read_text(errors="replace") if w.log_path.exists() else ""
            for line in text.splitlines():
                m = _LEADER_ASSIGNED.search(line)
                if m and f"topic={topic}" in line:
                    parts = {int(x) for x in m.group(2).replace(" ", "").split(",") if x}
                    latest[w.slot] = (int(m.group(1)), parts)
        epochs = {epoch for epoch, _ in latest.values()}
        covered = set().union(*(parts for _, parts in latest.values())) if latest else set()
        if len(latest) == len(leaders) and len(epochs) == 1 and covered == set(range(partitions)):
            progress(f"leaders settled in Faust generation {epochs.pop()}")
            return
        time.sleep(0.2)
    raise RuntimeError(f"the leader workers did not settle into one generation in {timeout_s} s")


def stop_all(workers: Sequence[Worker], timeout_s: float = 20.0) -> None:
    """SIGTERM every worker, SIGKILL those still alive after ``timeout_s``."""
    for w in workers:
        with contextlib.suppress(Exception):
            w.terminate()
    deadline = time.monotonic() + timeout_s
    for w in workers:
        if w.process is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        with contextlib.suppress(Exception):
            w.kill()


# -- producing -----------------------------------------------------------------------------------
async def produce(
    bootstrap: str, topic: str, records: int, partitions: int
) -> list[tuple[int, int]]:
    """Produce ids 0..records-1 (id % partitions is the partition); return [(partition, offset)]."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, acks="all", enable_idempotence=True
    )
    await producer.start()
    where: list[tuple[int, int]] = []
    try:
        step = 5000
        for lo in range(0, records, step):
            futures = [
                await producer.send(
                    topic, str(i).encode(), key=str(i).encode(), partition=i % partitions
                )
                for i in range(lo, min(lo + step, records))
            ]
            for meta in await asyncio.gather(*futures):
                where.append((meta.partition, meta.offset))
    finally:
        await producer.stop()
    return where


# -- the ledger ----------------------------------------------------------------------------------
class Ledger:
    """Reads the per-process ledger files incrementally."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self.lines: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.starts: list[dict[str, Any]] = []
        self.bad_lines = 0
        self.count = 0

    def poll(self) -> set[int]:
        """Read what was appended since the last call; returns the ids with new lines."""
        touched: set[int] = set()
        if not self.directory.exists():
            return touched
        for path in sorted(self.directory.glob("*.jsonl")):
            pos = self.offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(pos)
                data = f.read()
            end = data.rfind(b"\n") + 1  # only complete lines
            if end == 0:
                continue
            self.offsets[path] = pos + end
            for raw in data[:end].splitlines():
                if not raw.strip():
                    continue
                try:
                    entry = json.loads(raw)
                except ValueError:
                    self.bad_lines += 1
                    continue
                if "id" in entry:
                    self.lines[int(entry["id"])].append(entry)
                    touched.add(int(entry["id"]))
                    self.count += 1
                elif entry.get("event") == "start":
                    self.starts.append(entry)
        return touched


def terminal_line(lines: list[dict[str, Any]], limit: int) -> dict[str, Any] | None:
    """The first delivery (in time) that ended the record: ACCEPT, REJECT, or a failed delivery
    at the delivery count limit (the leader Archives the record)."""
    for e in sorted(lines, key=lambda e: e["t"]):
        if e["o"] in TERMINAL or (e["o"] in FAILED and int(e["dc"]) >= limit):
            return e
    return None


# -- leader state, replayed from the state changelog ---------------------------------------------
async def leader_view(
    bootstrap: str,
    changelog: str,
    group: str,
    partitions: int,
    targets: dict[int, list[int]],
    timeout_s: float = 60.0,
) -> tuple[dict[tuple[int, int], tuple[int, int]], dict[int, int]]:
    """Replay the share-partition state of ``group`` from ``changelog`` for the ``targets``
    (partition -> sorted offsets).

    Returns:
        ((partition, offset) -> (last persisted state, delivery count) for the targets that were
        ever in persisted state, partition -> final SPSO).
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    states: dict[tuple[int, int], tuple[int, int]] = {}
    spso: dict[int, int] = {}
    try:
        tps = [TopicPartition(changelog, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        done = {tp for tp in tps if ends[tp] == 0}
        while len(done) < len(tps) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, messages in batch.items():
                for m in messages:
                    if m.offset + 1 >= ends[tp]:
                        done.add(tp)
                    if m.key is None or m.value is None:
                        continue
                    key = m.key.decode(errors="replace").split("/")
                    if len(key) < 3 or key[1] != group:
                        continue
                    p = int(key[2])
                    offs = targets.get(p, [])
                    if key[0] == "S":
                        snap = decode_snapshot(m.value, where=changelog)
                        start, batches, full = snap.start_offset, snap.batches, True
                    elif key[0] == "D":
                        upd, *_ = decode_update(m.value, where=changelog)
                        start, batches, full = upd.start_offset, upd.batches, upd.reset
                    else:
                        continue
                    spso[p] = start
                    if full:  # a snapshot replaces everything from its SPSO on
                        for o in offs[bisect.bisect_left(offs, start) :]:
                            states[(p, o)] = (int(RecordState.AVAILABLE), 0)
                    for b in batches:
                        lo = bisect.bisect_left(offs, b.first_offset)
                        hi = bisect.bisect_right(offs, b.last_offset)
                        for o in offs[lo:hi]:
                            states[(p, o)] = (int(b.state), int(b.delivery_count))
    finally:
        await consumer.stop()
    return states, spso


# -- the run -------------------------------------------------------------------------------------
def queueflow_version() -> str:
    """The commit of the queueflow under test, ``+dirty`` if queueflow/ has local changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "queueflow"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


@dataclass
class Event:
    t: float  # wall clock, comparable with ledger times
    kind: str  # kill | restart | exit | broker_stop | broker_start
    slot: int = -1
    role: str = ""
    pid: int | None = None
    detail: str = ""


def run(
    config: ChaosConfig,
    run_dir: Path,
    bootstrap: str,
    broker: LocalBroker | None = None,
    progress: Callable[[str], None] = say,
) -> dict[str, Any]:
    """One chaos run against ``bootstrap``; ``broker`` (if given) is restarted once.

    Always stops every worker it started; the broker is left running (started again if this run
    stopped it). Returns the summary (see :func:`analyse`).
    """
    started = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    run_id = uuid.uuid4().hex[:8]
    topic = f"chaos-{run_id}"
    app_id = f"queueflow-chaos-{run_id}"
    create_topic(bootstrap, topic, config.partitions)
    env = dict(
        os.environ,
        CHAOS_APP_ID=app_id,
        CHAOS_TOPIC=topic,
        CHAOS_BROKER=f"kafka://{bootstrap}",
        CHAOS_SEED=str(config.seed),
        CHAOS_RELEASE=str(config.release_p),
        CHAOS_REJECT=str(config.reject_p),
        CHAOS_POISON_MOD=str(config.poison_mod),
        CHAOS_WORK_MS=str(config.work_ms),
        CHAOS_CONCURRENCY=str(config.concurrency),
        CHAOS_SHARE_SETTINGS=json.dumps(config.share_settings),
    )
    workers = [
        Worker(i, role, run_dir, env, config.log_level) for i, role in enumerate(config.roles)
    ]
    ledger = Ledger(run_dir / "ledger")
    events: list[Event] = []
    limit = config.delivery_limit
    open_ids = set(range(config.records))
    settled: dict[int, str] = {}  # ids the ledger leaves open but the leaders are done with
    broker_restarts = 0
    broker_pending = config.broker_restart and broker is not None
    finished = False
    kills = 0
    chaos_started = 0.0
    produced_s = 0.0
    try:
        # Leaders first, and settled into one Faust generation before there is any work: a
        # leader joining moves share-partitions, and KIP-932 makes their in-flight records
        # Available again. The run is about kills, not about its own start-up.
        leaders = [w for w in workers if w.role != "member"]
        for w in leaders:
            w.start()
            events.append(Event(time.time(), "start", w.slot, w.role, w.pid))
        wait_for_leaders(leaders, topic, config.partitions, progress)
        progress(f"producing {config.records} records to {topic} ({config.partitions} partitions)")
        produce_started = time.monotonic()
        where = asyncio.run(produce(bootstrap, topic, config.records, config.partitions))
        produced_s = time.monotonic() - produce_started
        for w in workers:
            if w.role == "member":
                w.start()
                events.append(Event(time.time(), "start", w.slot, w.role, w.pid))
        progress(
            f"started {len(workers)} workers: "
            + ", ".join(f"#{w.slot} {w.role}" for w in workers)
            + f"; run dir {run_dir}"
        )
        chaos_started = time.monotonic()
        deadline = chaos_started + config.timeout_s
        next_kill = chaos_started + config.kill_interval_s
        next_poll = next_print = last_progress = chaos_started
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = time.monotonic()
            # Workers that died on their own (not by our SIGKILL): note and restart.
            for w in workers:
                if (
                    w.process is not None
                    and w.process.poll() is not None
                    and now - w.started_at > 2
                ):
                    events.append(
                        Event(
                            time.time(),
                            "exit",
                            w.slot,
                            w.role,
                            w.pid,
                            f"code {w.process.returncode}",
                        )
                    )
                    progress(
                        f"  worker #{w.slot} ({w.role}) exited by itself with code "
                        f"{w.process.returncode}; restarting it"
                    )
                    w.start()
                    events.append(Event(time.time(), "restart", w.slot, w.role, w.pid))
            if now >= next_poll:
                next_poll = now + 1.0
                touched = ledger.poll()
                if touched:
                    last_progress = now
                for record_id in touched & open_ids:
                    if terminal_line(ledger.lines[record_id], limit):
                        open_ids.discard(record_id)
                if not open_ids:
                    finished = True
                    break
                if now - last_progress > config.stall_check_s and len(open_ids) <= max(
                    1000, config.records // 10
                ):
                    # Nothing new for a while: maybe the leaders are done with the open ids
                    # (Archived after a last delivery no handler saw).
                    with contextlib.suppress(Exception):
                        settled.update(settle(bootstrap, app_id, topic, config, where, open_ids))
                    open_ids.difference_update(settled)
                    last_progress = now
                    if not open_ids:
                        finished = True
                        break
            if now >= next_print:
                next_print = now + 10
                done = config.records - len(open_ids)
                progress(
                    f"  {now - started:6.1f}s  {done}/{config.records} done  "
                    f"deliveries={ledger.count} kills={kills} "
                    f"broker_restarts={broker_restarts}"
                )
            done_fraction = 1 - len(open_ids) / config.records
            if (
                broker_pending
                and broker is not None
                and done_fraction >= config.broker_restart_at
                and now >= next_kill  # at least kill_interval_s after the previous kill
            ):
                broker_pending = False
                progress(f"  broker restart: stop, {config.broker_down_s:.0f} s down, start")
                events.append(Event(time.time(), "broker_stop"))
                try:
                    broker.stop()
                    time.sleep(config.broker_down_s)
                finally:
                    broker.start(timeout_s=120)
                events.append(Event(time.time(), "broker_start"))
                broker_restarts += 1
                next_kill = time.monotonic() + config.kill_interval_s
                continue
            killing = (
                config.kill_interval_s > 0
                and (config.max_kills is None or kills < config.max_kills)
                and (config.kill_sequence is None or kills < len(config.kill_sequence))
                and (config.kill_for_s is None or now - chaos_started < config.kill_for_s)
            )
            if config.kill_at is not None:
                due = (
                    kills < len(config.kill_at)
                    and done_fraction >= config.kill_at[kills]
                    and now >= next_kill
                )
            else:
                due = now >= next_kill
            if killing and due:
                next_kill = now + config.kill_interval_s
                roles = (
                    config.kill_roles
                    if config.kill_sequence is None
                    else (config.kill_sequence[kills],)
                )
                candidates = [w for w in workers if w.alive() and w.role in roles]
                if candidates:
                    victim = rng.choice(candidates)
                    pid = victim.pid
                    victim.kill()
                    kills += 1
                    events.append(Event(time.time(), "kill", victim.slot, victim.role, pid))
                    progress(
                        f"  {now - started:6.1f}s  SIGKILL #{victim.slot} ({victim.role}, "
                        f"pid {pid}, up {now - victim.started_at:.1f} s); restarting"
                    )
                    victim.start()
                    events.append(
                        Event(time.time(), "restart", victim.slot, victim.role, victim.pid)
                    )
        # One last look at the ledger, then at the leaders' state for what is still open.
        ledger.poll()
        for record_id in list(open_ids):
            if terminal_line(ledger.lines[record_id], limit):
                open_ids.discard(record_id)
        finished = finished or not open_ids
    finally:
        stop_all(workers)
        if broker is not None and not broker.is_running():
            broker.start(timeout_s=120)
    ledger.poll()
    open_ids = {i for i in open_ids if not terminal_line(ledger.lines.get(i, []), limit)}
    if open_ids:
        with contextlib.suppress(Exception):
            settled.update(settle(bootstrap, app_id, topic, config, where, open_ids))
    settled = {i: st for i, st in settled.items() if not terminal_line(ledger.lines[i], limit)}
    summary = analyse(config, where, ledger, events, settled, worker_log_events(run_dir))
    if config.diagnose:
        with contextlib.suppress(Exception):
            timeout_ms = int(config.share_settings.get("queueflow.request.timeout.ms", 10000))
            summary["diag"] = asyncio.run(replay_diagnostics(bootstrap, app_id, topic, timeout_ms))
    summary.update(
        {
            "queueflow": queueflow_version(),
            "finished": finished,
            "kills": kills,
            "broker_restarts": broker_restarts,
            "produce_seconds": round(produced_s, 1),
            "chaos_seconds": round(time.monotonic() - chaos_started, 1) if chaos_started else 0,
            "seconds": round(time.monotonic() - started, 1),
            "run_dir": str(run_dir),
        }
    )
    (run_dir / "events.jsonl").write_text("".join(json.dumps(asdict(e)) + "\n" for e in events))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


#: What the leaders' state says about a record the ledger leaves open (see :func:`settle`).
ARCHIVED_AT_LIMIT = "archived_at_limit"


def settle(
    bootstrap: str,
    app_id: str,
    topic: str,
    config: ChaosConfig,
    where: list[tuple[int, int]],
    ids: set[int],
) -> dict[int, str]:
    """What the leaders' durable state says about ``ids``, replayed from the state changelog.

    Returns id -> status for the ids the leaders are done with:

    * ``archived_at_limit``: Archived, or passed by the SPSO, with delivery count >= the limit;
    * ``archived_below_limit``: Archived with a lower count (a GAP acknowledgement?);
    * ``acknowledged``: Acknowledged;
    * ``passed_below_limit``: passed by the SPSO while last persisted as Available/Acquired
      below the limit, or never persisted at all.

    Ids still in flight (or beyond the SPEO) are left out.
    """
    targets: dict[int, list[int]] = defaultdict(list)
    by_place = {}
    for record_id in ids:
        p, o = where[record_id]
        targets[p].append(o)
        by_place[(p, o)] = record_id
    for offs in targets.values():
        offs.sort()
    changelog = f"{app_id}-share-state-{topic}-changelog"
    states, spso = asyncio.run(
        leader_view(bootstrap, changelog, "chaos", config.partitions, dict(targets))
    )
    limit = config.delivery_limit
    out: dict[int, str] = {}
    for (p, o), record_id in by_place.items():
        state, count = states.get((p, o), (int(RecordState.AVAILABLE), 0))
        passed = o < spso.get(p, -1)
        if state == RecordState.ACKNOWLEDGED:
            out[record_id] = "acknowledged"
        elif state == RecordState.ARCHIVED or passed:
            if count >= limit:
                out[record_id] = ARCHIVED_AT_LIMIT
            elif state == RecordState.ARCHIVED:
                out[record_id] = "archived_below_limit"
            else:
                out[record_id] = "passed_below_limit"
    return out


async def replay_diagnostics(
    bootstrap: str, app_id: str, topic: str, request_timeout_ms: int, timeout_s: float = 60.0
) -> dict[str, int]:
    """Count ShareFetch requests the leaders answered more than once, from the request and reply
    topics: a leader that processes a request again (Faust re-delivers it after a rebalance)
    before its ``deadline_ms`` acquires records for a member that is no longer waiting for that
    answer. Those records stay Acquired until their lock expires, and their delivery count goes
    up without a delivery."""
    requests: dict[tuple[str, int, int], int] = {}
    answers: dict[tuple[str, int, int], list[tuple[int, int]]] = defaultdict(list)
    for name in (f"{app_id}-share-fetch-{topic}", f"{app_id}-share-replies"):
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            parts = consumer.partitions_for_topic(name) or set()
            if not parts:
                await consumer._client.force_metadata_update()
                parts = consumer.partitions_for_topic(name) or set()
            tps = [TopicPartition(name, p) for p in sorted(parts)]
            if not tps:
                continue
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                    break
                batch = await consumer.getmany(timeout_ms=500, max_records=10000)
                for messages in batch.values():
                    for m in messages:
                        if not m.value:
                            continue
                        try:
                            v = json.loads(m.value)
                        except ValueError:
                            continue
                        kind = v.get("kind")
                        if kind == "fetch" and v.get("max_records", 0) > 0:
                            requests[(v["member_id"], v["request_id"], m.partition)] = m.timestamp
                        elif kind == "fetch_response":
                            n = sum(last - first + 1 for first, last, _ in v.get("acquired", []))
                            key = (v["member_id"], v["request_id"], v["partition"])
                            answers[key].append((m.timestamp, n))
        finally:
            await consumer.stop()
    out = Counter(fetch_requests=len(requests), fetch_answers=sum(map(len, answers.values())))
    for key, got in answers.items():
        got.sort()
        if len(got) > 1:
            out["requests_answered_again"] += 1
            phantom = sum(n for _t, n in got[1:])
            if phantom:
                out["answers_again_acquiring"] += 1
                out["records_acquired_again"] += phantom
        sent = requests.get(key)
        if sent is not None and got[0][0] - sent > request_timeout_ms and got[0][1]:
            out["late_answers_acquiring"] += 1
            out["records_acquired_late"] += got[0][1]
    return dict(out)


# -- the check -----------------------------------------------------------------------------------
_LOG_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\] \[(\d+)\] .*?\] "
    r"(assignment|member_session_expired|share_partition_restored|share_fetch_failed|"
    r"acknowledgement_refused|member_records_released|stale_acknowledgements_dropped|"
    r"acquisition_lock_expired_before_handling|leader_stepped_down)\s"
)


def worker_log_events(run_dir: Path) -> list[tuple[float, int, str]]:
    """(time, pid, event) of the queueflow log events in the worker logs that explain
    redeliveries: share-group reassignments, session expiries, leader restores and step-downs,
    failed fetches, refused or dropped acknowledgements and records whose lock expired before a
    handler was free."""
    out: list[tuple[float, int, str]] = []
    for path in sorted(run_dir.glob("w*.log")):
        with open(path, errors="replace") as f:
            for line in f:
                m = _LOG_LINE.match(line)
                if m:
                    t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
                    out.append((t + int(m.group(2)) / 1000, int(m.group(3)), m.group(4)))
    return sorted(out)


def analyse(
    config: ChaosConfig,
    where: list[tuple[int, int]],
    ledger: Ledger,
    events: list[Event],
    settled: dict[int, str],
    log_events: Sequence[tuple[float, int, str]] = (),
) -> dict[str, Any]:
    """Compare the ledger with what was produced; see the module docstring for the rules.

    ``settled``: for ids without a terminal ledger line, what the leaders' state says
    (:func:`settle`).
    """
    limit = config.delivery_limit
    chaos = [
        e
        for e in events
        if e.kind in ("kill", "exit", "broker_stop", "broker_start")
        or (e.kind == "restart" and e.role != "member")
    ]
    killed_pids = {e.pid: e.t for e in events if e.kind in ("kill", "exit")}
    leader_events = sorted(e.t for e in chaos if e.role != "member")
    broker_windows = [e.t for e in events if e.kind in ("broker_stop", "broker_start")]

    any_kill = sorted(e.t for e in chaos)

    def chaos_between(t0: float, t1: float, pid: int | None, anyone: bool = False) -> bool:
        """Was a delivery handled around t0 (by ``pid``) and delivered again at t1 in flight
        at a kill? True if ``pid`` was killed after t0, or a leader-role worker was killed or
        (re)started or the broker restarted between t0 (minus a lock duration) and t1; with
        ``anyone``, a kill of any worker in that window counts too."""
        if pid is not None and pid in killed_pids and t0 - 1 <= killed_pids[pid] <= t1:
            return True
        lo = t0 - config.lock_s - 5
        times = any_kill if anyone else leader_events
        i = bisect.bisect_left(times, lo)
        if i < len(times) and times[i] <= t1:
            return True
        return any(lo <= t <= t1 for t in broker_windows)

    reassigned = sorted(t for t, _pid, kind in log_events if kind == "assignment")

    def reassignment_between(t0: float, t1: float) -> bool:
        i = bisect.bisect_left(reassigned, t0 - config.lock_s - 5)
        return i < len(reassigned) and reassigned[i] <= t1

    outcomes: Counter[str] = Counter()
    lost: list[int] = []
    lost_why: Counter[str] = Counter()
    unobserved = 0
    misplaced = 0
    duplicates: set[int] = set()
    after_terminal = 0
    unexplained: set[int] = set()
    at_reassignment: set[int] = set()
    repeated_counts = 0
    poison = poison_archived = 0
    poison_deviations: dict[int, list[int]] = {}
    poison_unexplained: dict[int, list[int]] = {}
    poison_over_limit = 0
    poison_extra = poison_extra_unexplained = 0
    archived_at_limit = 0
    deliveries = 0
    for record_id in range(config.records):
        lines = sorted(ledger.lines.get(record_id, []), key=lambda e: e["t"])
        deliveries += len(lines)
        for e in lines:
            outcomes[e["o"]] += 1
            if (int(e["p"]), int(e["off"])) != tuple(where[record_id]):
                misplaced += 1
        term = terminal_line(lines, limit)
        is_poison = record_id % config.poison_mod == 0
        leader_says = settled.get(record_id) if term is None else None
        if term is None and not (is_poison and leader_says == ARCHIVED_AT_LIMIT):
            # No ACCEPT/REJECT, and not a poison record Archived at the limit: lost. Either the
            # run ended first ("unfinished"), or the leaders finished the record without a
            # handler ever finishing it (e.g. Archived at the limit after deliveries that never
            # reached a handler).
            lost.append(record_id)
            lost_why[leader_says or "unfinished"] += 1
        elif term is not None and term["o"] in FAILED and not is_poison:
            archived_at_limit += 1
        seen_counts = {int(e["dc"]) for e in lines}
        if seen_counts:
            unobserved += len(set(range(1, max(seen_counts))) - seen_counts)
        # Duplicates: a delivery after the terminal one, or a delivery count the previous
        # delivery's outcome doesn't explain (the previous one was not RELEASE/raise).
        by_count: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in lines:
            by_count[int(e["dc"])].append(e)
        dup = False
        prev: dict[str, Any] | None = None
        for e in lines:
            dc = int(e["dc"])
            if term is not None and e is not term and e["t"] > term["t"]:
                after_terminal += 1
                dup = True
                t0, pid = term["t"], term["pid"]
            elif dc > 1 and not any(x["o"] in FAILED for x in by_count.get(dc - 1, [])):
                dup = True  # delivery dc-1 was never seen failing: in flight at a kill?
                seen = bool(by_count.get(dc - 1))
                t0 = prev["t"] if prev is not None else 0.0
                pid = prev["pid"] if prev is not None and seen else None
            else:
                prev = e
                continue
            if not chaos_between(t0, e["t"], pid, anyone=pid is None):
                unexplained.add(record_id)
                if reassignment_between(t0, e["t"]):
                    at_reassignment.add(record_id)
            prev = e
        repeated = sum(len(v) - 1 for v in by_count.values() if len(v) > 1)
        repeated_counts += repeated
        if repeated:
            dup = True
        if dup:
            duplicates.add(record_id)
        if is_poison:
            poison += 1
            counts = sorted(int(e["dc"]) for e in lines)
            archived = (term is not None) or leader_says == ARCHIVED_AT_LIMIT
            poison_archived += archived
            if counts and counts[-1] > limit:
                poison_over_limit += 1
            if counts != list(range(1, limit + 1)):
                poison_deviations[record_id] = counts
                t0 = lines[0]["t"] if lines else 0.0
                t1 = lines[-1]["t"] if lines else time.time()
                if not chaos_between(t0, t1 + config.lock_s + 5, None, anyone=True):
                    poison_unexplained[record_id] = counts
                if len(counts) > limit:  # handled more often than the limit allows
                    poison_extra += 1
                    if record_id in poison_unexplained:
                        poison_extra_unexplained += 1
    lost_detail: dict[str, Any] = {}
    for record_id in sorted(lost, key=lambda i: (settled.get(i) is None, i))[:20]:
        lost_detail[str(record_id)] = {
            "partition_offset": where[record_id],
            "ledger": [(e["dc"], e["o"], e["pid"]) for e in ledger.lines.get(record_id, [])],
            "leaders": settled.get(record_id, "unfinished"),
        }
    poison_by_leader = sum(
        1
        for i, st in settled.items()
        if st == ARCHIVED_AT_LIMIT and i % config.poison_mod == 0 and i < config.records
    )
    return {
        "records": config.records,
        "partitions": config.partitions,
        "workers": len(config.roles),
        "roles": dict(Counter(config.roles)),
        "lost": len(lost),
        "lost_unfinished": lost_why["unfinished"],
        "lost_archived_unprocessed": lost_why[ARCHIVED_AT_LIMIT],
        "lost_other": {
            k: v for k, v in lost_why.items() if k not in ("unfinished", ARCHIVED_AT_LIMIT)
        },
        "duplicates": len(duplicates),
        "duplicates_after_terminal": after_terminal,
        "duplicates_unexplained": len(unexplained),
        "duplicates_unexplained_at_reassignment": len(at_reassignment),
        "repeated_delivery_counts": repeated_counts,
        "poison": poison,
        "poison_archived": poison_archived,
        "poison_deviations": len(poison_deviations),
        "poison_deviations_unexplained": len(poison_unexplained),
        "poison_over_limit": poison_over_limit,
        "poison_extra_deliveries": poison_extra,
        "poison_extra_deliveries_unexplained": poison_extra_unexplained,
        "poison_archived_unobserved": poison_by_leader,
        "deliveries_unobserved": unobserved,
        "archived_at_limit_not_poison": archived_at_limit,
        "accepted_ids": sum(
            1
            for i in range(config.records)
            if (t := terminal_line(ledger.lines.get(i, []), limit)) and t["o"] == "ACCEPT"
        ),
        "rejected_ids": sum(
            1
            for i in range(config.records)
            if (t := terminal_line(ledger.lines.get(i, []), limit)) and t["o"] == "REJECT"
        ),
        "archived_ids": sum(
            1
            for i in range(config.records)
            if (t := terminal_line(ledger.lines.get(i, []), limit)) and t["o"] in FAILED
        )
        + poison_by_leader,
        "deliveries": deliveries,
        "outcomes": dict(outcomes),
        "misplaced": misplaced,
        "unexpected_exits": sum(1 for e in events if e.kind == "exit"),
        "worker_processes": len(ledger.starts),
        "lost_sample": lost_detail,
        "poison_deviation_sample": {str(k): v for k, v in list(poison_deviations.items())[:10]},
        "unexplained_sample": sorted(unexplained)[:10],
        "log_events": dict(Counter(kind for _t, _pid, kind in log_events)),
    }


# -- command line --------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> tuple[ChaosConfig, argparse.Namespace]:
    d = ChaosConfig()
    ap = argparse.ArgumentParser(
        prog="python -m examples.chaos", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--records", type=int, default=d.records)
    ap.add_argument("--partitions", type=int, default=d.partitions)
    ap.add_argument("--all-workers", type=int, default=2, help="workers with role 'all'")
    ap.add_argument("--member-workers", type=int, default=4, help="workers with role 'member'")
    ap.add_argument(
        "--concurrency", type=int, default=d.concurrency, help="handler tasks per worker"
    )
    ap.add_argument(
        "--kill-interval",
        type=float,
        default=d.kill_interval_s,
        help="seconds between SIGKILLs (0: none)",
    )
    ap.add_argument("--max-kills", type=int, default=None)
    ap.add_argument(
        "--kill-for",
        type=float,
        default=None,
        help="stop killing after this many seconds (default: never)",
    )
    ap.add_argument("--kill-roles", default="all,leader,member")
    ap.add_argument("--no-broker-restart", action="store_true")
    ap.add_argument("--broker-down", type=float, default=d.broker_down_s)
    ap.add_argument("--timeout", type=float, default=d.timeout_s)
    ap.add_argument("--seed", type=int, default=None, help="default: random")
    ap.add_argument("--work-ms", type=float, default=d.work_ms)
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--keep-broker-data", action="store_true")
    ap.add_argument("-l", "--log-level", default=d.log_level)
    args = ap.parse_args(argv)
    config = ChaosConfig(
        records=args.records,
        partitions=args.partitions,
        roles=("all",) * args.all_workers + ("member",) * args.member_workers,
        kill_interval_s=args.kill_interval,
        max_kills=args.max_kills,
        kill_for_s=args.kill_for,
        kill_roles=tuple(args.kill_roles.split(",")),
        broker_restart=not args.no_broker_restart,
        broker_down_s=args.broker_down,
        timeout_s=args.timeout,
        seed=args.seed if args.seed is not None else random.randrange(1 << 30),
        concurrency=args.concurrency,
        work_ms=args.work_ms,
        log_level=args.log_level,
    )
    return config, args


def main(argv: Sequence[str] | None = None) -> int:
    config, args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the workers and the broker are always stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_dir = args.run_dir or ROOT / ".queueflow" / "chaos" / time.strftime("%Y%m%d-%H%M%S")
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    broker: LocalBroker | None = None
    bootstrap = bootstrap_from_env()
    say(f"chaos run: seed {config.seed}, run dir {run_dir}")
    try:
        if bootstrap is None:
            port, cport = find_free_ports(2)
            broker = LocalBroker(run_dir / "broker", port=port, controller_port=cport)
            say(f"starting the local Kafka broker on 127.0.0.1:{port} ...")
            broker.start(timeout_s=120)
            bootstrap = broker.bootstrap
        elif config.broker_restart:
            say("$QUEUEFLOW_BROKER is set: an external cluster, no broker restart")
        summary = run(config, run_dir, bootstrap, broker)
    finally:
        if broker is not None:
            broker.stop()
    summary["seed"] = config.seed
    if broker is not None and summary["lost"] == 0 and not args.keep_broker_data:
        shutil.rmtree(broker.log_dirs, ignore_errors=True)  # topic data; broker.log stays
    print(json.dumps({k: v for k, v in summary.items() if not k.endswith("_sample")}), flush=True)
    if summary["lost"]:
        say(f"LOST {summary['lost']} records; samples: {json.dumps(summary['lost_sample'])}")
    return 1 if summary["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
