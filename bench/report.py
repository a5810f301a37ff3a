"""The bench's output: the results table and bench/results/latest.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["fmt_rate", "num", "s1_rows", "s11_rows", "spread", "table", "write"]


def fmt_rate(result: dict[str, Any]) -> str:
    if result.get("rate"):
        text = f"{result['rate']:,.0f} records/s ({result.get('records')} in "
        text += f"{result.get('seconds')} s)"
        if result.get("error"):
            text += f" [{result['error']}]"
        return text
    return f"n/a [{result.get('error', 'no result')}]"


def num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def spread(s: dict[str, Any], digits: int = 3) -> str:
    """``median (min..max, n rounds)`` of a ``bench.steady.summary``."""
    if not s or s.get("median") is None:
        return "n/a"
    return (
        f"{num(s['median'], digits)} ({num(s['min'], digits)}..{num(s['max'], digits)}, n {s['n']})"
    )


def s1_rows(s1: dict[str, Any]) -> list[tuple[str, str, str]]:
    """S1's table rows: each variant's rate and CPU per record, then the comparisons."""
    rows: list[tuple[str, str, str]] = []
    for key, v in (s1.get("variants") or {}).items():
        note = f"client CPU {spread(v.get('client_cpu_us'), 2)} us/record"
        if (v.get("leader_cpu_us") or {}).get("median") is not None:
            note += f"; leader {num(v['leader_cpu_us']['median'], 2)}"
        if (v.get("broker_cpu_us") or {}).get("median") is not None:
            note += f"; broker {num(v['broker_cpu_us']['median'], 2)}"
        if v.get("errors"):
            note += f" [{len(v['errors'])} failed: {v['errors'][0][:80]}]"
        rows.append((f"S1 {key}: {v.get('label')}", f"{spread(v.get('rate'), 0)} rec/s", note))
    for name, r in (s1.get("ratios") or {}).items():
        rows.append((f"S1 {name}", spread(r), f"median of per-round ratios, {r.get('of')}"))
    for item in s1.get("skipped", []):
        rows.append(("S1 skipped", item, ""))
    if s1.get("error"):
        rows.append(("S1", "n/a", str(s1["error"])[:100]))
    return rows


def table(results: dict[str, Any]) -> str:
    rows: list[tuple[str, str, str]] = []

    def err(r: dict[str, Any]) -> str:
        return f" [{r['error']}]" if r.get("error") else ""

    s1 = results.get("S1")
    if s1:
        rows.extend(s1_rows(s1))
    s2 = results.get("S2")
    if s2:
        for kind in ("queueflow", "faust"):
            for n, r in s2.get(kind, {}).items():
                layout = f"{r.get('processes')} proc x {r.get('concurrency')}"
                rows.append(
                    (
                        f"S2 {kind} n={n} ({layout})",
                        f"{num(r.get('rate'))} rec/s",
                        f"efficiency {num(r.get('efficiency'), 2)}, vs 100/s per consumer "
                        f"{num(r.get('efficiency_vs_ideal'), 2)}" + err(r),
                    )
                )
        for item in s2.get("skipped", []):
            rows.append(("S2 skipped", item, ""))
        if s2.get("error"):
            rows.append(("S2", "n/a", s2["error"][:100]))
    s3 = results.get("S3")
    if s3:
        for label, run in s3.get("runs", {}).items():
            for key, what in (
                ("to_handler_ms", "produce -> handler start"),
                ("to_ack_ms", "produce -> ack answered"),
            ):
                p = run.get(key, {})
                rows.append(
                    (
                        f"S3 at {label} records/s: {what}",
                        f"p50 {num(p.get('p50'), 1)} / p99 {num(p.get('p99'), 1)} / "
                        f"p99.9 {num(p.get('p999'), 1)} ms",
                        f"produced at {num(run.get('produce_rate'))} rec/s, "
                        f"{p.get('count')} samples" + err(run),
                    )
                )
    s4 = results.get("S4")
    if s4:
        r = s4.get("ratio") or {}
        rows.append(
            (
                "S4 CPU per delivery, 10% RELEASEd / none",
                f"{num(s4.get('cpu_overhead_pct'), 1)} %",
                f"median of per-round ratios {spread(r)}" + err(s4),
            )
        )
    s5 = results.get("S5")
    if s5:
        leader = s5.get("leader", {})
        for key in ("2000", "10000", "10000_fragmented"):
            step = leader.get(key)
            if step:
                what = f"{step['in_flight_per_partition']:,} in flight/partition"
                if key.endswith("fragmented"):
                    what += ", 1 run each"
                rows.append(
                    (
                        f"S5 leader RSS, {what}",
                        f"{num(step.get('rss_mb'), 1)} MB",
                        f"+{num(step.get('delta_bytes_per_record'))} B/record over idle "
                        f"({num(leader['baseline'].get('rss_mb'), 1)} MB)",
                    )
                )
        if s5.get("error"):
            rows.append(("S5 leader", "n/a", s5["error"][:100]))
        engine = s5.get("engine", {})
        for key, label in (
            ("own_runs", "worst case, every record its own run"),
            ("batches", "fetched in batches of 500"),
        ):
            e = engine.get(key)
            if e:
                rows.append(
                    (
                        f"S5 engine B/record ({label})",
                        num(e["bytes_per_record"], 1),
                        "target <= 200",
                    )
                )
    rows += s6_rows(results.get("S6"))
    rows += s9_rows(results.get("S9"))
    rows += s10_rows(results.get("S10"))
    rows += s11_rows(results.get("S11"))
    rows += s8_rows(results.get("S8"))
    width = max((len(r[0]) for r in rows), default=10)
    width2 = max((len(r[1]) for r in rows), default=10)
    lines = [f"{'scenario':<{width}}  {'figure':<{width2}}  note", "-" * (width + width2 + 40)]
    lines += [f"{a:<{width}}  {b:<{width2}}  {c}" for a, b, c in rows]
    return "\n".join(lines)


def s6_rows(s6: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """S6's table rows: % of a core per process against its target, then the liveness record."""
    if not s6:
        return []
    rows: list[tuple[str, str, str]] = []
    window = s6.get("window") or {}
    fetches = window.get("share_fetches") or {}
    seconds = window.get("seconds")
    for check in s6.get("checks", []):
        name, value = check["process"], check.get("pct_of_core")
        status = {True: "met", False: "MISSED", None: "not measured"}[check.get("met")]
        note = f"target <= {check['target_pct']:g} %: {status}"
        if name in fetches and seconds:
            note += f"; {num(fetches[name] / seconds, 1)} ShareFetches/s"
        elif name == "leader" and seconds and window.get("leader_events") is not None:
            note += f"; {num(window['leader_events'] / seconds, 1)} requests/s handled"
        rows.append(
            (
                f"S6 idle, {num(seconds, 0)} s: {name}",
                f"{num(value, 2)} % of a core",
                note,
            )
        )
    floor = s6.get("faust_floor") or {}
    if floor.get("pct_of_core") is not None:
        rows.append(
            (
                f"S6 floor: a plain Faust worker idle, {num(floor.get('seconds'), 0)} s",
                f"{num(floor['pct_of_core'], 2)} % of a core",
                "one agent on an idle 4-partition topic, no queueflow",
            )
        )
    live = s6.get("liveness")
    if live is not None:
        rows.append(
            (
                "S6 one record after the window",
                "handled" if live.get("handled") else "NOT handled",
                f"produce -> ack answered {num(live.get('produce_to_ack_ms'))} ms"
                if live.get("handled")
                else "within 30 s",
            )
        )
    if s6.get("error"):
        rows.append(
            ("S6 idle fleet", "n/a" if not s6.get("checks") else "error", s6["error"][:100])
        )
    return rows


