"""Kafka's share-consumer perf tool (``kafka-share-consumer-perf-test.sh``, the class
``org.apache.kafka.tools.ShareConsumerPerformance``): its command line and the parsing of what it
prints. Pure: no process is started here (S11, :mod:`bench.scenario_s11`, runs the tool).

The tool (Kafka 4.3.1) prints, on stdout:

* a header ``start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec,
  data.consumed.in.nMsg, fetch.time.ms``;
* with ``--show-detailed-stats``, per share consumer every ``--reporting-interval`` ms while
  records come: ``<start>, <end>, <MB so far>, <MB/s in the interval>, <records/s in the
  interval>, <records so far>, <interval ms> for share consumer <n>``; the first interval starts
  when the consumer's thread starts (before it has joined the group);
* ``WARNING: Exiting before consuming the expected number of records: timeout (<ms> ms)
  exceeded. ...`` when ``--timeout`` ms passed without a record;
* the summary: ``<start>, <end>, <MB>, <MB/s>, <records/s>, <records>, <ms>``, where start is
  taken once the consumers are created, before they subscribe: the tool's rates include joining
  the share group (KIP-932 ShareGroupHeartbeat) and the first fetch.

Times are formatted ``yyyy-MM-dd HH:mm:ss:SSS`` (the tool's ``--date-format`` default) in the
JVM's time zone; MB are MiB (2**20 bytes) of keys and values.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAIN_CLASS",
    "PerfToolOutputError",
    "PerfToolResult",
    "ProgressRow",
    "parse_perf_tool",
    "perf_tool_args",
]

#: What ``kafka-share-consumer-perf-test.sh`` runs (through ``kafka-run-class.sh``).
MAIN_CLASS = "org.apache.kafka.tools.ShareConsumerPerformance"
_DATE_FORMAT = "%Y-%m-%d %H:%M:%S:%f"
_WARNING = "WARNING: Exiting before consuming the expected number of records"
_PROGRESS = " for share consumer "


class PerfToolOutputError(ValueError):
    """The tool's stdout has no summary line (it failed before consuming, or is not the tool)."""


@dataclass(frozen=True)
class ProgressRow:
    """One ``--show-detailed-stats`` line: share consumer ``consumer`` (1-based) had read
    ``records`` in all by ``end`` (epoch seconds); ``rate`` is records/s over the interval."""

    consumer: int
    start: float
    end: float
    records: int
    rate: float


@dataclass(frozen=True)
class PerfToolResult:
    """The tool's summary line, its progress lines, and what follows from them.

    Attributes:
        records: records consumed (the summary's ``data.consumed.in.nMsg``).
        mb: MiB of keys and values consumed.
        mb_s: the tool's ``MB.sec`` (MiB/s from its start, group join included).
        rec_s: the tool's ``nMsg.sec`` (records/s from its start, group join included).
        elapsed_s: the tool's ``fetch.time.ms`` in seconds (end - start).
        start: the summary's start time (epoch seconds, JVM's time zone read as local).
        end: the summary's end time (same clock).
        timed_out: the tool printed its "Exiting before consuming the expected number" warning.
        progress: the ``--show-detailed-stats`` lines, in order.
    """

    records: int
    mb: float
    mb_s: float
    rec_s: float
    elapsed_s: float
    start: float
    end: float
    timed_out: bool = False
    progress: list[ProgressRow] = field(default_factory=list)

    def after_first_report(self) -> tuple[float | None, float | None]:
        """(records/s, seconds) from the first progress report to the end: the rate once
        records flow, without joining the group and the first fetch; (None, None) without a
        progress line or when the first report is the end."""
        if not self.progress:
            return None, None
        first = min(row.end for row in self.progress)
        # per consumer, what it had read by the first report (0 if it had not reported yet)
        before: dict[int, int] = {}
        for row in self.progress:
            if row.end <= first:
                before[row.consumer] = max(before.get(row.consumer, 0), row.records)
        seconds = self.end - first
        if seconds <= 0:
            return None, None
        return (self.records - sum(before.values())) / seconds, seconds

    def as_dict(self, expected: int | None = None) -> dict[str, Any]:
        """The figures as JSON-able values; ``complete`` when ``expected`` records were read
        and the tool did not time out."""
        steady, steady_s = self.after_first_report()
        out: dict[str, Any] = {
            "records": self.records,
            "mb": round(self.mb, 3),
            "mb_s": round(self.mb_s, 3),
            "rec_s": round(self.rec_s, 1),
            "elapsed_s": round(self.elapsed_s, 3),
            "steady_rec_s": None if steady is None else round(steady, 1),
            "steady_s": None if steady_s is None else round(steady_s, 3),
            "progress_lines": len(self.progress),
            "timed_out": self.timed_out,
        }
        if expected is not None:
            out["expected"] = expected
            out["complete"] = self.records >= expected and not self.timed_out
        return out


