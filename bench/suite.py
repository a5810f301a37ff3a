"""queueflow benchmark suite: ``make bench`` / ``python -m bench``.

Runs, against one Kafka broker (a LocalBroker on free ports started for the run, or
``$QUEUEFLOW_BROKER``):

S1  throughput, as interleaved rounds (``--pairs``, default 5) of steady-state windows over one
    pre-produced topic of 1 KiB records on 4 partitions, no-op handlers, 4 consumer processes:
    queueflow batch handler vs native confluent-kafka ShareConsumer iterating its batch;
    queueflow per-record handler vs native calling a function per record; queueflow batch vs
    raw aiokafka; queueflow batch on uvloop vs asyncio (bench.scenario_s1, bench.s1_runs);
S2  scaling past partitions: 1 partition, a handler that awaits 10 ms, 1..32 consumers;
S3  latency at fixed produce rates (2,500 and 10,000 records/s), a window after a warm-up;
S4  redelivery: CPU per delivery with 10 % RELEASEd once, interleaved with S1's per-record runs;
S5  memory: leader RSS with 2,000 and 10,000 in-flight records per partition, and the engine's
    bytes per in-flight record;
S6  idle fleet: % of a core used by the leader worker, the broker and each of 4 members on an
    empty 4-partition topic over 30 s, then one record to show the fleet was live;
S9  exactly-once: ``processing_guarantee="exactly_once"`` against ``"at_least_once"``, a result
    per record, counted downstream read_committed, as interleaved pairs;
S10 key-ordered sharing: ``share.ordering=key`` against unordered sharing, 16 members on one
    partition, uniform and Zipf keys, as interleaved repetitions;
S11 Kafka's perf tool: ``kafka-share-consumer-perf-test.sh`` (Java ShareConsumerPerformance)
    against the broker's native share group and against a queueflow group through the
    Kafka-protocol listener, as interleaved pairs over one pre-produced topic
    (bench.scenario_s11);
S8  Spark source throughput: the ``queueflow`` source vs Spark's built-in Kafka source on one
    partition, 1/2/4 tasks, a no-op and a 5 ms-per-record ``foreachBatch``.

Every figure comes from counters the consumer processes report (``bench.harness.Stats``); S1
and S4 count a window after a warm-up (``bench.steady``), S2 and S9/S10 from the first record
delivered to the last acknowledgement answered (or record consumed). Prints a table and the
``headline`` object and writes ``bench/results/latest.json``. Benchmarks never assert: failures
are recorded in the results and the suite goes on.

Modules: :mod:`bench.suite` (this: arguments, the broker, the budget, the run),
``bench.scenario_s1`` .. ``bench.scenario_s8`` (one per scenario), :mod:`bench.variants` (the
consumers compared), :mod:`bench.measure` (launching and measuring worker fleets),
:mod:`bench.profiling` (py-spy), :mod:`bench.context` (shared context and constants),
:mod:`bench.report` (table and JSON), :mod:`bench.harness` (processes, stats, producing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import measure
from bench.context import RESULTS, Context, guarded
from bench.harness import ROOT
from bench.report import table, write
from bench.scenario_s1 import scenario_s1
from bench.scenario_s2 import scenario_s2
from bench.scenario_s3 import scenario_s3
from bench.scenario_s4 import scenario_s4
from bench.scenario_s5 import scenario_s5
from bench.scenario_s6 import scenario_s6
from bench.scenario_s8 import scenario_s8
from bench.scenario_s9 import scenario_s9
from bench.scenario_s10 import scenario_s10
from bench.scenario_s11 import scenario_s11
from bench.steady import headline
from queueflow.devtools.broker import LocalBroker, bootstrap_from_env, find_free_ports

__all__ = ["SCENARIOS", "main", "parse_args"]

#: Seconds each scenario needs at least (its reserve while earlier scenarios run).
MIN_SECONDS = {
    "S1": 120.0,
    "S2": 150.0,
    "S3": 110.0,  # two rates: fleet start, warm-up, window
    "S4": 10.0,  # read from S1's rounds
    "S5": 40.0,
    "S6": 75.0,  # startup + the 30 s window + the liveness record
    "S8": 240.0,
    "S9": 150.0,
    "S10": 120.0,
    "S11": 240.0,  # broker-side produce, leader start, 5 pairs of tool JVMs (~40 s a pair)
}
SCENARIOS = {
    "S1": scenario_s1,
    "S2": scenario_s2,
    "S3": scenario_s3,
    "S4": scenario_s4,
    "S5": scenario_s5,
    "S6": scenario_s6,
    "S8": scenario_s8,
    "S9": scenario_s9,
    "S10": scenario_s10,
    "S11": scenario_s11,
}


#: S1's variants, in the order of even rounds (odd rounds reverse it): see bench.s1_runs.
S1_VARIANTS = "qf_batch,native_batch,raw,qf_batch_uvloop,qf_record,native_record"

#: ``--quick``: every scenario but S8 in about 6 minutes (figures not comparable: 1 round,
#: short windows, small sizes); S8 (Spark) left out.
QUICK = {
    "scenarios": "S1,S2,S3,S4,S5,S6,S9,S10,S11",
    "pairs": 1,
    "warmup": 1.0,
    "window": 3.0,
    "s1_topic_records": 3_000_000,
    "s3_warmup": 1.0,
    "s3_window": 3.0,
    "s2_consumers": "1,16",
    "s2_faust": False,
    "s6_seconds": 5.0,
    "s9_records": 2_000,
    "s9_pairs": 1,
    "s10_records": 500,
    "s10_pairs": 1,
    "s11_records": 20_000,
    "s11_pairs": 1,
    "budget": 900.0,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="exercise every scenario but S8 in about 6 minutes (1 round, 3 s windows, small "
        "sizes): a check that the bench runs, not figures",
    )
    p.add_argument(
        "--scenarios",
        default="S1,S2,S3,S4,S5,S6,S9,S10,S11",
        help="comma-separated subset (default S1,S2,S3,S4,S5,S6,S9,S10,S11; S8, the Spark source, "
        "about 4 min more, runs only when named)",
    )
    p.add_argument("--pairs", type=int, default=5, help="S1 interleaved rounds (default 5)")
    p.add_argument(
        "--warmup",
        type=float,
        default=3.0,
        help="S1/S4 seconds of warm-up before a window, once every consumer is flowing (default 3)",
    )
    p.add_argument(
        "--s3-warmup",
        type=float,
        default=10.0,
        help="S3 seconds produced at the rate before its window (default 10: a fresh fleet "
        "catches up for its first ~5 s at 2,500 records/s)",
    )
    p.add_argument(
        "--window", type=float, default=15.0, help="S1/S4 seconds counted per run (default 15)"
    )
    p.add_argument(
        "--s1-topic-records",
        type=int,
        default=10_000_000,
        help="records of 1 KiB on the S1 topic, produced once, read from its start by every "
        "run (default 10000000: 9.5 GiB; enough for 400,000 records/s over flowing, warm-up "
        "and window)",
    )
    p.add_argument(
        "--s1-variants",
        default=S1_VARIANTS,
        help=f"S1 variants of bench.s1_runs in even rounds' order (default {S1_VARIANTS}; "
        "qf_release10 is added when S4 runs)",
    )
    p.add_argument(
        "--s4-pairs", type=int, default=3, help="S4's own rounds when S1 did not run (default 3)"
    )
    p.add_argument(
        "--s3-rates", default="2500,10000", help="S3 produce rates, records/s (default 2500,10000)"
    )
    p.add_argument(
        "--s3-window", type=float, default=15.0, help="S3 seconds measured per rate (default 15)"
    )
    p.add_argument(
        "--s1-timeout",
        type=float,
        default=200.0,
        help="seconds each S9/S10 run may take once started",
    )
    p.add_argument("--s2-consumers", default="1,2,4,8,16,32")
    p.add_argument("--no-s2-faust", dest="s2_faust", action="store_false")
    p.add_argument(
        "--qf-layout",
        choices=("leader", "all"),
        default="leader",
        help="S3 queueflow processes: a leader worker + 4 'member' workers (leader), or "
        "1 'all' + 3 'member' workers (all)",
    )
    p.add_argument(
        "--qf-concurrency",
        type=int,
        default=1,
        help="share agent handler concurrency per process in S3/S9 (default 1)",
    )
    p.add_argument(
        "--profile-seconds",
        type=float,
        default=120.0,
        help="py-spy's upper bound (bench.profiling)",
    )
    p.add_argument(
        "--faust-loglevel",
        choices=("info", "warn"),
        default="info",
        help="-l of every Faust worker (warn turns on Faust's spinner, which sets the "
        "root logger to DEBUG)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=2700.0,
        help="overall seconds: S1 rounds and optional runs (S2 Faust, S3's second rate) are "
        "skipped to stay within it (default 2700; a full run takes about 40 min)",
    )
    p.add_argument(
        "--s6-seconds",
        type=float,
        default=30.0,
        help="S6 idle window in seconds (default 30)",
    )
    p.add_argument("--s8-records", type=int, default=100_000, help="S8 no-op records")
    p.add_argument("--s8-slow-records", type=int, default=4_000, help="S8 5 ms/record records")
    p.add_argument("--s8-tasks", default="1,2,4", help="S8 Spark task counts")
    p.add_argument(
        "--s8-kafka-package",
        default=None,
        help="S8 built-in source's Maven coordinate (default "
        "org.apache.spark:spark-sql-kafka-0-10_2.13:<installed pyspark version>)",
    )
    p.add_argument("--s9-records", type=int, default=20_000, help="S9 records per run")
    p.add_argument("--s9-pairs", type=int, default=3, help="S9 interleaved pairs (default 3)")
    p.add_argument("--s10-records", type=int, default=5_000, help="S10 records per run")
    p.add_argument("--s10-pairs", type=int, default=3, help="S10 repetitions (default 3)")
    p.add_argument("--s10-keys", type=int, default=1_000, help="S10 distinct keys")
    p.add_argument("--s10-work-ms", type=float, default=2.0, help="S10 handler ms per record")
    p.add_argument(
        "--s11-records",
        type=int,
        default=200_000,
        help="S11 records of 1 KiB every perf tool run reads (default 200000)",
    )
    p.add_argument("--s11-pairs", type=int, default=5, help="S11 interleaved pairs (default 5)")
    p.add_argument(
        "--s11-threads", type=int, default=1, help="S11 the tool's --threads (default 1)"
    )
    p.add_argument(
        "--s11-timeout", type=float, default=300.0, help="S11 seconds one tool run may take"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the broker's and workers' data directories too",
    )
    args = p.parse_args(argv)
    if args.quick:  # what the command line did not set explicitly
        given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
        for key, value in QUICK.items():
            flag = "--" + key.replace("_", "-")
            if flag not in given and not (key == "s2_faust" and "--no-s2-faust" in given):
                setattr(args, key, value)
    args.scenarios = [s.strip().upper() for s in args.scenarios.split(",") if s.strip()]
    args.s1_variants = [v.strip() for v in args.s1_variants.split(",") if v.strip()]
    args.s2_consumers = [int(x) for x in str(args.s2_consumers).split(",") if x.strip()]
    args.s3_rates = [float(x) for x in str(args.s3_rates).split(",") if x.strip()]
    args.s8_tasks = [int(x) for x in args.s8_tasks.split(",") if x.strip()]
    if args.pairs < 1:
        p.error("--pairs must be >= 1")
    if args.s11_pairs < 1 or args.s11_records < 1 or args.s11_threads < 1:
        p.error("--s11-pairs, --s11-records and --s11-threads must be >= 1")
    return args


def machine() -> dict[str, Any]:
    from queueflow.devtools.broker import KAFKA_VERSION

    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kafka": KAFKA_VERSION,
    }
    with contextlib.suppress(OSError):
        info["loadavg_before"] = os.getloadavg()
    with contextlib.suppress(ImportError):
        import aiokafka
        import faust

        info["faust"] = faust.__version__
        info["aiokafka"] = aiokafka.__version__
    with contextlib.suppress(Exception):  # read-only git queries: which code was measured

        def git(*argv: str) -> str:
            return subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()

        info["git_commit"] = git("rev-parse", "--short", "HEAD")
        info["queueflow_uncommitted_changes"] = bool(git("status", "--porcelain", "queueflow"))
    with_model = (
        [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
        if Path("/proc/cpuinfo").exists()
        else []
    )
    if with_model:
        info["cpu"] = with_model[0].split(":", 1)[1].strip()
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    measure.FAUST_LOGLEVEL = args.faust_loglevel
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    run_dir = ROOT / ".queueflow" / "bench" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    broker: LocalBroker | None = None
    bootstrap = bootstrap_from_env()
    results: dict[str, Any] = {
        "run_id": run_id,
        "machine": machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    started = time.monotonic()
    print(f"budget: {args.budget:.0f} s ({args.budget / 60:.0f} min); scenarios {args.scenarios}")
    try:
        if bootstrap is None:
            port, cport = find_free_ports(2)
            broker = LocalBroker(
                run_dir / "broker", port=port, controller_port=cport, die_with_parent=True
            )
            broker.start(timeout_s=120, progress=lambda line: print(line, flush=True))
            bootstrap = broker.bootstrap
        results["broker"] = {"bootstrap": bootstrap, "local": broker is not None}
        ctx = Context(bootstrap, run_dir, args)
        ctx.broker_pid = broker.pid() if broker is not None else None
        ctx.results = results
        for index, name in enumerate(args.scenarios):
            if name not in SCENARIOS:
                print(f"unknown scenario {name}; known: {', '.join(SCENARIOS)}")
                continue
            ctx.reserve = sum(MIN_SECONDS.get(later, 0) for later in args.scenarios[index + 1 :])
            t0 = time.monotonic()
            load = os.getloadavg()[0]  # other work on the machine skews every figure
            results[name] = guarded(lambda name=name: SCENARIOS[name](ctx))
            results[name]["scenario_s"] = round(time.monotonic() - t0, 1)
            results[name]["loadavg_1min"] = [round(load, 2), round(os.getloadavg()[0], 2)]
            ctx.say(f"{name} done in {results[name]['scenario_s']} s")
            write(args.out, results)
    finally:
        results["total_s"] = round(time.monotonic() - started, 1)
        with contextlib.suppress(OSError):
            results["machine"]["loadavg_after"] = os.getloadavg()
        if broker is not None:
            broker.stop(timeout_s=30)
            if not args.keep_logs:
                broker.wipe()
        if not args.keep_logs:  # Faust/RocksDB data dirs; logs, stats and profiles stay
            for data in [
                *run_dir.glob("*/data-*"),
                *run_dir.glob("*/leader-data"),
                *run_dir.glob("*-leader-data"),
            ]:
                shutil.rmtree(data, ignore_errors=True)
        results["headline"], results["headline_missing"] = headline(results)
        write(args.out, results)
    print()
    print(table(results))
    print("\nheadline (bench/results/latest.json):")
    print(json.dumps(results["headline"], indent=1))
    for key, why in results["headline_missing"].items():
        print(f"  {key}: null, {why}")
    print(
        f"\nresults: {args.out} (logs: {run_dir}); total {results['total_s']} s "
        f"of a {args.budget:.0f} s budget"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
