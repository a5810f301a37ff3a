"""The capacity model's figures, measured: ``python -m bench.capacity`` (``make capacity``).

Prints one JSON line (also written to ``bench/results/capacity-latest.json``) with:

``leader_cpu_us_per_record``  leader worker CPU seconds ÷ records acknowledged (ACCEPT), µs,
                              one acknowledgement per batch (a ``batch=True`` no-op handler)
``leader_records_per_core_s`` 1e6 ÷ the above
``member_cpu_us_per_record``  the member processes' CPU ÷ the same records, µs (batch handler)
``broker_cpu_us_per_record``  the broker JVM's CPU ÷ the same records, µs (one broker, RF 1)
``changelog_bytes_per_ack``   key + value bytes written to ``<app>-share-state-<topic>-changelog``
                              ÷ records acknowledged (ACCEPT), batch pattern
``release10``                 the same four figures with a per-record handler that RELEASEs
                              offsets ``% 10 == 0`` on their first delivery (scattered RELEASE)
``coordinator_cpu_us_per_heartbeat``  a leader worker's CPU (its idle CPU subtracted) ÷
                              ShareGroupHeartbeats it answered, µs, heartbeats of ``--groups``
                              groups sent as fast as they are answered; and per core per s
``bytes_per_inflight_record`` the share-partition engine's bytes per in-flight record
                              (bench/bench_engine_memory.py, every record its own run: S5)

CPU is read from ``/proc`` (user + system) at the ends of a steady-state window
(:func:`bench.steady.measure_window`), so it depends much less on other load on the machine than
records/s does. ``--check-cluster`` also runs the batch pattern on a local 3-broker cluster
(RF 3, ``min.insync.replicas=2``) with ``--cluster-workers`` leader workers, predicts its rate
from the figures above and reports predicted vs measured. ``--table [FILE]`` prints the model's
table (bench/capacity_model.py) from a JSON line instead of measuring.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import capacity_model, measure
from bench.context import RECORD_SIZE, RESULTS, Context, guarded
from bench.harness import ROOT, Fleet, cpu_seconds, produce
from bench.measure import balanced, faust_argv, qf_env, stable, start_leader
from bench.scenario_s5 import engine_memory
from bench.steady import measure_window

__all__ = ["main"]

LATEST = RESULTS / "capacity-latest.json"
#: the per-member acquisition cap (20,000 records/s per share-partition) lifted, as in S1
SETTINGS = {"QUEUEFLOW_SHARE_MEMBER_MAX_ACQUISITION_RATE": "0"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n")[0])
    p.add_argument(
        "--table",
        nargs="?",
        const=str(LATEST),
        default=None,
        metavar="FILE",
        help="print the model's table from FILE (a JSON line; default the latest run)",
    )
    p.add_argument("--records", type=int, default=400_000, help="records on the source topic")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--members", type=int, default=2, help="member processes per run")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after every member flows")
    p.add_argument("--window", type=float, default=10.0, help="seconds counted")
    p.add_argument("--groups", type=int, default=200, help="groups heartbeating (coordinator)")
    p.add_argument("--heartbeat-window", type=float, default=10.0)
    p.add_argument(
        "--check-cluster",
        action="store_true",
        help="also run one point on a local 3-broker cluster and compare",
    )
    p.add_argument("--cluster-workers", type=int, default=2)
    p.add_argument(
        "--parts",
        default="batch,release10,heartbeats,memory",
        help="what to measure (comma-separated; default all)",
    )
    p.add_argument("--out", type=Path, default=LATEST)
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------
# acknowledgement runs: a leader worker, member workers, a steady window
# --------------------------------------------------------------------------------------------


def changelog_bytes(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[str, int]:
    """Key + value bytes and record count of ``topic``'s partitions from their start up to
    ``ends`` (partition -> end offset, exclusive), read with a group-less consumer."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"capacity-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    size = count = 0
    try:
        todo = {p: end for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            p, offset = msg.partition(), msg.offset()
            if p is None or offset is None:
                continue
            if msg.error():  # the partition's end (a last control record is never delivered)
                if p in todo and offset >= todo[p]:
                    del todo[p]
                continue
            if p in todo and offset < todo[p]:
                size += len(msg.key() or b"") + len(msg.value() or b"")
                count += 1
            if p in todo and offset >= todo[p] - 1:
                del todo[p]
    finally:
        consumer.close()
    return {"bytes": size, "records": count}


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """High watermarks of ``topic``'s partitions."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "capacity-offsets"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def ack_run(
    ctx: Context, topic: str, pattern: str, leaders: int = 1, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One run of ``pattern`` (``batch``: a no-op batch handler; ``release10``: a per-record
    handler RELEASEing offsets ``% 10 == 0`` once) with ``leaders`` leader workers and
    ``--members`` member workers: the window's figures plus the changelog bytes per ACCEPT."""
    args = ctx.args
    name = ctx.uid(f"cap-{pattern}")
    run_dir = ctx.run_dir / name
    extra = dict(SETTINGS, **(env or {}))
    with Fleet(run_dir) as fleet:
        leader = None
        if leaders == 1:
            leader = start_leader(ctx, fleet, name, [topic], args.partitions, run_dir, **extra)
        others = []
        if leader is None:  # several leader workers: Faust spreads the partitions over them
            for i in range(leaders):
                lenv = qf_env(ctx, name, topic, "bench", "leader", 1, "noop", **extra)
                argv = faust_argv("bench.qf_app", run_dir / f"leader-data-{i}")
                others.append(fleet.add("leader" if i == 0 else f"leader-{i}", argv, lenv))

            def owned(stats: list[dict[str, Any]]) -> bool:
                counts = [int(x.get("owned") or 0) for x in stats]
                settled = all(x.get("recovered") for x in stats) and min(counts) > 0
                return settled and sum(counts) == args.partitions

            if not fleet.wait(stable(owned, 3.0), 150, members=others):
                return {"error": "leader workers did not take every partition within 120 s"}
        members = []
        for i in range(args.members):
            mode = "noop" if pattern == "batch" else "release10"
            menv = qf_env(ctx, name, topic, f"g-{name}", "member", 1, mode, **extra)
            menv["BENCH_BATCH"] = "1" if pattern == "batch" else "0"
            members.append(
                fleet.add(f"member-{i}", faust_argv("bench.qf_app", run_dir / f"d{i}"), menv)
            )
        out = measure_window(
            ctx,
            fleet,
            members,
            stable(balanced(args.partitions, args.members), 1.5),
            start_timeout_s=120,
            warmup_s=args.warmup,
            window_s=args.window,
            available=args.records,
        )
        # changelog bytes over the whole run up to now ÷ the records acknowledged up to now
        from queueflow.protocol import topics

        changelog = topics.state_changelog(name, topic)
        ends = end_offsets(ctx.bootstrap, changelog, args.partitions)
        acked = sum(int(w.stats().get("done") or 0) for w in members)
        timings = [w.stats().get("timings") or {} for w in members]
    written = changelog_bytes(ctx.bootstrap, changelog, ends)
    out["changelog"] = dict(written, acknowledged=acked)
    if acked:
        out["changelog_bytes_per_ack"] = round(written["bytes"] / acked, 1)
        out["changelog_records_per_ack"] = round(written["records"] / acked, 4)
    per_fetch = [float(t["acquired_per_fetch"]) for t in timings if t.get("acquired_per_fetch")]
    if per_fetch:
        out["acquired_per_fetch"] = round(sum(per_fetch) / len(per_fetch), 1)
    cpu = out.get("cpu_us_per_record") or {}
    out["leader_cpu_us"] = round(sum(v for k, v in cpu.items() if k.startswith("leader")), 2)
    if not out.get("error"):
        out.pop("logs", None)
    return out


# --------------------------------------------------------------------------------------------
# coordinator: heartbeats of many groups against one leader worker
# --------------------------------------------------------------------------------------------


async def heartbeat_load(
    ctx: Context, app_id: str, topic: str, pid: int, groups: int, window_s: float
) -> dict[str, Any]:
    """Measure the leader worker's idle CPU for ``window_s`` (one member heartbeating), join
    ``groups`` groups (one member each, sharing one reply channel), then heartbeat every group
    as fast as answers come (32 in flight) for ``window_s``: CPU µs per heartbeat with the idle
    CPU subtracted."""
    from queueflow.kafka.config import KafkaClientConfig
    from queueflow.member.context import MemberContext
    from queueflow.member.membership import Membership
    from queueflow.member.session import ShareFetchSession
    from queueflow.protocol import topics
    from queueflow.settings import ShareGroupSettings

    settings = ShareGroupSettings.load({"queueflow.request.timeout.ms": 30_000})
    member = MemberContext.for_kafka(KafkaClientConfig(ctx.bootstrap), app_id, settings)
    session = ShareFetchSession(member, "capacity-0", [topic], "capacity")
    await session.start()  # its requester carries every membership's heartbeats
    partitions = await member.io.coordinator_partitions()
    ships = [session._membership]
    for g in range(1, groups):
        # the session's member id: the coordinator keys its answers by it, and the reply
        # channel keeps only answers under its own key
        m = Membership(
            session._requester,
            app_id,
            f"capacity-{g}",
            [topic],
            settings,
            "capacity",
            member_id=session.member_id,
        )
        m.coordinator_partition = topics.coordinator_partition(m.group, partitions)
        ships.append(m)
    try:
        # idle first: only the first membership's own heartbeats
        await asyncio.sleep(2)
        idle0, t0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(window_s)
        idle1, t1 = cpu_seconds(pid), time.monotonic()
        idle_rate = (idle1 - idle0) / (t1 - t0)  # type: ignore[operator]
        for i in range(1, len(ships), 32):
            await asyncio.gather(*(m._heartbeat(join=True) for m in ships[i : i + 32]))
        count = 0
        stop = time.monotonic() + window_s

        async def loop(mine: list[Membership]) -> None:
            nonlocal count
            while time.monotonic() < stop:
                for m in mine:
                    await m._heartbeat()
                    count += 1

        c0, t0 = cpu_seconds(pid), time.monotonic()
        await asyncio.gather(*(loop(ships[1:][i::32]) for i in range(32)))
        c1, t1 = cpu_seconds(pid), time.monotonic()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(m._heartbeat(leave=True) for m in ships[1:])), 15
            )
        await session.close()
    busy = (c1 - c0) - idle_rate * (t1 - t0)  # type: ignore[operator]
    return {
        "groups": groups,
        "coordinator_partitions": partitions,
        "heartbeats": count,
        "seconds": round(t1 - t0, 2),
        "heartbeats_per_s": round(count / (t1 - t0), 1),
        "leader_cpu_s": round(c1 - c0, 3),  # type: ignore[operator]
        "idle_cpu_pct": round(100 * idle_rate, 2),
        "cpu_us_per_heartbeat": round(1e6 * busy / max(count, 1), 1),
    }


