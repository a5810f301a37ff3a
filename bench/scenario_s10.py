"""S10 key-ordered sharing: the throughput of ``share.ordering=key`` against unordered sharing,
16 members on one partition (docs/concepts.md "Key-ordered sharing").

A leader-only worker (``bench.qf_app``) leads a 1-partition topic; 16 ``ShareConsumer``
members run in the bench process, each handling its records one at a time with a handler that
awaits ``--s10-work-ms`` (default 2 ms: work worth spreading over members). Three variants on
the same kind of data: ``unordered`` (keys uniform over ``--s10-keys``), ``key-uniform``
(``share.ordering=key``, the same keys) and ``key-zipf`` (``share.ordering=key``, keys drawn
from a Zipf law with s = 1.1 over the same number of keys: a few hot keys). Each figure is
records per second from the first record handled to the last record handled the first time.
The variants run as interleaved repetitions (``--s10-pairs``; the order rotates each time),
each on its own topic and group; the report gives each variant's median rate with its spread
and the median ratio of each key-ordered variant to the unordered one of its repetition.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from typing import Any

from bench.context import Context, guarded
from bench.harness import Fleet
from bench.measure import start_leader
from queueflow import ShareConsumer
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import produce

__all__ = ["scenario_s10"]

VARIANTS = ("unordered", "key-uniform", "key-zipf")
MEMBERS = 16
MEMBER_SETTINGS = {"group.share.heartbeat.interval.ms": 500, "max.poll.records": 10}


def keys_for(variant: str, n: int, keys: int, seed: int) -> list[str]:
    """``n`` keys: uniform over ``keys`` keys, or Zipf (s = 1.1) for ``key-zipf``."""
    rng = random.Random(seed)
    if variant != "key-zipf":
        return [f"k{rng.randrange(keys)}" for _ in range(n)]
    weights = [1 / (rank**1.1) for rank in range(1, keys + 1)]
    return [f"k{i}" for i in rng.choices(range(keys), weights=weights, k=n)]


async def _members(
    bootstrap: str,
    app_id: str,
    topic: str,
    group: str,
    ordered: bool,
    n: int,
    work_s: float,
    timeout_s: float,
) -> tuple[int, float | None, float | None]:
    """Run 16 members until every record was handled or ``timeout_s``; returns (records
    handled, monotonic time of the first, of the last)."""
    plain = ShareConsumer(
        group, app_id=app_id, bootstrap_servers=bootstrap, settings=MEMBER_SETTINGS
    )
    await plain.subscribe([topic])  # the group exists: its configs can be set
    await plain.close()
    if ordered:
        admin = ShareGroupAdmin(app_id, KafkaClientConfig.from_broker(bootstrap))
        await admin.alter_group_configs(group, {"share.ordering": "key"})
    seen: set[int] = set()
    times: list[float] = []
    done = asyncio.Event()

    async def member() -> None:
        c = ShareConsumer(
            group,
            app_id=app_id,
            bootstrap_servers=bootstrap,
            settings=MEMBER_SETTINGS,
            ordering="key" if ordered else "none",
        )
        await c.subscribe([topic])
        try:
            while not done.is_set():
                for r in await c.poll(timeout_ms=200):
                    await asyncio.sleep(work_s)
                    if r.offset not in seen:
                        seen.add(r.offset)
                        times.append(time.monotonic())
                if len(seen) >= n:
                    done.set()
        finally:
            await c.close()

    tasks = [asyncio.create_task(member()) for _ in range(MEMBERS)]
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(done.wait(), timeout_s)
    done.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return len(seen), (min(times) if times else None), (max(times) if times else None)


def _one_run(ctx: Context, variant: str, n: int, rep: int) -> dict[str, Any]:
    name = f"s10-{rep}-{variant}"
    topic = ctx.uid(name)
    create_topic(ctx.bootstrap, topic, 1)
    keys = keys_for(variant, n, ctx.args.s10_keys, seed=rep)
    asyncio.run(produce(ctx.bootstrap, topic, [str(i) for i in range(n)], keys=keys, partition=0))
    app_id = ctx.uid(name)
    run_dir = ctx.run_dir / name
    with Fleet(run_dir) as fleet:
        start_leader(ctx, fleet, app_id, [topic], 1, run_dir)
        handled, first, last = asyncio.run(
            _members(
                ctx.bootstrap,
                app_id,
                topic,
                f"g-{name}",
                variant != "unordered",
                n,
                ctx.args.s10_work_ms / 1000,
                ctx.timeout(ctx.args.s1_timeout),
            )
        )
    hottest = max(keys.count(k) for k in set(keys)) if keys else 0
    out: dict[str, Any] = {"variant": variant, "records": n, "handled": handled}
    out["hottest_key_share"] = round(hottest / max(n, 1), 3)
    if first is not None and last is not None and last > first:
        out["seconds"] = round(last - first, 3)
        out["rate"] = round(handled / (last - first), 1)
    if handled < n:
        out["error"] = f"{handled} of {n} records handled"
    return out


def scenario_s10(ctx: Context) -> dict[str, Any]:
    n, reps = ctx.args.s10_records, ctx.args.s10_pairs
    ctx.say(
        f"S10: key-ordered against unordered, {MEMBERS} members on 1 partition, {reps} "
        f"interleaved repetitions of {n:,} records, {ctx.args.s10_work_ms} ms per record"
    )
    runs: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS[1:]}
    for rep in range(reps):
        order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]
        got = {v: guarded(lambda v=v, r=rep: _one_run(ctx, v, n, r)) for v in order}
        runs.extend(got.values())
        base = got["unordered"].get("rate")
        for v in VARIANTS[1:]:
            rate = got[v].get("rate")
            if base and rate:
                ratios[v].append(rate / base)
        ctx.say("  " + ", ".join(f"{v} {got[v].get('rate')} /s" for v in VARIANTS))
    out: dict[str, Any] = {
        "records": n,
        "pairs": reps,
        "members": MEMBERS,
        "keys": ctx.args.s10_keys,
        "work_ms": ctx.args.s10_work_ms,
        "runs": runs,
    }
    for v in VARIANTS:
        rates = [r["rate"] for r in runs if r.get("variant") == v and r.get("rate")]
        if rates:
            out[v] = {
                "median_rate": round(statistics.median(rates), 1),
                "min_rate": min(rates),
                "max_rate": max(rates),
            }
    for v, values in ratios.items():
        if values:
            out[f"{v}_over_unordered_median"] = round(statistics.median(values), 3)
            out[f"{v}_over_unordered_range"] = [round(min(values), 3), round(max(values), 3)]
    return out
