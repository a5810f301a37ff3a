"""Steady-state measurement and the arithmetic of interleaved pairs (the pure parts are
unit-tested in tests/unit/test_bench_steady.py).

A run's figure is a *window*: the records every consumer process finished between two readings
of its stats file (``bench.harness.Stats``: ``done`` and the ``written`` time of the reading),
taken ``warmup_s`` after every process is flowing and ``window_s`` apart; not first-to-last
record. Comparisons run as *rounds*: every variant once per round, the order reversed every
other round, so of any two variants each runs first in half the rounds
(:func:`round_orders`); a comparison's figure is the median of its per-round ratios
(:func:`pair_ratios`, :func:`summary`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench import harness

__all__ = [
    "HEADLINE_KEYS",
    "cpu_per_record",
    "headline",
    "measure_window",
    "pair_ratios",
    "round_orders",
    "summary",
    "window_count",
]

#: The ``headline`` object of bench/results/latest.json: exactly these keys, in this order.
HEADLINE_KEYS = (
    "s1_batch_vs_native",
    "s1_record_vs_native",
    "s1_batch_vs_raw",
    "client_cpu_us_batch",
    "client_cpu_us_record",
    "s3_p99_ms_2500",
    "s3_p99_ms_10000",
    "s4_cpu_overhead_pct",
    "s5_bytes_per_record",
    "s2_efficiency_16",
    "s6_leader_pct",
    "s6_member_pct",
    "s6_broker_pct",
    # Kafka's perf tool (S11): its records/s on native and through queueflow's listener, and
    # the median of per-pair queueflow/native ratios
    "perf_tool_native_rec_s",
    "perf_tool_queueflow_rec_s",
    "perf_tool_ratio",
)


def round_orders(variants: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of ``variants`` in each of ``rounds`` rounds: as given in even rounds, reversed
    in odd ones, so for any two variants each runs first in half the rounds (``rounds`` even) or
    one more (odd).

    Raises:
        ValueError: ``rounds`` < 1, no variants, or a variant named twice.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if not variants or len(set(variants)) != len(variants):
        raise ValueError(f"variants must be distinct and not empty, got {list(variants)}")
    forward = list(variants)
    return [forward if i % 2 == 0 else forward[::-1] for i in range(rounds)]


def summary(values: Sequence[float | None], digits: int = 3) -> dict[str, Any]:
    """``median``, ``min``, ``max`` and ``n`` of the values that are not None (all None when
    there are none); ``values`` as given (None kept, so rounds stay aligned)."""
    got = [float(v) for v in values if v is not None]
    if not got:
        return {"median": None, "min": None, "max": None, "n": 0, "values": list(values)}
    return {
        "median": round(statistics.median(got), digits),
        "min": round(min(got), digits),
        "max": round(max(got), digits),
        "n": len(got),
        "values": [None if v is None else round(float(v), digits) for v in values],
    }


def pair_ratios(
    rounds: Sequence[Mapping[str, float | None]], numerator: str, denominator: str
) -> list[float | None]:
    """Per round, ``round[numerator] / round[denominator]`` (None when either is missing or the
    denominator is 0)."""
    out: list[float | None] = []
    for r in rounds:
        a, b = r.get(numerator), r.get(denominator)
        out.append(a / b if a is not None and b else None)
    return out


def window_count(
    start: Sequence[Mapping[str, Any]], end: Sequence[Mapping[str, Any]], key: str = "done"
) -> dict[str, Any]:
    """Records finished between two readings of the same processes' stats (in order).

    Each process is measured over its own readings' ``written`` times, so a stats file written
    up to 250 ms before the driver read it does not skew the rate.

    Returns:
        ``records`` (sum), ``seconds`` (mean of the processes' spans), ``rate`` (sum of the
        processes' rates, records/s; None when a span is missing or not positive),
        ``per_process`` (records of each).
    """
    if len(start) != len(end):
        raise ValueError(f"{len(start)} start readings but {len(end)} end readings")
    records, spans, rate = [], [], 0.0
    valid = bool(start)
    for a, b in zip(start, end, strict=True):
        n = int(b.get(key) or 0) - int(a.get(key) or 0)
        records.append(n)
        t0, t1 = a.get("written"), b.get("written")
        if t0 is None or t1 is None or t1 <= t0:
            valid = False
            continue
        spans.append(t1 - t0)
        rate += n / (t1 - t0)
    return {
        "records": sum(records),
        "seconds": round(statistics.mean(spans), 3) if spans else None,
        "rate": round(rate, 1) if valid else None,
        "per_process": records,
    }


def cpu_per_record(cpu_s: Mapping[str, float], records: int) -> dict[str, float]:
    """Microseconds of CPU per record of each process (``cpu_s``: CPU seconds in the window)."""
    return {name: round(1e6 * cpu / max(records, 1), 2) for name, cpu in cpu_s.items()}


def _get(tree: Mapping[str, Any], *path: str) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


#: S1 headline key -> the S1 variants it is made of
_S1_PARTS = {
    "s1_batch_vs_native": ("qf_batch", "native_batch"),
    "s1_record_vs_native": ("qf_record", "native_record"),
    "s1_batch_vs_raw": ("qf_batch", "raw"),
    "client_cpu_us_batch": ("qf_batch",),
    "client_cpu_us_record": ("qf_record",),
}


def _variant_errors(results: Mapping[str, Any], key: str) -> str | None:
    """The errors of the S1 variants a headline key is made of (None if they ran or no S1)."""
    variants = _get(results, "S1", "variants") or {}
    parts = []
    for name in _S1_PARTS.get(key, ()):
        if name not in variants:
            parts.append(f"{name} not run")
        elif variants[name].get("errors"):
            parts.append(f"{name}: {variants[name]['errors'][0]}"[:200])
    return "; ".join(parts) or None


def _perf_tool_errors(results: Mapping[str, Any], key: str) -> str | None:
    """The first failure of the S11 side(s) a headline key is made of (None if none)."""
    if not key.startswith("perf_tool_"):
        return None
    sides = [s for s in ("native", "queueflow") if s in key] or ["native", "queueflow"]
    for side in sides:
        errors = _get(results, "S11", side, "errors") or []
        if errors:
            return f"{side}: {errors[0]}"[:200]
    return None


def headline(results: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``headline`` object (exactly :data:`HEADLINE_KEYS`) from a run's results, and for
    every key that is None, why.

    Sources: ``S1.ratios.<key>.median`` and ``S1.cpu.<key>.median``; ``S3.runs.<rate>.
    to_handler_ms.p99``; ``S4.cpu_overhead_pct``; ``S5.engine.own_runs.bytes_per_record`` (the
    worst case: every in-flight record a run of its own); ``S2.queueflow.16.efficiency``;
    ``S6.cpu_pct`` (leader, broker, the busiest member); ``S11.<side>.rec_s.median`` and
    ``S11.ratio.median`` (bench.scenario_s11).
    """
    members = _get(results, "S6", "cpu_pct", "members") or {}
    sources: dict[str, tuple[str, Any]] = {
        "s1_batch_vs_native": ("S1", _get(results, "S1", "ratios", "batch_vs_native", "median")),
        "s1_record_vs_native": ("S1", _get(results, "S1", "ratios", "record_vs_native", "median")),
        "s1_batch_vs_raw": ("S1", _get(results, "S1", "ratios", "batch_vs_raw", "median")),
        "client_cpu_us_batch": ("S1", _get(results, "S1", "cpu", "qf_batch", "median")),
        "client_cpu_us_record": ("S1", _get(results, "S1", "cpu", "qf_record", "median")),
        "s3_p99_ms_2500": ("S3", _get(results, "S3", "runs", "2500", "to_handler_ms", "p99")),
        "s3_p99_ms_10000": ("S3", _get(results, "S3", "runs", "10000", "to_handler_ms", "p99")),
        "s4_cpu_overhead_pct": ("S4", _get(results, "S4", "cpu_overhead_pct")),
        "s5_bytes_per_record": (
            "S5",
            _get(results, "S5", "engine", "own_runs", "bytes_per_record"),
        ),
        "s2_efficiency_16": ("S2", _get(results, "S2", "queueflow", "16", "efficiency")),
        "s6_leader_pct": ("S6", _get(results, "S6", "cpu_pct", "leader")),
        "s6_member_pct": ("S6", max(members.values()) if members else None),
        "s6_broker_pct": ("S6", _get(results, "S6", "cpu_pct", "broker")),
        "perf_tool_native_rec_s": ("S11", _get(results, "S11", "native", "rec_s", "median")),
        "perf_tool_queueflow_rec_s": (
            "S11",
            _get(results, "S11", "queueflow", "rec_s", "median"),
        ),
        "perf_tool_ratio": ("S11", _get(results, "S11", "ratio", "median")),
    }
    out: dict[str, Any] = {}
    why: dict[str, str] = {}
    for key in HEADLINE_KEYS:
        scenario, value = sources[key]
        out[key] = value
        if value is None:
            if scenario not in results:
                why[key] = f"{scenario} not run"
            else:
                error = (
                    _get(results, scenario, "error")
                    or _variant_errors(results, key)
                    or _perf_tool_errors(results, key)
                )
                why[key] = f"{scenario}: {error}" if error else f"{scenario}: no figure"
    return out, why


# --------------------------------------------------------------------------------------------
# driver side: one window over a running fleet
# --------------------------------------------------------------------------------------------


def _fresh(workers: Sequence[harness.Worker], after: float, timeout_s: float) -> list[Any]:
    """Every worker's stats, each written after ``after`` (wall clock), waiting up to
    ``timeout_s``; stale ones as they are."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = [w.stats() for w in workers]
        if all((s.get("written") or 0) > after for s in stats) or time.monotonic() > deadline:
            return stats


def _flowing(
    fleet: harness.Fleet, members: Sequence[harness.Worker], key: str, timeout_s: float
) -> bool:
    """Every member has finished records (``key`` > 0) and finished more 1.5 s later."""
    deadline = time.monotonic() + timeout_s
    previous: list[int] | None = None
    while time.monotonic() < deadline:
        now = [int(w.stats().get(key) or 0) for w in members]
        if previous is not None and all(b > a for a, b in zip(previous, now, strict=True)):
            return True
        previous = now if all(n > 0 for n in now) else None
        if fleet.dead():
            return False
        time.sleep(1.5)
    return False


def measure_window(
    ctx: Any,
    fleet: harness.Fleet,
    members: Sequence[harness.Worker],
    ready: Callable[[list[dict[str, Any]]], bool],
    *,
    start_timeout_s: float,
    warmup_s: float,
    window_s: float,
    available: int | None = None,
    key: str = "done",
    flow_timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Gate, go, wait until every member is flowing, warm up, then count one window.

    1. ``ready(stats)`` (the variant's own gate, e.g. a balanced assignment held 1.5 s);
    2. the go-file;
    3. *flowing*: every member has finished records (``key`` > 0) and finished more 1.5 s later
       (so every consumer has an assignment it is being served on);
    4. ``warmup_s`` seconds, then the window of ``window_s`` seconds.

    CPU (``/proc``, user + system) of every process of the fleet and of the broker JVM (when
    this run started it) is read at the window's ends. ``available``: records on the topic; a
    window that ends with members having finished ≥ 98 % of them is reported as ``drained``
    (the topic was too small for this variant).

    Returns:
        ``rate`` (records/s), ``records``, ``seconds``, ``cpu_s`` and ``cpu_us_per_record`` per
        process, ``client_cpu_us`` (members), ``leader_cpu_us``, ``broker_cpu_us``; on trouble
        ``error`` and the logs' tails.
    """
    t0 = time.monotonic()
    if not fleet.wait(ready, start_timeout_s, members=members):
        return {
            "error": f"consumers not ready within {start_timeout_s:.0f} s",
            "logs": {w.name: w.log_tail(12) for w in fleet.workers},
        }
    out: dict[str, Any] = {"startup_s": round(time.monotonic() - t0, 1)}
    go_at = fleet.go()
    if not _flowing(fleet, members, key, flow_timeout_s):
        out["error"] = f"not every consumer finished records within {flow_timeout_s:.0f} s of go"
        out["per_process"] = [int(w.stats().get(key) or 0) for w in members]
        out["logs"] = {w.name: w.log_tail(12) for w in fleet.workers}
        return out
    out["go_to_flowing_s"] = round(time.time() - go_at, 1)
    time.sleep(warmup_s)
    pids = {w.name: w.pid for w in fleet.workers}
    if ctx.broker_pid:
        pids["broker"] = ctx.broker_pid
    cpu0 = {name: harness.cpu_seconds(pid) for name, pid in pids.items()}
    start = _fresh(members, time.time(), 1.0)
    time.sleep(window_s)
    cpu1 = {name: harness.cpu_seconds(pid) for name, pid in pids.items()}
    end = _fresh(members, time.time(), 1.0)
    dead = [w.name for w in fleet.dead()]
    counted = window_count(start, end, key)
    out.update(counted)
    out["delivered"] = window_count(start, end, "delivered")["records"]
    cpu_s = {
        name: round(cpu1[name] - a, 3)  # type: ignore[operator]
        for name, a in cpu0.items()
        if a is not None and cpu1.get(name) is not None
    }
    out["cpu_s"] = cpu_s
    records = counted["records"]
    per = cpu_per_record(cpu_s, records)
    out["cpu_us_per_record"] = per
    member_names = {w.name for w in members}
    out["client_cpu_us"] = round(sum(v for k, v in per.items() if k in member_names), 2)
    if "leader" in per:
        out["leader_cpu_us"] = per["leader"]
    if "broker" in per:
        out["broker_cpu_us"] = per["broker"]
    finished = sum(int(s.get(key) or 0) for s in end)
    out["finished_total"] = finished
    if available and finished >= 0.98 * available:
        out["error"] = (
            f"drained: {finished:,} of {available:,} records finished by the window's end; "
            "raise --s1-topic-records"
        )
    if dead:
        out["error"] = f"worker(s) died: {', '.join(dead)}"
        out["logs"] = {w.name: w.log_tail(12) for w in fleet.workers if w.name in dead}
    elif not records:
        out["error"] = out.get("error") or "no records finished in the window"
    hook_errors = {
        w.name: s["hook_errors"] for w, s in zip(members, end, strict=True) if s.get("hook_errors")
    }
    if hook_errors:
        out["hook_errors"] = hook_errors
        out["error"] = out.get("error") or f"bench hooks failed: {hook_errors}"[:300]
    return out