def coordinator_run(ctx: Context, topic: str) -> dict[str, Any]:
    """A leader-only worker of a fresh app and :func:`heartbeat_load` against it."""
    name = ctx.uid("cap-hb")
    run_dir = ctx.run_dir / name
    with Fleet(run_dir) as fleet:
        leader = start_leader(ctx, fleet, name, [topic], ctx.args.partitions, run_dir)
        fleet.quiet(True)  # the stats writes would be most of an idle worker's CPU
        return asyncio.run(
            asyncio.wait_for(
                heartbeat_load(
                    ctx, name, topic, leader.pid, ctx.args.groups, ctx.args.heartbeat_window
                ),
                300,
            )
        )


# --------------------------------------------------------------------------------------------
# the figures, the cluster check, main
# --------------------------------------------------------------------------------------------


def figures(ctx: Context) -> dict[str, Any]:
    """Every figure of the model (see the module docstring), the runs' details under ``runs``."""
    from queueflow.devtools.broker import create_topic

    args = ctx.args
    topic = ctx.uid("cap")
    create_topic(ctx.bootstrap, topic, args.partitions)
    records = args.records if {"batch", "release10"} & set(args.parts.split(",")) else 1000
    ctx.say(f"producing {records:,} records of {RECORD_SIZE} B to {topic}")
    produce(ctx.bootstrap, topic, records, RECORD_SIZE, args.partitions, timeout_s=900)
    runs: dict[str, Any] = {"batch": {}, "release10": {}, "heartbeats": {}, "engine_memory": {}}
    parts = args.parts.split(",")
    for pattern in [p for p in ("batch", "release10") if p in parts]:
        ctx.say(f"acknowledgement pattern {pattern} ...")
        runs[pattern] = guarded(lambda pattern=pattern: ack_run(ctx, topic, pattern))
        ctx.say(f"  {_brief(runs[pattern])}")
    if "heartbeats" in parts:
        ctx.say(f"coordinator: heartbeats of {args.groups} groups ...")
        runs["heartbeats"] = guarded(lambda: coordinator_run(ctx, topic))
        ctx.say(f"  {runs['heartbeats']}")
    if "memory" in parts:
        runs["engine_memory"] = engine_memory()
    b, r, hb = runs["batch"], runs["release10"], runs["heartbeats"]
    out: dict[str, Any] = {
        "leader_cpu_us_per_record": b.get("leader_cpu_us"),
        "leader_records_per_core_s": _per_core(b.get("leader_cpu_us")),
        "member_cpu_us_per_record": b.get("client_cpu_us"),
        "broker_cpu_us_per_record": b.get("broker_cpu_us"),
        "changelog_bytes_per_ack": b.get("changelog_bytes_per_ack"),
        "records_per_ack_request": b.get("acquired_per_fetch"),
        "measured_rate": b.get("rate"),
        "release10": {
            "leader_cpu_us_per_record": r.get("leader_cpu_us"),
            "member_cpu_us_per_record": r.get("client_cpu_us"),
            "broker_cpu_us_per_record": r.get("broker_cpu_us"),
            "changelog_bytes_per_ack": r.get("changelog_bytes_per_ack"),
            "measured_rate": r.get("rate"),
        },
        "coordinator_cpu_us_per_heartbeat": hb.get("cpu_us_per_heartbeat"),
        "heartbeats_per_core_s": _per_core(hb.get("cpu_us_per_heartbeat")),
        "bytes_per_inflight_record": (runs["engine_memory"].get("own_runs") or {}).get(
            "bytes_per_record"
        ),
    }
    out["runs"] = runs
    return out


