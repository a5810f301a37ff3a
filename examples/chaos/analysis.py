"""The check of a chaos run: the ledgers against what was produced (see :mod:`examples.chaos`).

Lost records, duplicates (explained by a kill, a leader restart or a broker restart nearby, or
not), poison records and the queueflow log events that explain redeliveries.
"""

from __future__ import annotations

import bisect
import re
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.chaos.config import FAILED, ChaosConfig
from examples.chaos.leader_state import ARCHIVED_AT_LIMIT
from examples.chaos.ledger import Ledger, terminal_line
from examples.chaos.timeline import Event
from queueflow.testing import event_time, parse_events

__all__ = ["BROKER_EVENTS", "LOG_EVENTS", "analyse", "broker_outages", "worker_log_events"]

#: queueflow log events that explain redeliveries (counted in the summary's ``log_events``).
LOG_EVENTS = frozenset(
    {
        "assignment",
        "member_session_expired",
        "share_partition_restored",
        "share_fetch_failed",
        "acknowledgement_refused",
        "member_records_released",
        "stale_acknowledgements_dropped",
        "acquisition_lock_expired_before_handling",
        "leader_stepped_down",
    }
)
#: The marker :class:`examples.chaos.workers.Worker` writes after each launch.
_PID_MARKER = re.compile(r"^===== chaos: slot \d+ pid (\d+) =====")


#: Driver events about brokers: a stop and start (a restart), a SIGKILL for good and the
#: controller fencing that broker (``make chaos-cluster``).
BROKER_EVENTS = ("broker_stop", "broker_start", "broker_kill", "broker_fenced")
#: Seconds after a broker's SIGKILL during which leaderships move and clients find the new
#: leaders (the controller fences it after broker.session.timeout.ms, 9 s).
BROKER_KILL_WINDOW_S = 30.0


def broker_outages(events: Sequence[Event]) -> list[tuple[float, float]]:
    """(from, to) wall-clock intervals in which a broker was down or its partitions moving: a
    stop until the next start (of the same broker), a SIGKILL until its fencing plus
    :data:`BROKER_KILL_WINDOW_S`. A stop never followed by a start lasts until the end."""
    out: list[tuple[float, float]] = []
    open_since: dict[str, float] = {}
    for e in sorted(events, key=lambda e: e.t):
        if e.kind in ("broker_stop", "broker_kill"):
            open_since[e.detail] = e.t
        elif e.kind == "broker_start" and e.detail in open_since:
            out.append((open_since.pop(e.detail), e.t))
        elif e.kind == "broker_fenced" and e.detail in open_since:
            out.append((open_since.pop(e.detail), e.t + BROKER_KILL_WINDOW_S))
    out.extend((t, float("inf")) for t in open_since.values())
    return out


def worker_log_events(run_dir: Path) -> list[tuple[float, int, str]]:
    """(time, pid, event) of the queueflow log events in the worker logs that explain
    redeliveries: share-group reassignments, session expiries, leader restores and step-downs,
    failed fetches, refused or dropped acknowledgements and records whose lock expired before a
    handler was free. Read from the workers' JSON log lines (``QUEUEFLOW_LOG_FORMAT=json``)."""
    out: list[tuple[float, int, str]] = []
    for path in sorted(run_dir.glob("w*.log")):
        pid = -1
        with open(path, errors="replace") as f:
            for line in f:
                marker = _PID_MARKER.match(line)
                if marker:
                    pid = int(marker.group(1))
                    continue
                for event in parse_events([line]):
                    if event["event"] in LOG_EVENTS and "timestamp" in event:
                        out.append((event_time(event), pid, event["event"]))
    return sorted(out)


