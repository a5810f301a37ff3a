"""The capacity model's arithmetic: from measured per-record and per-heartbeat costs (the JSON
line of ``python -m bench.capacity``) to how many leader workers, source partitions, members
and coordinator partitions a rate and a group count need, and what saturates first.

Pure (no I/O); unit-tested in tests/unit/test_bench_capacity_model.py. docs/operations.md
"Capacity model" explains each figure and prints the table this module makes.

Sizing rules, one per column (``R``: acknowledged records/s over all groups, ``G``: groups):

* leader workers ``W = ceil(R * L / (1e6 * U))``: ``L`` leader CPU µs per record, ``U`` the
  target utilisation of a core (a worker is one Python process: at most one core);
* source partitions ``P = W``: a share-partition is led by one worker, one request at a time,
  so fewer partitions than workers leave workers idle (more are fine);
* member processes ``N = ceil(R * M / (1e6 * U))``: ``M`` member CPU µs per record (a no-op
  handler: the user's handler comes on top); memberships ``max(N, G)`` (every group needs a
  member; one process may serve several groups);
* heartbeats/s ``memberships / (heartbeat interval s)``; coordinator cores
  ``hb * H / (1e6 * U)`` (``H`` coordinator CPU µs per heartbeat); coordinator partitions
  ``C = max(ceil(cores), 1)``;
* changelog bytes/s ``R * B_ack`` (``B_ack`` changelog bytes per acknowledged record);
* broker bytes/s ``R * (2 * record size) + changelog``: produced once, fetched once by a
  member (the direct path carries no record bytes through Kafka twice);
* broker cores ``R * K / (1e6 * U)`` (``K`` broker CPU µs per record, measured on one broker:
  replication adds to it);
* in flight ``R * hold s * bytes per in-flight record`` (Little's law).

The first to saturate is queueflow's process type that needs the most cores (leader, member,
coordinator): adding hosts to a deployment, that is the one to add first. The broker's cores and
bytes are shown beside it (Kafka's own sizing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GROUPS",
    "RATES",
    "Assumptions",
    "Row",
    "figures_markdown",
    "markdown",
    "row",
    "table",
]

RATES = (10_000, 100_000, 1_000_000)
GROUPS = (10, 1_000, 100_000)


@dataclass(frozen=True)
class Assumptions:
    """What the model assumes beyond the measured figures.

    Attributes:
        utilisation: target fraction of a core per process (0 < u <= 1).
        heartbeat_interval_s: ``group.share.heartbeat.interval.ms`` / 1000 (KIP-932 default 5).
        record_bytes: source record size in bytes.
        hold_s: how long a record stays in flight (acquired until acknowledged), seconds.
    """

    utilisation: float = 0.7
    heartbeat_interval_s: float = 5.0
    record_bytes: int = 1024
    hold_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.utilisation <= 1:
            raise ValueError(f"utilisation must be in (0, 1], got {self.utilisation}")
        if self.heartbeat_interval_s <= 0 or self.record_bytes <= 0 or self.hold_s < 0:
            raise ValueError(f"bad assumptions: {self}")


@dataclass(frozen=True)
class Row:
    """One rate and group count, sized.  Byte figures are per second except ``inflight_mb``."""

    rate: int
    groups: int
    leader_workers: int
    partitions: int
    members: int
    memberships: int
    heartbeats_per_s: float
    coordinator_partitions: int
    changelog_mb_s: float
    broker_mb_s: float
    inflight_mb: float
    cores: dict[str, float]
    first: str
    arithmetic: str


#: figure keys of the measured JSON the model reads
_NEEDED = (
    "leader_cpu_us_per_record",
    "member_cpu_us_per_record",
    "broker_cpu_us_per_record",
    "coordinator_cpu_us_per_heartbeat",
    "changelog_bytes_per_ack",
    "bytes_per_inflight_record",
)


def _figures(measured: Mapping[str, Any]) -> dict[str, float]:
    missing = [k for k in _NEEDED if not isinstance(measured.get(k), int | float)]
    if missing:
        raise ValueError(
            f"the capacity JSON lacks {', '.join(missing)}: run `python -m bench.capacity` "
            "(or `make capacity`) again and pass its JSON line"
        )
    return {k: float(measured[k]) for k in _NEEDED}


def _ceil(x: float) -> int:
    return max(math.ceil(x - 1e-9), 1)


def row(
    measured: Mapping[str, Any], rate: int, groups: int, assume: Assumptions | None = None
) -> Row:
    """Size one (rate records/s, groups) point from the measured figures (see the module).

    Raises:
        ValueError: a figure is missing, or rate/groups is not positive.
    """
    if rate <= 0 or groups <= 0:
        raise ValueError(f"rate and groups must be positive, got {rate}, {groups}")
    a = assume or Assumptions()
    f = _figures(measured)
    core_us = 1e6 * a.utilisation
    leader_cores = rate * f["leader_cpu_us_per_record"] / 1e6
    member_cores = rate * f["member_cpu_us_per_record"] / 1e6
    broker_cores = rate * f["broker_cpu_us_per_record"] / 1e6
    workers = _ceil(rate * f["leader_cpu_us_per_record"] / core_us)
    members = _ceil(rate * f["member_cpu_us_per_record"] / core_us)
    memberships = max(members, groups)
    heartbeats = memberships / a.heartbeat_interval_s
    coordinator_cores = heartbeats * f["coordinator_cpu_us_per_heartbeat"] / 1e6
    coordinators = _ceil(heartbeats * f["coordinator_cpu_us_per_heartbeat"] / core_us)
    changelog = rate * f["changelog_bytes_per_ack"]
    broker_bytes = rate * 2 * a.record_bytes + changelog
    inflight = rate * a.hold_s * f["bytes_per_inflight_record"]
    cores = {
        "leader": round(leader_cores, 2),
        "member": round(member_cores, 2),
        "coordinator": round(coordinator_cores, 2),
        "broker": round(broker_cores, 2),
    }
    # queueflow's own processes; the broker's cores are shown, sized as Kafka sizes a cluster
    first = max(("leader", "member", "coordinator"), key=lambda k: cores[k])
    arithmetic = (
        f"W=ceil({rate:,}*{f['leader_cpu_us_per_record']:g}/{core_us:,.0f})={workers}; "
        f"N=ceil({rate:,}*{f['member_cpu_us_per_record']:g}/{core_us:,.0f})={members}; "
        f"hb=max(N,G)/{a.heartbeat_interval_s:g}={heartbeats:,.0f}/s; "
        f"C=ceil({heartbeats:,.0f}*{f['coordinator_cpu_us_per_heartbeat']:g}/{core_us:,.0f})"
        f"={coordinators}"
    )
    return Row(
        rate=rate,
        groups=groups,
        leader_workers=workers,
        partitions=workers,
        members=members,
        memberships=memberships,
        heartbeats_per_s=round(heartbeats, 1),
        coordinator_partitions=coordinators,
        changelog_mb_s=round(changelog / 1e6, 2),
        broker_mb_s=round(broker_bytes / 1e6, 1),
        inflight_mb=round(inflight / 1e6, 1),
        cores=cores,
        first=first,
        arithmetic=arithmetic,
    )


def table(
    measured: Mapping[str, Any],
    rates: Sequence[int] = RATES,
    groups: Sequence[int] = GROUPS,
    assume: Assumptions | None = None,
) -> list[Row]:
    """Every (rate, groups) combination, rates outermost."""
    return [row(measured, r, g, assume) for r in rates for g in groups]


def markdown(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (docs/operations.md "Capacity model")."""
    head = (
        "| records/s | groups | leader workers = partitions | member processes | "
        "heartbeats/s | coordinator partitions | changelog MB/s | broker MB/s | "
        "in flight MB | cores: leader / member / coordinator / broker | saturates first | "
        "arithmetic |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        c = r.cores
        lines.append(
            f"| {r.rate:,} | {r.groups:,} | {r.leader_workers} | {r.members} | "
            f"{r.heartbeats_per_s:,.0f} | {r.coordinator_partitions} | {r.changelog_mb_s:g} | "
            f"{r.broker_mb_s:g} | {r.inflight_mb:g} | "
            f"{c['leader']:g} / {c['member']:g} / {c['coordinator']:g} / {c['broker']:g} | "
            f"{r.first} | {r.arithmetic} |"
        )
    return "\n".join(lines)


#: (figure key, what it is, how it is measured) for :func:`figures_markdown`
FIGURE_ROWS = (
    (
        "leader_cpu_us_per_record",
        "leader CPU per acknowledged record, µs",
        "leader worker's CPU ÷ records ACCEPTed in the window; a batch handler (one "
        "acknowledgement per fetched batch), 4 partitions, 2 member processes",
    ),
    ("leader_records_per_core_s", "records/s one leader core serves", "10⁶ ÷ the above"),
    (
        "member_cpu_us_per_record",
        "member CPU per record, µs",
        "the member processes' CPU ÷ the same records (no-op batch handler)",
    ),
    (
        "broker_cpu_us_per_record",
        "broker CPU per record, µs",
        "the broker JVM's CPU ÷ the same records (one broker, RF 1)",
    ),
    (
        "changelog_bytes_per_ack",
        "changelog bytes per acknowledged record",
        "key + value bytes in the state changelog from the app's start to the window's end ÷ "
        "records acknowledged by then (batch pattern)",
    ),
    (
        "records_per_ack_request",
        "records per acknowledgement (batch size N)",
        "records acquired per ShareFetch, mean over the members",
    ),
    (
        "coordinator_cpu_us_per_heartbeat",
        "coordinator CPU per heartbeat, µs",
        "a leader worker's CPU (its idle CPU subtracted) ÷ ShareGroupHeartbeats it answered: "
        "200 groups of one member, heartbeats sent as fast as answered (32 in flight), request "
        "and reply topics",
    ),
    ("heartbeats_per_core_s", "heartbeats/s one coordinator core serves", "10⁶ ÷ the above"),
    (
        "bytes_per_inflight_record",
        "bytes per in-flight record",
        "the engine under tracemalloc, every in-flight record a run of its own (S5's worst case)",
    ),
)


def figures_markdown(measured: Mapping[str, Any]) -> str:
    """The measured figures (and the scattered-RELEASE pattern's) as a Markdown table."""
    release = measured.get("release10") or {}
    lines = [
        "| figure | measured | scattered RELEASE (10 %) | how |",
        "|---|---|---|---|",
    ]
    for key, what, how in FIGURE_ROWS:
        other = release.get(key)
        lines.append(
            f"| {what} | {_fmt(measured.get(key))} | {_fmt(other) if other is not None else ''} "
            f"| {how} |"
        )
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, int | float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:g}"
    return "—" if value is None else str(value)
