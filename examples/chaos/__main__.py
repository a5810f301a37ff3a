"""``make chaos``: nothing lost under SIGKILLs and a broker restart.

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
   stderr). Exit status 1 if any record was lost or a delivery count repeated (one record
   handled twice at the same delivery count: ``repeated_delivery_counts``).
7. the group has a dead-letter topic ``<topic>-dlq`` (KIP-1191 group configs): every archived
   record must be in it (:mod:`examples.chaos.dead_letters`: ``archived``, ``in_dlq``,
   ``dlq_missing``; exit status 1 if any is missing).

``--brokers 3`` (``make chaos-cluster``): a local cluster of 3 brokers and a KRaft controller
(:class:`~queueflow.devtools.broker.cluster.LocalCluster`), every topic with replication factor 3
and ``min.insync.replicas=2``; instead of the broker restart, :mod:`examples.chaos.cluster`
SIGKILLs one broker for good at 10 % of the records and roll-restarts the other two from 20 %,
while the workers are SIGKILLed as above. The JSON line's ``cluster`` says when (``broker_events``)
and whether it all happened under load; exit status 1 also if it did not complete or a
duplicate is unexplained (``duplicates_unexplained``).

``--exactly-once`` (``make chaos-exactly-once``): the share agent runs with
``processing_guarantee="exactly_once"`` and publishes one result per ACCEPTed record to
``<topic>-results``; the run then reads that topic ``read_committed`` and counts duplicate,
missing and unexpected results (:mod:`examples.chaos.results`). Exit status 1 also if any of
them is not 0.

Terminal outcomes: ACCEPT, REJECT, or a delivery with ``delivery_count`` = limit that ended in
RELEASE/raise (the leader Archives the record). For ids the ledger leaves open, the driver replays
the share-partition state from the leaders' state changelog (:func:`settle`): a poison record
Archived at the limit after a last delivery no handler saw (its worker was killed first) is
counted as a poison deviation, not lost; so is a healthy record Archived at the limit after
deliveries no handler saw, when a kill or restart explains them and the group has a DLQ
(``archived_after_crashes``: KIP-932 counts a delivery when the record is acquired, whether or
not its member lives to handle it; the record is in the DLQ, which ``dlq_missing`` checks).
Every other id without a terminal outcome is ``lost``:
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

Modules: :mod:`.config` (:class:`ChaosConfig`), :mod:`.workers` (worker processes),
:mod:`.run` (orchestration: workers, kills, broker restart), :mod:`.ledger` (the handlers'
ledgers), :mod:`.leader_state` (the leaders' state replayed from their topics),
:mod:`.analysis` (the check), :mod:`.report` (what is printed); :mod:`.app` is the workers'
Faust app.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.chaos.cluster import ClusterNemesis
from examples.chaos.config import ROOT, ChaosConfig
from examples.chaos.report import print_summary, say
from examples.chaos.run import run
from queueflow import logging as qf_logging
from queueflow.devtools.broker import LocalBroker, bootstrap_from_env, find_free_ports
from queueflow.devtools.broker.cluster import LocalCluster

__all__ = ["ChaosConfig", "main", "parse_args", "run"]


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
    ap.add_argument(
        "--brokers",
        type=int,
        default=d.brokers,
        help="brokers of the local cluster (3: make chaos-cluster: one broker SIGKILLed for "
        "good, the others restarted one at a time, replication factor 3, min.insync.replicas 2)",
    )
    ap.add_argument("--broker-down", type=float, default=d.broker_down_s)
    ap.add_argument("--timeout", type=float, default=d.timeout_s)
    ap.add_argument("--seed", type=int, default=None, help="default: random")
    ap.add_argument("--work-ms", type=float, default=d.work_ms)
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--keep-broker-data", action="store_true")
    ap.add_argument(
        "--exactly-once",
        action="store_true",
        help="publish a result per ACCEPT with processing_guarantee='exactly_once' and count "
        "the results downstream (read_committed)",
    )
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
        brokers=args.brokers,
        timeout_s=args.timeout,
        seed=args.seed if args.seed is not None else random.randrange(1 << 30),
        concurrency=args.concurrency,
        work_ms=args.work_ms,
        log_level=args.log_level,
        exactly_once=args.exactly_once,
    )
    return config, args


def main(argv: Sequence[str] | None = None) -> int:
    qf_logging.configure()  # a queueflow command: its own events on stderr (json/console)
    config, args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the workers and the broker are always stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_dir = args.run_dir or ROOT / ".queueflow" / "chaos" / time.strftime("%Y%m%d-%H%M%S")
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    broker: LocalBroker | None = None
    cluster: LocalCluster | None = None
    nemesis: ClusterNemesis | None = None
    bootstrap = bootstrap_from_env()
    say(f"chaos run: seed {config.seed}, run dir {run_dir}")
    try:
        if bootstrap is None and config.brokers > 1:
            *ports, cport = find_free_ports(config.brokers + 1)
            cluster = LocalCluster(
                run_dir / "cluster",
                config.brokers,
                broker_ports=ports,
                controller_port=cport,
                die_with_parent=True,
            )
            cluster.start(timeout_s=180, progress=say)
            bootstrap = cluster.bootstrap
            nemesis = ClusterNemesis(cluster, config, say)
            config.broker_restart = False  # the nemesis does the brokers' part
        elif bootstrap is None:
            port, cport = find_free_ports(2)
            broker = LocalBroker(
                run_dir / "broker", port=port, controller_port=cport, die_with_parent=True
            )
            broker.start(timeout_s=120, progress=say)
            bootstrap = broker.bootstrap
        elif config.broker_restart:
            say("$QUEUEFLOW_BROKER is set: an external cluster, no broker restart")
        summary = run(config, run_dir, bootstrap, broker, nemesis=nemesis)
    finally:
        if broker is not None:
            broker.stop()
        if cluster is not None:
            cluster.stop()
        if nemesis is not None:
            nemesis.release()
    summary["seed"] = config.seed
    # A failed run keeps its topics (state changelogs, DLQ) for a post-mortem replay.
    drop_data = not failed(summary) and not args.keep_broker_data
    if broker is not None and drop_data:
        shutil.rmtree(broker.log_dirs, ignore_errors=True)  # topic data; broker.log stays
    if cluster is not None and drop_data:
        for node in cluster.nodes:
            shutil.rmtree(node.log_dirs, ignore_errors=True)
    print_summary(summary)
    if "archived" in summary:
        say(
            f"dead letters: archived {summary['archived']}, in DLQ {summary['in_dlq']}, "
            f"missing {summary['dlq_missing']}"
        )
    return 1 if failed(summary) else 0


def failed(summary: dict[str, Any]) -> bool:
    """A record was lost, a delivery count was handed to handlers twice for one record
    (delivery counts are exact across crashes: docs/concepts.md), an archived record is not in
    the DLQ, or (``--exactly-once``) a result is duplicated, missing or unexpected; on a cluster
    (``--brokers 3``) also if its brokers' scenario did not complete or a duplicate is
    unexplained."""
    eos = ("results_duplicates", "results_missing", "results_unexpected")
    checks = ("lost", "repeated_delivery_counts", "dlq_missing", *eos)
    cluster = summary.get("cluster")
    if cluster is not None and (
        not cluster["scenario_completed"] or summary.get("duplicates_unexplained", 0)
    ):
        return True  # make chaos-cluster: the brokers' part ran, nothing unexplained
    return any(summary.get(k, 0) for k in checks)


if __name__ == "__main__":
    sys.exit(main())