def analyse(
    config: ChaosConfig,
    where: list[tuple[int, int]],
    ledger: Ledger,
    events: list[Event],
    settled: dict[int, str],
    log_events: Sequence[tuple[float, int, str]] = (),
) -> dict[str, Any]:
    """Compare the ledger with what was produced; see the module docstring for the rules.

    ``settled``: for ids without a terminal ledger line, what the leaders' state says
    (:func:`settle`).
    """
    limit = config.delivery_limit
    chaos = [
        e
        for e in events
        if e.kind in ("kill", "exit", *BROKER_EVENTS)
        or (e.kind == "restart" and e.role != "member")
    ]
    killed_pids = {e.pid: e.t for e in events if e.kind in ("kill", "exit")}
    leader_events = sorted(e.t for e in chaos if e.role != "member")
    broker_windows = broker_outages(events)

    any_kill = sorted(e.t for e in chaos)

    def chaos_between(t0: float, t1: float, pid: int | None, anyone: bool = False) -> bool:
        """Was a delivery handled around t0 (by ``pid``) and delivered again at t1 in flight
        at a kill? True if ``pid`` was killed after t0, or a leader-role worker was killed or
        (re)started or the broker restarted between t0 (minus a lock duration) and t1; with
        ``anyone``, a kill of any worker in that window counts too."""
        if pid is not None and pid in killed_pids and t0 - 1 <= killed_pids[pid] <= t1:
            return True
        lo = t0 - config.lock_s - 5
        times = any_kill if anyone else leader_events
        i = bisect.bisect_left(times, lo)
        if i < len(times) and times[i] <= t1:
            return True
        return any(start <= t1 and end >= lo for start, end in broker_windows)

    reassigned = sorted(t for t, _pid, kind in log_events if kind == "assignment")

    def reassignment_between(t0: float, t1: float) -> bool:
        i = bisect.bisect_left(reassigned, t0 - config.lock_s - 5)
        return i < len(reassigned) and reassigned[i] <= t1

    outcomes: Counter[str] = Counter()
    lost: list[int] = []
    lost_why: Counter[str] = Counter()
    unobserved = 0
    misplaced = 0
    duplicates: set[int] = set()
    after_terminal = 0
    unexplained: set[int] = set()
    at_reassignment: set[int] = set()
    repeated_counts = 0
    repeated_ids: dict[int, list[int]] = {}  # id -> its delivery counts, where one repeats
    poison = poison_archived = 0
    poison_deviations: dict[int, list[int]] = {}
    poison_unexplained: dict[int, list[int]] = {}
    poison_over_limit = 0
    poison_extra = poison_extra_unexplained = 0
    archived_at_limit = 0
    archived_after_crashes = 0
    deliveries = 0
    for record_id in range(config.records):
        lines = sorted(ledger.lines.get(record_id, []), key=lambda e: e["t"])
        deliveries += len(lines)
        for e in lines:
            outcomes[e["o"]] += 1
            if (int(e["p"]), int(e["off"])) != tuple(where[record_id]):
                misplaced += 1
        term = terminal_line(lines, limit)
        is_poison = record_id % config.poison_mod == 0
        leader_says = settled.get(record_id) if term is None else None
        if term is None and not (is_poison and leader_says == ARCHIVED_AT_LIMIT):
            # No ACCEPT/REJECT, and not a poison record Archived at the limit. A healthy record
            # Archived at the limit after deliveries that never reached a handler (KIP-932: a
            # delivery counts when acquired, whether or not its member lives to handle it) is
            # not lost when the group has a DLQ and a crash explains the unseen deliveries: it
            # is in the DLQ (the dead-letter check counts it). Otherwise lost: the run ended
            # first ("unfinished"), or the leaders finished it with no handler finishing it.
            t_last = lines[-1]["t"] if lines else min((e.t for e in events), default=0.0)
            unseen = limit - max((int(e["dc"]) for e in lines), default=0)
            if (
                config.dead_letters
                and leader_says == ARCHIVED_AT_LIMIT
                and unseen > 0
                and chaos_between(
                    t_last, t_last + unseen * (config.lock_s + 5) + 60, None, anyone=True
                )
            ):
                archived_after_crashes += 1
            else:
                lost.append(record_id)
                lost_why[leader_says or "unfinished"] += 1
        elif term is not None and term["o"] in FAILED and not is_poison:
            archived_at_limit += 1
        seen_counts = {int(e["dc"]) for e in lines}
        if seen_counts:
            unobserved += len(set(range(1, max(seen_counts))) - seen_counts)
        # Duplicates: a delivery after the terminal one, or a delivery count the previous
        # delivery's outcome doesn't explain (the previous one was not RELEASE/raise).
        by_count: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in lines:
            by_count[int(e["dc"])].append(e)
        dup = False
        prev: dict[str, Any] | None = None
        for e in lines:
            dc = int(e["dc"])
            if term is not None and e is not term and e["t"] > term["t"]:
                after_terminal += 1
                dup = True
                t0, pid = term["t"], term["pid"]
            elif dc > 1 and not any(x["o"] in FAILED for x in by_count.get(dc - 1, [])):
                dup = True  # delivery dc-1 was never seen failing: in flight at a kill?
                seen = bool(by_count.get(dc - 1))
                t0 = prev["t"] if prev is not None else 0.0
                pid = prev["pid"] if prev is not None and seen else None
            else:
                prev = e
                continue
            if not chaos_between(t0, e["t"], pid, anyone=pid is None):
                unexplained.add(record_id)
                if reassignment_between(t0, e["t"]):
                    at_reassignment.add(record_id)
            prev = e
        repeated = sum(len(v) - 1 for v in by_count.values() if len(v) > 1)
        repeated_counts += repeated
        if repeated:
            dup = True
            repeated_ids[record_id] = [int(e["dc"]) for e in lines]
        if dup:
            duplicates.add(record_id)
        if is_poison:
            poison += 1
            counts = sorted(int(e["dc"]) for e in lines)
            archived = (term is not None) or leader_says == ARCHIVED_AT_LIMIT
            poison_archived += archived
            if counts and counts[-1] > limit:
                poison_over_limit += 1
            if counts != list(range(1, limit + 1)):
                poison_deviations[record_id] = counts
                t0 = lines[0]["t"] if lines else 0.0
                t1 = lines[-1]["t"] if lines else time.time()
                if not chaos_between(t0, t1 + config.lock_s + 5, None, anyone=True):
                    poison_unexplained[record_id] = counts
                if len(counts) > limit:  # handled more often than the limit allows
                    poison_extra += 1
                    if record_id in poison_unexplained:
                        poison_extra_unexplained += 1
    lost_detail: dict[str, Any] = {}
    for record_id in sorted(lost, key=lambda i: (settled.get(i) is None, i))[:20]:
        lost_detail[str(record_id)] = {
            "partition_offset": where[record_id],
            "ledger": [(e["dc"], e["o"], e["pid"]) for e in ledger.lines.get(record_id, [])],
            "leaders": settled.get(record_id, "unfinished"),
        }
    poison_by_leader = sum(
        1
        for i, st in settled.items()
        if st == ARCHIVED_AT_LIMIT and i % config.poison_mod == 0 and i < config.records
    )
    return {
        "records": config.records,
        "partitions": config.partitions,
        "workers": len(config.roles),
        "roles": dict(Counter(config.roles)),
        "lost": len(lost),
        "lost_unfinished": lost_why["unfinished"],
        "lost_archived_unprocessed": lost_why[ARCHIVED_AT_LIMIT],
        "lost_other": {
            k: v for k, v in lost_why.items() if k not in ("unfinished", ARCHIVED_AT_LIMIT)
        },
        "archived_after_crashes": archived_after_crashes,
        "duplicates": len(duplicates),
        "duplicates_after_terminal": after_terminal,
        "duplicates_explained": len(duplicates - unexplained),
        "duplicates_unexplained": len(unexplained),
        "duplicates_unexplained_at_reassignment": len(at_reassignment),
        "repeated_delivery_counts": repeated_counts,
        "poison": poison,
        "poison_archived": poison_archived,
        "poison_deviations": len(poison_deviations),
        "poison_deviations_unexplained": len(poison_unexplained),
        "poison_over_limit": poison_over_limit,
        "poison_extra_deliveries": poison_extra,
        "poison_extra_deliveries_unexplained": poison_extra_unexplained,
        "poison_archived_unobserved": poison_by_leader,
        "deliveries_unobserved": unobserved,
        "archived_at_limit_not_poison": archived_at_limit,
        "accepted_ids": sum(
            1
            for i in range(config.records)
            if (t := terminal_line(ledger.lines.get(i, []), limit)) and t["o"] == "ACCEPT"
        ),
        "rejected_ids": sum(
            1
            for i in range(config.records)
            if (t := terminal_line(ledger.lines.get(i, []), limit)) and t["o"] == "REJECT"
        ),
        "archived_ids": sum(
            1
            for i in range(config.records)
            if (t := terminal_line(ledger.lines.get(i, []), limit)) and t["o"] in FAILED
        )
        + poison_by_leader,
        "deliveries": deliveries,
        "outcomes": dict(outcomes),
        "misplaced": misplaced,
        "unexpected_exits": sum(1 for e in events if e.kind == "exit"),
        "worker_processes": len(ledger.starts),
        "lost_sample": lost_detail,
        "poison_deviation_sample": {str(k): v for k, v in list(poison_deviations.items())[:10]},
        "unexplained_sample": sorted(unexplained)[:10],
        "repeated_sample": {str(i): repeated_ids[i] for i in sorted(repeated_ids)[:10]},
        "log_events": dict(Counter(kind for _t, _pid, kind in log_events)),
    }