def _per_core(us: Any) -> float | None:
    return round(1e6 / us) if isinstance(us, int | float) and us > 0 else None


def _brief(run: dict[str, Any]) -> str:
    keys = ("rate", "leader_cpu_us", "client_cpu_us", "broker_cpu_us", "changelog_bytes_per_ack")
    return ", ".join(f"{k}={run.get(k)}" for k in keys) + (
        f" [{run['error']}]" if run.get("error") else ""
    )


def predict_rate(measured: dict[str, Any], workers: int, cores: float) -> dict[str, Any]:
    """Records/s ``workers`` leader workers sustain on a machine of ``cores`` cores shared by
    every process: the leaders' bound ``workers * 1e6 / L`` and the machine's bound
    ``cores * 1e6 / (L + M + K)`` (leader, member and broker µs per record), the lower."""
    leader = float(measured["leader_cpu_us_per_record"])
    total = (
        leader
        + float(measured["member_cpu_us_per_record"])
        + float(measured["broker_cpu_us_per_record"])
    )
    leader_bound = workers * 1e6 / leader
    machine_bound = cores * 1e6 / total
    return {
        "leader_bound": round(leader_bound),
        "machine_bound": round(machine_bound),
        "predicted_rate": round(min(leader_bound, machine_bound)),
        "bound_by": "leader" if leader_bound < machine_bound else "machine",
        "formula": f"min({workers}*1e6/{leader:g}, {cores:g}*1e6/{total:.1f})",
    }


