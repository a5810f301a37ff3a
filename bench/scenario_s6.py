"""S6 idle fleet: the CPU an empty queue costs. One leader worker and 4 member workers on a
4-partition topic, no records, a 30 s window (``--s6-seconds``); then one record, to show the
fleet was live."""

from __future__ import annotations

import os
import time
from typing import Any

from bench import harness
from bench.context import RECORD_SIZE, S1_PARTITIONS, S1_PROCESSES, Context
from bench.harness import Fleet, total
from bench.measure import balanced, faust_argv, qf_env, stable, start_leader
from queueflow.devtools.broker import create_topic

__all__ = ["S6_TARGETS_PCT", "scenario_s6"]

#: The targets (docs/performance.md), in % of one core: the leader worker, the broker JVM, each
#: member.
S6_TARGETS_PCT = {"leader": 2.0, "broker": 5.0, "member": 0.5}


def _fetches(stats: dict[str, Any]) -> int:
    """ShareFetches (max_records > 0) a member has had answered (``bench.qf_app``'s timings,
    refreshed every 2 s)."""
    return int(((stats.get("timings") or {}).get("fetch_rtt_ms") or {}).get("n") or 0)


def scenario_s6(ctx: Context) -> dict[str, Any]:
    partitions, processes = S1_PARTITIONS, S1_PROCESSES
    window_s = float(ctx.args.s6_seconds)
    topic, app_id, group = ctx.uid("s6"), ctx.uid("s6"), "g-s6-idle"
    create_topic(ctx.bootstrap, topic, partitions)
    run_dir = ctx.run_dir / "s6-idle"
    out: dict[str, Any] = {
        "topic": topic,
        "partitions": partitions,
        "members": processes,
        "layout": "leader",
        "concurrency": 1,
        "window_s": window_s,
        "targets_pct": S6_TARGETS_PCT,
    }
    ctx.say(f"S6: idle fleet, 1 leader + {processes} members on {topic}, {window_s:.0f} s ...")
    with Fleet(run_dir) as fleet:
        leader = start_leader(ctx, fleet, app_id, [topic], partitions, run_dir)
        members = [
            fleet.add(
                f"member-{i}",
                faust_argv("bench.qf_app", run_dir / f"data-{i}"),
                qf_env(ctx, app_id, topic, group, "member", 1, "noop"),
            )
            for i in range(processes)
        ]
        started = time.monotonic()
        if not fleet.wait(stable(balanced(partitions, processes), 1.5), 90, members=members):
            out["error"] = "members not assigned within 90 s"
            out["logs"] = {w.name: w.log_tail(12) for w in fleet.workers}
            return out
        out["startup_s"] = round(time.monotonic() - started, 1)
        # bench.qf_app holds ShareFetches until the go-file exists; then each member must have
        # had one answered (an empty one: nothing is produced) before the window opens.
        fleet.go()
        if not fleet.wait(
            lambda s: len(s) == processes and all(_fetches(x) >= 1 for x in s),
            30,
            members=members,
        ):
            out["error"] = "not every member had a ShareFetch answered within 30 s"
            out["fetches"] = {w.name: _fetches(w.stats()) for w in members}
            out["logs"] = {w.name: w.log_tail(12) for w in fleet.workers}
            return out
        out["window"] = idle_window(ctx, fleet, leader, members, window_s)
        out.update(cpu_figures(out["window"]))
        out["liveness"] = liveness(ctx, fleet, members, topic, partitions)
    out["faust_floor"] = faust_floor(ctx, window_s)
    if out["window"].get("error"):
        out["error"] = out["window"]["error"]
    elif not out["liveness"].get("handled"):
        out["error"] = "the record produced after the window was not handled"
    return out


def idle_window(
    ctx: Context,
    fleet: Fleet,
    leader: harness.Worker,
    members: list[harness.Worker],
    window_s: float,
) -> dict[str, Any]:
    """CPU seconds (``harness.cpu_seconds``: user + system from /proc) of the leader, the
    broker JVM and each member over ``window_s`` seconds, and the ShareFetches in that time."""
    pids = {"leader": leader.pid, **{w.name: w.pid for w in members}}
    if ctx.broker_pid:
        pids["broker"] = ctx.broker_pid
    before_stats = {w.name: w.stats() for w in [leader, *members]}
    fleet.quiet(True)  # the bench's own stats writes are not queueflow's idle cost
    t0 = time.monotonic()
    before = {name: harness.cpu_seconds(pid) for name, pid in pids.items()}
    deadline = t0 + window_s
    dead: list[str] = []
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
        dead = [w.name for w in fleet.dead()]
        if dead:
            break
    after = {name: harness.cpu_seconds(pid) for name, pid in pids.items()}
    elapsed = time.monotonic() - t0
    loud_at = fleet.quiet(False)
    fleet.wait(
        lambda stats: all((s.get("written") or 0) > loud_at for s in stats),
        10,
        members=[leader, *members],
    )
    after_stats = {w.name: w.stats() for w in [leader, *members]}
    cpu_s: dict[str, float] = {}
    for name, start in before.items():
        end = after[name]
        if start is not None and end is not None:
            cpu_s[name] = round(end - start, 2)
    out: dict[str, Any] = {
        "seconds": round(elapsed, 2),
        "cpu_s": cpu_s,
        "pct_of_core": {name: round(100 * cpu / elapsed, 2) for name, cpu in cpu_s.items()},
        # from the workers' timings, refreshed every 2 s: approximate
        "share_fetches": {
            w.name: _fetches(after_stats[w.name]) - _fetches(before_stats[w.name]) for w in members
        },
        "leader_events": int((after_stats["leader"].get("timings") or {}).get("leader_events") or 0)
        - int((before_stats["leader"].get("timings") or {}).get("leader_events") or 0),
    }
    if not ctx.broker_pid:
        out["broker_note"] = "broker not started by this run ($QUEUEFLOW_BROKER): not measured"
    if dead:
        out["error"] = f"worker(s) died during the idle window: {', '.join(dead)}"
        out["logs"] = {w.name: w.log_tail(12) for w in fleet.workers if w.name in dead}
    return out


