"""Launching benchmark worker processes and measuring a fleet of them (bench.harness.Fleet)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness
from bench.context import STALL_S, Context
from bench.harness import Fleet, span, total
from queueflow.testing import JSON_LOG_ENV, faust_worker_argv

__all__ = [
    "balanced",
    "faust_argv",
    "measure_fleet",
    "qf_env",
    "stable",
    "start_leader",
]

#: Log level of every Faust worker; set from --faust-loglevel. At ``warn`` (faust's default) the
#: worker's startup spinner sets the root logger to DEBUG for the life of the process, so every
#: aiokafka/Faust debug call builds a LogRecord; ``info`` (what README.md and ``queueflow
#: leader`` use) avoids that.
FAUST_LOGLEVEL = "info"


def faust_argv(module: str, datadir: Path, loop: str | None = None) -> list[str]:
    """``faust -A <module> worker`` at :data:`FAUST_LOGLEVEL`, on a free web port; ``loop``:
    Faust's ``-L`` (``aio`` = asyncio, ``uvloop``), None = Faust's default (``aio``)."""
    argv = faust_worker_argv(module, datadir, loglevel=FAUST_LOGLEVEL)
    if loop is not None:
        at = argv.index("faust") + 1
        argv[at:at] = ["-L", loop]
    return argv


def qf_env(
    ctx: Context,
    app_id: str,
    topic: str,
    group: str,
    role: str,
    concurrency: int,
    mode: str,
    **extra: str,
) -> dict[str, str]:
    return dict(
        os.environ,
        **JSON_LOG_ENV,
        BENCH_APP_ID=app_id,
        BENCH_BROKER=f"kafka://{ctx.bootstrap}",
        BENCH_TOPIC=topic,
        BENCH_GROUP=group,
        BENCH_CONCURRENCY=str(concurrency),
        BENCH_MODE=mode,
        QUEUEFLOW_ROLE=role,
        **extra,
    )


def balanced(partitions: int, members: int) -> Callable[[list[dict[str, Any]]], bool]:
    """All members report an assignment, together covering every partition, balanced as the
    share-group assignor (and Kafka's) balance them."""

    def check(stats: list[dict[str, Any]]) -> bool:
        if len(stats) < members or not all(s.get("ready") for s in stats):
            return False
        sizes = [len(s.get("assigned") or []) for s in stats]
        union = set().union(*(set(s.get("assigned") or []) for s in stats))
        if union != set(range(partitions)) or max(sizes) - min(sizes) > 1:
            return False
        return members > partitions or sum(sizes) == partitions

    return check


def stable(
    check: Callable[[list[dict[str, Any]]], bool], hold_s: float
) -> Callable[[list[dict[str, Any]]], bool]:
    """``check`` has held, with the same assignments, for ``hold_s`` seconds."""
    since: list[Any] = [None, None]

    def wrapped(stats: list[dict[str, Any]]) -> bool:
        if not check(stats):
            since[0] = None
            return False
        key = [tuple(s.get("assigned") or []) for s in stats]
        if since[0] is None or since[1] != key:
            since[0], since[1] = time.monotonic(), key
        return time.monotonic() - since[0] >= hold_s

    return wrapped


def measure_fleet(
    ctx: Context,
    fleet: Fleet,
    expected: int,
    ready: Callable[..., bool],
    start_timeout_s: float,
    run_timeout_s: float,
    during: Callable[[Fleet], Any] | None = None,
    members: list[harness.Worker] | None = None,
    window_s: float | None = None,
    also_cpu: list[harness.Worker] | None = None,
) -> dict[str, Any]:
    """Wait until ready, create the go-file, wait for ``expected`` finished records.

    Returns:
        ``records``, ``seconds`` (first delivery → last finished), ``rate`` (records/s),
        ``complete``; on trouble ``error`` and the logs' tails.
    """
    started = time.monotonic()
    members = members or fleet.workers
    if not fleet.wait(ready, start_timeout_s, members=members):
        return {
            "error": f"consumers not ready within {start_timeout_s:.0f} s",
            "stats": fleet.stats(),
            "logs": {w.name: w.log_tail(12) for w in fleet.workers},
        }
    startup = time.monotonic() - started
    go_at = fleet.go()
    for w in also_cpu or []:
        w.cpu_at_go = harness.cpu_seconds(w.pid)
    broker_cpu_at_go = harness.cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None
    extra = during(fleet) if during is not None else None
    progress = {"done": -1, "at": time.monotonic()}

    def finished_or_stalled(stats: list[dict[str, Any]]) -> bool:
        # Give up early when nothing finishes for STALL_S seconds (a broken run).
        done_now = total(stats)
        if done_now != progress["done"]:
            progress.update(done=done_now, at=time.monotonic())
        return done_now >= expected or time.monotonic() - progress["at"] > STALL_S

    fleet.wait(finished_or_stalled, window_s or run_timeout_s, interval_s=0.05, members=members)
    complete = total([w.stats() for w in members]) >= expected
    stats = [w.stats() for w in members]
    first, last = span(stats)
    done = total(stats)
    out: dict[str, Any] = {
        "records": done,
        "expected": expected,
        "complete": complete,
        "startup_s": round(startup, 1),
    }
    if first and last and last > first:
        out["seconds"] = round(last - first, 3)
        out["rate"] = round(done / (last - first), 1)
        out["go_to_first_ms"] = round((first - go_at) * 1000)
    else:
        out["error"] = "no records finished"
    out["delivered"] = total(stats, "delivered")
    out["released"] = total(stats, "released")
    out["per_process"] = [int(s.get("done") or 0) for s in stats]
    out["cpu_s"] = fleet.cpu_since_go()
    for w in also_cpu or []:
        now = harness.cpu_seconds(w.pid)
        if now is not None and w.cpu_at_go is not None:
            out["cpu_s"][w.name] = round(now - w.cpu_at_go, 2)
    seconds = out.get("seconds")
    if seconds:
        # CPU of each process divided by all records finished, and their sum: the CPU one
        # record costs the whole consumer side (the broker not included).
        out["cpu_us_per_record"] = {
            name: round(1e6 * cpu / max(done, 1), 1) for name, cpu in out["cpu_s"].items()
        }
        out["cpu_us_per_record_total"] = round(sum(out["cpu_us_per_record"].values()), 1)
        broker_now = harness.cpu_seconds(ctx.broker_pid) if ctx.broker_pid else None
        if broker_now is not None and broker_cpu_at_go is not None:
            # from go to the end of the wait (a little more than first -> last record)
            out["broker_cpu_s"] = round(broker_now - broker_cpu_at_go, 2)
            out["broker_cpu_us_per_record"] = round(1e6 * out["broker_cpu_s"] / max(done, 1), 1)
    timings = {
        w.name: s["timings"]
        for w, s in zip(fleet.workers, fleet.stats(), strict=True)
        if s.get("timings")
    }
    if timings:
        out["timings"] = timings
    hook_errors = {
        w.name: s["hook_errors"]
        for w, s in zip(fleet.workers, fleet.stats(), strict=True)
        if s.get("hook_errors")
    }
    if hook_errors:  # the bench's counting hooks no longer fit queueflow's internals
        out["hook_errors"] = hook_errors
        out["error"] = out.get("error") or f"bench hooks failed: {hook_errors}"[:300]
    if window_s and not complete:
        out["window_s"] = window_s  # a rate over a fixed window, not a full drain
    elif not complete:
        stalled = time.monotonic() - progress["at"] > STALL_S
        out["error"] = out.get("error") or (
            f"stalled: nothing finished for {STALL_S:.0f} s"
            if stalled
            else f"timed out after {run_timeout_s:.0f} s"
        )
        out["logs"] = {w.name: w.log_tail(12) for w in fleet.workers if not w.alive()}
    if extra is not None:
        out["during"] = extra
    return out


def start_leader(
    ctx: Context,
    fleet: Fleet,
    app_id: str,
    topics: list[str],
    partitions: int,
    run_dir: Path,
    loop: str | None = None,
    **settings_env: str,
) -> Any:
    """A leader-only worker (role ``leader`` of :mod:`bench.qf_app`, i.e. what ``queueflow
    leader`` runs, plus the bench's timing hooks); waits until it owns every request partition
    and has recovered its tables. ``settings_env``: extra environment, e.g. settings as
    ``QUEUEFLOW_LEADER_STATE_DURABILITY="buffered"``; ``loop``: Faust's ``-L`` (see
    :func:`faust_argv`).

    Raises:
        RuntimeError: not ready within 90 s.
    """
    env = qf_env(
        ctx,
        app_id,
        topics[0],
        "bench",
        "leader",
        1,
        "noop",
        BENCH_LEAD_TOPICS=",".join(topics[1:]),
        **settings_env,
    )
    worker = fleet.add("leader", faust_argv("bench.qf_app", run_dir / "leader-data", loop), env)
    ok = fleet.wait(
        lambda s: bool(s[0].get("recovered")) and s[0].get("owned") == partitions,
        90,
        members=[worker],
    )
    if not ok:
        raise RuntimeError(f"leader worker not ready within 90 s:\n{worker.log_tail(20)}")
    return worker