def s8_rows(s8: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """S8's table rows: one per variant (records/s), then the ratios with their targets."""
    if not s8:
        return []
    rows: list[tuple[str, str, str]] = []
    if s8.get("error"):
        rows.append(("S8 Spark source throughput", "n/a", s8["error"][:100]))
    labels = {"queueflow": "queueflow", "kafka": "built-in Kafka"}
    for side in ("queueflow", "kafka"):
        part = s8.get(side) or {}
        if part.get("session_error"):
            continue
        for r in part.get("variants", {}).values():
            n = r.get("tasks")
            how = f"minPartitions={n}" if side == "queueflow" or n != 1 else "default"
            note = (
                f"{r.get('records')} in {num(r.get('seconds'), 2)} s, {r.get('batches')} batches, "
                f"tasks/batch {r.get('tasks_per_batch')}"
                if r.get("rate")
                else ""
            )
            rows.append(
                (
                    f"S8 {labels[side]} {r.get('work')}, {n} task(s) ({how})",
                    f"{num(r.get('rate'))} rec/s",
                    note + (f" [{r['error']}]" if r.get("error") else ""),
                )
            )
    if s8.get("baseline_unavailable"):
        rows.append(("S8 built-in baseline", "unavailable", s8["baseline_unavailable"][:160]))
    else:
        if s8.get("baseline_note"):
            rows.append(("S8 built-in baseline", "note", s8["baseline_note"]))
        for r in s8.get("ratios", []):
            rows.append((f"S8 {r['label']}", num(r.get("value"), 3), f"target {r['target']}"))
    return rows


def write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    tmp.replace(path)


def s10_rows(s10: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """S10's table rows: each variant's median rate and spread, then the median ratios."""
    if not s10:
        return []
    if s10.get("error"):
        return [("S10 key-ordered", "error", str(s10["error"])[:100])]
    rows = []
    for variant in ("unordered", "key-uniform", "key-zipf"):
        v = s10.get(variant)
        if v:
            spread = f"{num(v['min_rate'])}..{num(v['max_rate'])} over {s10['pairs']} runs"
            rows.append((f"S10 {variant}, 16 members", f"{num(v['median_rate'])} rec/s", spread))
    for variant in ("key-uniform", "key-zipf"):
        ratio = s10.get(f"{variant}_over_unordered_median")
        if ratio is not None:
            lo, hi = s10[f"{variant}_over_unordered_range"]
            rows.append((f"S10 {variant} / unordered", f"{ratio:.2f}", f"runs {lo:.2f}..{hi:.2f}"))
    return rows


def s9_rows(s9: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """S9's table rows: each guarantee's median rate and spread, then the median ratio."""
    if not s9:
        return []
    if s9.get("error"):
        return [("S9 exactly-once", "error", str(s9["error"])[:100])]
    rows = []
    for variant in ("at_least_once", "exactly_once"):
        v = s9.get(variant)
        if v:
            spread = f"{num(v['min_rate'])}..{num(v['max_rate'])} over {s9['pairs']} runs"
            rows.append(
                (f"S9 {variant}, result per record", f"{num(v['median_rate'])} rec/s", spread)
            )
    ratio = s9.get("eos_over_alo_median")
    if ratio is not None:
        lo, hi = s9["eos_over_alo_range"]
        rows.append(
            ("S9 exactly_once / at_least_once", f"{ratio:.2f}", f"pairs {lo:.2f}..{hi:.2f}")
        )
    return rows


def s11_rows(s11: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """S11's table rows: per side the perf tool's records/s, MB/s, elapsed and steady rate
    (median and spread over the runs), then the queueflow/native ratios."""
    if not s11:
        return []
    rows: list[tuple[str, str, str]] = []
    what = f"{s11.get('records', 0):,} x 1 KiB, {s11.get('threads')} thread(s)"
    labels = {"native": "native share group", "queueflow": "queueflow via listener"}
    for side, label in labels.items():
        v = s11.get(side)
        if not v:
            continue
        note = (
            f"{spread(v.get('mb_s'), 1)} MB/s; tool elapsed {spread(v.get('elapsed_s'), 2)} s; "
            f"after 1st report {spread(v.get('steady_rec_s'), 0)} rec/s"
        )
        cpu = [
            f"{name} {num(v[f'{name}_cpu_us']['median'], 1)}"
            for name in ("broker", "leader", "tool")
            if (v.get(f"{name}_cpu_us") or {}).get("median") is not None
        ]
        if cpu:
            note += f"; CPU us/record {', '.join(cpu)}"
        if v.get("errors"):
            note += f" [{len(v['errors'])} failed: {v['errors'][0][:80]}]"
        rows.append(
            (f"S11 perf tool, {label} ({what})", f"{spread(v.get('rec_s'), 0)} rec/s", note)
        )
    for key, of in (("ratio", "tool's rec/s"), ("steady_ratio", "rec/s after 1st report")):
        r = s11.get(key)
        if r:
            rows.append((f"S11 queueflow / native, {of}", spread(r), "median of per-pair ratios"))
    if s11.get("error"):
        rows.append(("S11 perf tool", "error", str(s11["error"])[:100]))
    return rows
