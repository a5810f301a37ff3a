"""The micro-benchmark run: arguments, selection, the table and the JSON.

Usage: ``python -m bench.micro [--quick] [--only NAME[,NAME...]] [--json PATH]``

``--only`` takes benchmark names or dotted prefixes of them (``engine``, ``codec.wire``,
``read.records.crc``). The JSON (default ``bench/results/micro-latest.json``) holds ``machine``
(as :func:`bench.suite.machine`: commit, Python version, CPU model...), ``sizes``, ``quick``
and ``benchmarks``: name -> ``{median_us, min_us, max_us, repeats, n, unit, what}``, the µs
being per ``unit``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.context import RESULTS
from bench.micro import answer, codecs, dispatch, engine, lazy, readpath, units
from bench.micro.timing import FULL, QUICK, Result, Sizes
from bench.suite import machine

__all__ = ["BENCHMARKS", "DEFAULT_JSON", "main", "selected"]

#: Where the JSON goes without ``--json``.
DEFAULT_JSON = RESULTS / "micro-latest.json"
#: Every group of benchmarks, in the order they run: name prefix -> runner.
BENCHMARKS: dict[str, Callable[[Sizes], list[Result]]] = {
    **engine.BENCHMARKS,
    **codecs.BENCHMARKS,
    **readpath.BENCHMARKS,
    **lazy.BENCHMARKS,
    **units.BENCHMARKS,
    **dispatch.BENCHMARKS,
    **answer.BENCHMARKS,
}


def _named(name: str, wanted: str) -> bool:
    """``wanted`` is ``name`` or a dotted prefix of it."""
    return name == wanted or name.startswith(wanted + ".")


def selected(only: list[str]) -> dict[str, Callable[[Sizes], list[Result]]]:
    """The groups that hold a benchmark named by ``only`` (all when empty)."""
    if not only:
        return dict(BENCHMARKS)
    return {
        g: run for g, run in BENCHMARKS.items() if any(_named(g, w) or _named(w, g) for w in only)
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: checks that everything runs"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated benchmark names or prefixes (engine, codec.wire, read.parse, ...)",
    )
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})"
    )
    args = parser.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    return args


def table(results: list[Result]) -> str:
    """One line per benchmark: µs per unit, median and min..max."""
    width = max([len(r.name) for r in results] + [9])
    lines = [
        f"{'benchmark':<{width}}  {'unit':<7} {'median µs':>10} {'min..max µs':>21} {'n':>7}  what",
        "-" * (width + 80),
    ]
    for r in results:
        spread = f"{r.min_us:.3f}..{r.max_us:.3f}"
        lines.append(
            f"{r.name:<{width}}  {r.unit:<7} {r.median_us:>10.3f} {spread:>21} {r.n:>7}  {r.what}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; print the table; write the JSON. Returns the exit status (2 when
    ``--only`` names nothing)."""
    args = parse_args(argv)
    groups = selected(args.only)
    if not groups:
        print(f"no benchmark matches {args.only}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    # queueflow logs its agents' and leaders' lifecycle at info: not part of a figure.
    from queueflow.logging import configure

    configure(level=logging.ERROR)
    sizes = QUICK if args.quick else FULL
    info = machine()
    results: list[Result] = []
    started = time.monotonic()
    for group, run in groups.items():
        print(f"==> {group}", file=sys.stderr, flush=True)
        found = run(sizes)
        results.extend(
            r for r in found if not args.only or any(_named(r.name, w) for w in args.only)
        )
    with contextlib.suppress(OSError):
        info["loadavg_after"] = os.getloadavg()
    out: dict[str, Any] = {
        "machine": info,
        "quick": args.quick,
        "sizes": dataclasses.asdict(sizes),
        "seconds": round(time.monotonic() - started, 1),
        "benchmarks": {r.name: r.as_json() for r in results},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(table(results))
    print(f"\nresults: {args.json} ({out['seconds']} s)")
    return 0
