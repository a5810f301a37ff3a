"""Orchestration of one chaos run: workers, SIGKILLs, the broker restart, the final check."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from examples.chaos.analysis import analyse, worker_log_events
from examples.chaos.cluster import ClusterNemesis
from examples.chaos.config import ROOT, ChaosConfig
from examples.chaos.dead_letters import (
    archived_ids,
    check_dead_letters,
    dead_letter_topic,
    read_dead_letters,
    wait_for_dead_letters,
)
from examples.chaos.leader_state import replay_diagnostics, settle
from examples.chaos.ledger import Ledger, terminal_line
from examples.chaos.report import say
from examples.chaos.results import check_results, read_results, results_topic
from examples.chaos.timeline import Event
from examples.chaos.workers import Worker, stop_all, wait_for_leaders
from queueflow.devtools.broker import LocalBroker, create_topic
from queueflow.testing import produce

__all__ = ["queueflow_version", "run"]


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


def wait_quiet(ledger: Ledger, quiet_s: float, timeout_s: float) -> None:
    """Poll ``ledger`` until it got no new line for ``quiet_s`` seconds, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last < quiet_s:
        time.sleep(0.5)
        if ledger.poll():
            last = time.monotonic()


def run(
    config: ChaosConfig,
    run_dir: Path,
    bootstrap: str,
    broker: LocalBroker | None = None,
    progress: Callable[[str], None] = say,
    nemesis: ClusterNemesis | None = None,
) -> dict[str, Any]:
    """One chaos run against ``bootstrap``; ``broker`` (if given) is restarted once; on a
    cluster, ``nemesis`` kills one broker for good and roll-restarts the others meanwhile (the
    run goes on until it is through, see :mod:`examples.chaos.cluster`).

    Always stops every worker it started; the broker is left running (started again if this run
    stopped it). Returns the summary (see :func:`analyse`).
    """
    started = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    run_id = uuid.uuid4().hex[:8]
    topic = f"chaos-{run_id}"
    app_id = f"queueflow-chaos-{run_id}"
    rf = config.replication_factor
    create_topic(bootstrap, topic, config.partitions, replication_factor=rf)
    if config.exactly_once:
        create_topic(bootstrap, results_topic(topic), config.partitions, replication_factor=rf)
    dlq = dead_letter_topic(topic) if config.dead_letters else ""
    if dlq:
        create_topic(bootstrap, dlq, config.partitions, replication_factor=rf)
    # Only the run's parameters: the workers add os.environ and QUEUEFLOW_LOG_FORMAT=json.
    env = dict(
        CHAOS_APP_ID=app_id,
        CHAOS_TOPIC=topic,
        CHAOS_BROKER=";".join(f"kafka://{b}" for b in bootstrap.split(",")),
        CHAOS_REPLICATION_FACTOR=str(rf),
        CHAOS_SEED=str(config.seed),
        CHAOS_RELEASE=str(config.release_p),
        CHAOS_REJECT=str(config.reject_p),
        CHAOS_POISON_MOD=str(config.poison_mod),
        CHAOS_WORK_MS=str(config.work_ms),
        CHAOS_CONCURRENCY=str(config.concurrency),
        CHAOS_SHARE_SETTINGS=json.dumps(config.share_settings),
        CHAOS_RESULTS_TOPIC=results_topic(topic) if config.exactly_once else "",
        CHAOS_DLQ_TOPIC=dlq,
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
    all_done_at: float | None = None  # when the last open id got a terminal outcome
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
        ids = [str(i) for i in range(config.records)]
        where = asyncio.run(
            produce(
                bootstrap,
                topic,
                ids,
                keys=ids,
                partitions=config.partitions,  # id % partitions is the partition
                acks="all",
                linger_ms=20,
                enable_idempotence=True,
                timeout_s=max(120.0, config.records / 100),
            )
        )
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
        if nemesis is not None:
            nemesis.begin(events, lambda: 1 - len(open_ids) / config.records)
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
                # On a cluster, the run lasts until the brokers' kill and rolling restart are
                # through (their summary says whether that was before the last record).
                nemesis_busy = nemesis is not None and not nemesis.done.is_set()
                if not open_ids and all_done_at is None:
                    all_done_at = time.time()
                if not open_ids and not nemesis_busy:
                    finished = True
                    break
                if (
                    open_ids
                    and now - last_progress > config.stall_check_s
                    and len(open_ids) <= max(1000, config.records // 10)
                ):
                    # Nothing new for a while: maybe the leaders are done with the open ids
                    # (Archived after a last delivery no handler saw).
                    with contextlib.suppress(Exception):
                        settled.update(settle(bootstrap, app_id, topic, config, where, open_ids))
                    open_ids.difference_update(settled)
                    last_progress = now
                    if not open_ids and not nemesis_busy:
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
        if config.exactly_once and finished:
            # A first ACCEPT ends a record in the ledger, but its transaction may have aborted
            # (its member killed): the record comes round again within a lock duration (plus
            # an open transaction's timeout). Wait until the ledger is quiet that long.
            quiet_s = 2 * config.lock_s + 12.0
            progress(f"exactly-once: waiting for {quiet_s:.0f} s without a new delivery")
            wait_quiet(ledger, quiet_s, config.timeout_s)
        # One last look at the ledger, then at the leaders' state for what is still open.
        ledger.poll()
        for record_id in list(open_ids):
            if terminal_line(ledger.lines[record_id], limit):
                open_ids.discard(record_id)
        finished = finished or not open_ids
        if dlq:  # the last archives are written within a round of the leaders' DLQ writers
            expected = archived_ids(ledger, config.records, limit)
            progress(f"dead letters: waiting until the {len(expected)} archived are in {dlq}")
            wait_for_dead_letters(bootstrap, dlq, config.partitions, expected, 60.0)
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
    if config.exactly_once:
        counts = asyncio.run(read_results(bootstrap, results_topic(topic), config.partitions))
        summary.update(check_results(ledger, counts, config.records))
    if dlq:
        letters = asyncio.run(read_dead_letters(bootstrap, dlq, config.partitions))
        archived = archived_ids(ledger, config.records, limit, settled)
        summary.update(check_dead_letters(archived, letters))
    if nemesis is not None:
        summary["cluster"] = nemesis.summary()
        # The brokers' kill and rolling restart all happened while records were in flight.
        summary["cluster"]["under_load"] = nemesis.done_at is not None and (
            all_done_at is None or nemesis.done_at <= all_done_at
        )
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
