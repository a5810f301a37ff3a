"""S11 Kafka's perf tool: ``kafka-share-consumer-perf-test.sh`` (ShareConsumerPerformance, Java,
Kafka 4.3.1's jars) against the broker's native share group and against a queueflow share group
through the Kafka-protocol listener (``queueflow.kafka.listener``, docs/kafka-listener.md), same
run, same records.

One topic of ``--s11-records`` 1 KiB records on 4 partitions is produced once; every run reads
all of it from the start in a fresh share group (native: ``share.auto.offset.reset=earliest``
set with Kafka's ConfigCommand before the run; queueflow: the app's default). The queueflow side
is one leader worker (:mod:`bench.qf_app`, role ``leader``: coordinator and every
share-partition's leader) with the listener on a free port; the tool's bootstrap is the
listener's address. The tool runs ``--s11-threads`` share consumers (default 1, the tool's
default) in a JVM of at most 256 MiB heap (``KAFKA_HEAP_OPTS=-Xmx256m``, G1 as
``kafka-run-class.sh`` starts it). Runs alternate as interleaved pairs (``--s11-pairs``, default
5; which side goes first alternates), and each run reports the tool's own MB/s, records/s and
elapsed time (from before the group join to the last record: :mod:`bench.perf_tool`), its rate
after its first progress report (records flowing), the tool JVM's wall time, and the CPU of the
broker, the leader worker and the tool per record. The report gives each side's median and
spread and the median of the per-pair queueflow/native ratios.

``BENCH_SAMPLE_PROFILE=<path>`` in the driver's environment turns on :mod:`bench.sampler` in
the leader worker (``<path>.leader.<pid>``: collapsed stacks of where the listener's time goes).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import time
from typing import Any

from bench import harness
from bench.context import RECORD_SIZE, S1_PARTITIONS, Context, guarded
from bench.harness import Fleet
from bench.measure import start_leader
from bench.perf_tool import MAIN_CLASS, PerfToolOutputError, parse_perf_tool, perf_tool_args
from bench.steady import pair_ratios, round_orders, summary
from bench.variants import set_share_earliest
from queueflow.devtools.broker import create_topic, find_free_ports, kafka_libs, kafka_tool_argv

__all__ = ["SIDES", "TOOLS_VERSION", "scenario_s11", "tool_argv"]

#: The two sides, in even pairs' order (odd pairs reverse it).
SIDES = ("native", "queueflow")
#: The perf tool's jars, whatever the broker's release (3.9.1 has no share consumer).
TOOLS_VERSION = "4.3.1"
#: ``KAFKA_HEAP_OPTS=-Xmx256m`` and ``kafka-run-class.sh``'s default performance options.
JVM_OPTS = ["-Xmx256m", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"]
#: ``group.share.heartbeat.interval.ms`` of the queueflow side: Kafka's default, which the native
#: side has (the tool's group join waits for a heartbeat to bring the assignment).
HEARTBEAT_MS = 5000
#: Milliseconds without a record (joining the group included) before the tool gives up.
TOOL_TIMEOUT_MS = 30_000


def tool_argv(args: list[str]) -> list[str]:
    """The perf tool's JVM command line (Kafka :data:`TOOLS_VERSION`'s jars, :data:`JVM_OPTS`,
    WARN logging to stderr)."""
    argv = kafka_tool_argv(MAIN_CLASS, args, jvm_opts=JVM_OPTS)
    argv[argv.index("-cp") + 1] = f"{kafka_libs(version=TOOLS_VERSION)}/*"
    return argv


def _wait_listening(port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _one_run(
    ctx: Context,
    side: str,
    bootstrap: str,
    topic: str,
    records: int,
    pair: int,
    pids: dict[str, int],
) -> dict[str, Any]:
    """One tool run in a fresh group against ``bootstrap``; ``pids``: server processes whose
    CPU is counted (broker, leader worker)."""
    group = ctx.uid(f"s11-{pair}-{side}")
    if side == "native":
        error = set_share_earliest(ctx, group)
        if error:
            return {"side": side, "error": error}
    args = perf_tool_args(
        bootstrap, topic, group, records, threads=ctx.args.s11_threads, timeout_ms=TOOL_TIMEOUT_MS
    )
    log = ctx.run_dir / "s11" / f"{pair}-{side}.log"
    cpu0 = {name: harness.cpu_seconds(pid) for name, pid in pids.items()}
    tool0 = _children_cpu()
    started = time.monotonic()
    try:
        proc = subprocess.run(
            tool_argv(args),
            capture_output=True,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=ctx.timeout(ctx.args.s11_timeout),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return {"side": side, "group": group, "error": f"perf tool still running after {exc}"}
    wall = time.monotonic() - started
    cpu = {name: harness.cpu_seconds(pid) for name, pid in pids.items()}
    log.write_text(f"$ {' '.join(args)}\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    out: dict[str, Any] = {"side": side, "group": group, "wall_s": round(wall, 2)}
    try:
        parsed = parse_perf_tool(proc.stdout)
    except PerfToolOutputError as exc:
        return out | {"error": f"exit {proc.returncode}: {exc}; stderr {proc.stderr[-300:]!r}"}
    out.update(parsed.as_dict(records))
    cpu_s = {
        n: round(b - a, 2) for n, b in cpu.items() if (a := cpu0[n]) is not None and b is not None
    }
    cpu_s["tool"] = round(_children_cpu() - tool0, 2)
    out["cpu_s"] = cpu_s
    out["cpu_us_per_record"] = {
        n: round(1e6 * s / max(parsed.records, 1), 1) for n, s in cpu_s.items()
    }
    if proc.returncode != 0:
        out["error"] = f"perf tool exited {proc.returncode}: {proc.stderr[-300:]}"
    elif not out["complete"]:
        out["error"] = f"{parsed.records:,} of {records:,} records (timed out: {parsed.timed_out})"
    return out


def _side_summary(runs: list[dict[str, Any]], side: str) -> dict[str, Any]:
    """Median and spread of each figure over ``side``'s complete runs, and its failures."""
    mine = [r for r in runs if r.get("side") == side]
    good = [r for r in mine if not r.get("error")]
    out: dict[str, Any] = {
        key: summary([r.get(key) for r in good], digits)
        for key, digits in (
            ("rec_s", 1),
            ("mb_s", 3),
            ("elapsed_s", 3),
            ("steady_rec_s", 1),
            ("wall_s", 2),
        )
    }
    for name in ("broker", "leader", "tool"):
        values = [r.get("cpu_us_per_record", {}).get(name) for r in good]
        if any(v is not None for v in values):
            out[f"{name}_cpu_us"] = summary(values, 1)
    out["errors"] = [r["error"] for r in mine if r.get("error")]
    return out