def cpu_figures(window: dict[str, Any]) -> dict[str, Any]:
    """% of a core per process against its target: ``cpu_pct`` and ``checks`` (one per
    process, ``met`` None when not measured)."""
    pct = window.get("pct_of_core", {})
    members = sorted(name for name in window.get("cpu_s", {}) if name.startswith("member-"))
    checks = []
    for name in ["leader", "broker", *members]:
        target = S6_TARGETS_PCT["member" if name.startswith("member-") else name]
        value = pct.get(name)
        checks.append(
            {
                "process": name,
                "pct_of_core": value,
                "target_pct": target,
                "met": None if value is None else value <= target,
            }
        )
    return {
        "cpu_pct": {
            "leader": pct.get("leader"),
            "broker": pct.get("broker"),
            "members": {name: pct[name] for name in members},
            "members_total": round(sum(pct[name] for name in members), 2),
        },
        "checks": checks,
        # None when a process was not measured (e.g. the broker of $QUEUEFLOW_BROKER)
        "all_met": None if any(c["met"] is None for c in checks) else all(c["met"] for c in checks),
    }


def liveness(
    ctx: Context, fleet: Fleet, members: list[harness.Worker], topic: str, partitions: int
) -> dict[str, Any]:
    """Produce one record and wait (up to 30 s) for a member's ACCEPT of it to be answered."""
    produced_at = time.time()
    harness.produce(ctx.bootstrap, topic, 1, RECORD_SIZE, partitions, timeout_s=30)
    handled = fleet.wait(lambda s: total(s) >= 1, 30, members=members)
    stats = [w.stats() for w in members]
    out: dict[str, Any] = {"handled": handled, "records": total(stats)}
    if handled:
        last = max(s["last"] for s in stats if s.get("last"))
        out["produce_to_ack_ms"] = round(1000 * (last - produced_at))
        out["by"] = [w.name for w, s in zip(members, stats, strict=True) if s.get("done")]
    return out


def faust_floor(ctx: Context, window_s: float) -> dict[str, Any]:
    """The floor under the targets: one plain Faust worker (``bench.faust_app``, an agent on an
    idle 4-partition topic, no queueflow) idle for ``window_s`` seconds, in % of a core. Every
    queueflow worker is a Faust worker, so none idles below this."""
    topic, app_id = ctx.uid("s6-faust"), ctx.uid("s6-faust")
    create_topic(ctx.bootstrap, topic, S1_PARTITIONS)
    with Fleet(ctx.run_dir / "s6-faust-floor") as fleet:
        env = dict(
            os.environ,
            BENCH_APP_ID=app_id,
            BENCH_BROKER=f"kafka://{ctx.bootstrap}",
            BENCH_TOPIC=topic,
            BENCH_CONCURRENCY="1",
            BENCH_MODE="noop",
        )
        worker = fleet.add("faust-0", faust_argv("bench.faust_app", fleet.run_dir / "data"), env)
        assigned = lambda s: bool(s and len(s[0].get("assigned") or []) == S1_PARTITIONS)  # noqa: E731
        if not fleet.wait(stable(assigned, 1.5), 90):
            return {"error": "the Faust worker was not assigned within 90 s"}
        fleet.go()
        fleet.quiet(True)  # as for the queueflow fleet
        before = harness.cpu_seconds(worker.pid)
        t0 = time.monotonic()
        fleet.wait(lambda _s: False, window_s)  # the idle window: nothing to wait for
        after = harness.cpu_seconds(worker.pid)
        elapsed = time.monotonic() - t0
        fleet.quiet(False)
    if before is None or after is None:
        return {"error": "the Faust worker's CPU time could not be read"}
    return {"seconds": round(elapsed, 2), "pct_of_core": round(100 * (after - before) / elapsed, 2)}