def _time(text: str) -> float:
    """Epoch seconds of the tool's default date format (``2026-11-27 21:50:01:123``)."""
    return datetime.datetime.strptime(text.strip(), _DATE_FORMAT).timestamp()


def _fields(line: str) -> list[str] | None:
    """The comma-separated fields of a stats line (summary or progress), or None."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 7 or not parts[0][:4].isdigit():
        return None
    return parts


def _summary(parts: list[str]) -> dict[str, Any]:
    """The summary line's fields as :class:`PerfToolResult` arguments (ValueError if not)."""
    return {
        "records": int(parts[5]),
        "mb": float(parts[2]),
        "mb_s": float(parts[3]),
        "rec_s": float(parts[4]),
        "elapsed_s": int(parts[6]) / 1000,
        "start": _time(parts[0]),
        "end": _time(parts[1]),
    }


def parse_perf_tool(stdout: str) -> PerfToolResult:
    """Parse ``ShareConsumerPerformance``'s stdout (see the module docstring for the lines).

    Args:
        stdout: the tool's whole standard output (header, progress, warning, summary).

    Returns:
        The figures of the last summary line and every progress line.

    Raises:
        PerfToolOutputError: no summary line (e.g. the tool exited on an error: see its
            stderr).
    """
    progress: list[ProgressRow] = []
    summary: dict[str, Any] | None = None
    timed_out = False
    for line in stdout.splitlines():
        if line.startswith(_WARNING):
            timed_out = True
            continue
        head, _, consumer = line.partition(_PROGRESS)
        parts = _fields(head)
        if parts is None:
            continue
        try:
            if consumer:
                progress.append(
                    ProgressRow(
                        consumer=int(consumer.strip()),
                        start=_time(parts[0]),
                        end=_time(parts[1]),
                        records=int(parts[5]),
                        rate=float(parts[4]),
                    )
                )
            else:
                summary = _summary(parts)
        except ValueError:
            continue  # not a stats line after all (e.g. a log line with commas)
    if summary is None:
        tail = stdout.strip()[-300:]
        raise PerfToolOutputError(f"no summary line in the perf tool's output: {tail!r}")
    return PerfToolResult(**summary, timed_out=timed_out, progress=progress)


def perf_tool_args(
    bootstrap: str,
    topic: str,
    group: str,
    records: int,
    *,
    threads: int = 1,
    timeout_ms: int = 30_000,
    reporting_interval_ms: int = 500,
    extra: Sequence[str] = (),
) -> list[str]:
    """The tool's arguments: consume ``records`` from ``topic`` in share group ``group`` with
    ``threads`` share consumers, giving up after ``timeout_ms`` without a record (joining
    included), with per-interval progress lines every ``reporting_interval_ms``.

    Raises:
        ValueError: ``records`` or ``threads`` below 1.
    """
    if records < 1 or threads < 1:
        raise ValueError(f"records and threads must be >= 1, got {records} and {threads}")
    return [
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        "--num-records",
        str(records),
        "--threads",
        str(threads),
        "--timeout",
        str(timeout_ms),
        "--show-detailed-stats",
        "--reporting-interval",
        str(reporting_interval_ms),
        *extra,
    ]