def summarize(runs: list[dict[str, Any]], pairs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per side (:func:`_side_summary`) and the queueflow/native ratios: the median of per-pair
    ratios of the tool's records/s (``ratio``), of its rate after the first report
    (``steady_ratio``) and of its elapsed time (``elapsed_ratio``); a pair with a failed run
    has no ratio."""
    out: dict[str, Any] = {side: _side_summary(runs, side) for side in SIDES}
    for key, figure in (("ratio", "rec_s"), ("steady_ratio", "steady_rec_s")):
        rounds = [
            {s: (None if p.get(s, {}).get("error") else p.get(s, {}).get(figure)) for s in SIDES}
            for p in pairs
        ]
        out[key] = summary(pair_ratios(rounds, "queueflow", "native"), 3)
    return out


def scenario_s11(ctx: Context) -> dict[str, Any]:
    n, pairs = ctx.args.s11_records, ctx.args.s11_pairs
    ctx.say(
        f"S11: Kafka's share-consumer perf tool, native vs queueflow's listener, {pairs} "
        f"interleaved pairs of {n:,} records"
    )
    topic = ctx.uid("s11")
    create_topic(ctx.bootstrap, topic, S1_PARTITIONS)
    produced_s = harness.produce(ctx.bootstrap, topic, n, RECORD_SIZE, S1_PARTITIONS)
    run_dir = ctx.run_dir / "s11"
    (port,) = find_free_ports(1)
    listener = f"127.0.0.1:{port}"
    out: dict[str, Any] = {
        "records": n,
        "record_bytes": RECORD_SIZE,
        "partitions": S1_PARTITIONS,
        "threads": ctx.args.s11_threads,
        "pairs": pairs,
        "produce_s": round(produced_s, 1),
        "tool": f"ShareConsumerPerformance, Kafka {TOOLS_VERSION} jars, {' '.join(JVM_OPTS)}",
    }
    settings = {
        "QUEUEFLOW_KAFKA_LISTENER": f"PLAINTEXT://{listener}",
        # Kafka's default, as the native group has: the assignment comes with a heartbeat
        "BENCH_HEARTBEAT_MS": str(HEARTBEAT_MS),
    }
    if os.environ.get("BENCH_SAMPLE_PROFILE"):
        settings["BENCH_SAMPLE_ROLES"] = "leader"
    runs: list[dict[str, Any]] = []
    by_pair: list[dict[str, dict[str, Any]]] = []
    with Fleet(run_dir) as fleet:
        leader = start_leader(
            ctx, fleet, ctx.uid("s11"), [topic], S1_PARTITIONS, run_dir, **settings
        )
        fleet.go()  # bench.qf_app holds fetches until the go-file: the listener's must not wait
        if not _wait_listening(port, 60):
            return out | {"error": f"the listener at {listener} did not answer within 60 s"}
        longest = 0.0
        for pair, order in enumerate(round_orders(list(SIDES), pairs)):
            if pair and not ctx.affordable(longest, f"pairs {pair + 1}..{pairs}", out):
                break  # at least one pair always runs
            pair_started = time.monotonic()
            got: dict[str, dict[str, Any]] = {}
            for side in order:
                pids = {"broker": ctx.broker_pid} if ctx.broker_pid else {}
                if side == "queueflow":
                    pids["leader"] = leader.pid
                bootstrap = ctx.bootstrap if side == "native" else listener
                got[side] = guarded(
                    lambda s=side, b=bootstrap, i=pair, p=pids: _one_run(ctx, s, b, topic, n, i, p)
                )
                got[side].setdefault("side", side)
                runs.append(got[side])
            by_pair.append(got)
            longest = max(longest, time.monotonic() - pair_started)
            ctx.say(
                f"  pair {pair + 1}: "
                + ", ".join(
                    f"{s} {got[s].get('rec_s', 'n/a')} rec/s ({got[s].get('error') or 'ok'})"
                    for s in order
                )
            )
        if fleet.dead():
            out["error"] = "the leader worker died: " + leader.log_tail(10)
    out["runs"] = runs
    out.update(summarize(runs, by_pair))
    return out