def predict_at_share(measured: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The rate the model predicts for the CPU the fleet actually got in ``run``'s window (on a
    loaded machine, less than every core): ``fleet cores * 1e6 / (L + M)``."""
    cpu = {k: v for k, v in (run.get("cpu_s") or {}).items() if k != "broker"}
    seconds = run.get("seconds")
    if not cpu or not seconds:
        return {}
    cores = sum(cpu.values()) / seconds
    per_record = float(measured["leader_cpu_us_per_record"]) + float(
        measured["member_cpu_us_per_record"]
    )
    predicted = cores * 1e6 / per_record
    out: dict[str, Any] = {
        "fleet_cores": round(cores, 3),
        "predicted_at_fleet_cpu": round(predicted),
        "formula_at_fleet_cpu": f"{cores:.3f}*1e6/{per_record:.2f}",
    }
    if run.get("rate"):
        out["measured_over_predicted_at_fleet_cpu"] = round(run["rate"] / predicted, 3)
    return out


def check_cluster(
    args: argparse.Namespace, run_dir: Path, measured: dict[str, Any]
) -> dict[str, Any]:
    """The batch pattern on a local cluster of 3 brokers (RF 3, min.insync.replicas 2) with
    ``--cluster-workers`` leader workers: predicted vs measured records/s and CPU per record."""
    from queueflow.devtools.broker import create_topic, find_free_ports
    from queueflow.devtools.broker.cluster import LocalCluster

    *ports, cport = find_free_ports(4)
    cluster = LocalCluster(
        run_dir / "cluster", 3, broker_ports=ports, controller_port=cport, die_with_parent=True
    )
    cores = float(os.cpu_count() or 1)
    out: dict[str, Any] = {"brokers": 3, "workers": args.cluster_workers, "cores": cores}
    out.update(predict_rate(measured, args.cluster_workers, cores))
    try:
        cluster.start(timeout_s=180, progress=lambda line: print(line, flush=True))
        ctx = Context(cluster.bootstrap, run_dir, args)
        topic = ctx.uid("cap-cluster")
        create_topic(ctx.bootstrap, topic, args.partitions, replication_factor=3)
        ctx.say(f"cluster: producing {args.records:,} records to {topic} (RF 3)")
        produce(ctx.bootstrap, topic, args.records, RECORD_SIZE, args.partitions, timeout_s=900)
        run = ack_run(ctx, topic, "batch", args.cluster_workers, {"TOPIC_REPLICATION_FACTOR": "3"})
        out["run"] = {k: v for k, v in run.items() if k != "logs"}
        out["measured_rate"] = run.get("rate")
        out["leader_cpu_us_per_record"] = run.get("leader_cpu_us")
        out["member_cpu_us_per_record"] = run.get("client_cpu_us")
        out["changelog_bytes_per_ack"] = run.get("changelog_bytes_per_ack")
        if run.get("rate"):
            out["measured_over_predicted"] = round(run["rate"] / out["predicted_rate"], 3)
        out.update(predict_at_share(measured, run))
    finally:
        cluster.stop(timeout_s=30)
        cluster.wipe()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table is not None:
        measured = json.loads(Path(args.table).read_text().strip().splitlines()[-1])
        print(capacity_model.figures_markdown(measured))
        print()
        print(capacity_model.markdown(capacity_model.table(measured)))
        return 0
    from queueflow.devtools.broker import LocalBroker, find_free_ports

    measure.FAUST_LOGLEVEL = "info"
    run_dir = ROOT / ".queueflow" / "capacity" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    port, cport = find_free_ports(2)
    broker = LocalBroker(run_dir / "broker", port=port, controller_port=cport, die_with_parent=True)
    load = os.getloadavg()[0]
    try:
        broker.start(timeout_s=120, progress=lambda line: print(line, flush=True))
        ctx = Context(broker.bootstrap, run_dir, args)
        ctx.broker_pid = broker.pid()
        out = figures(ctx)
    finally:
        broker.stop(timeout_s=30)
        broker.wipe()
    if args.check_cluster:
        out["cluster_check"] = guarded(lambda: check_cluster(args, run_dir, out))
    out["loadavg_1min"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    out["cores"] = os.cpu_count()
    out["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = json.dumps(out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
