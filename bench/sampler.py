"""A CPU-weighted stack sampler for bench workers, where py-spy is not installed.

``BENCH_SAMPLE_PROFILE=<path>`` in a :mod:`bench.qf_app` worker's environment starts it: a
daemon thread reads every thread's CPU clock (``time.pthread_getcpuclockid``) every
``BENCH_SAMPLE_INTERVAL_MS`` (default 5) ms and charges the CPU a thread used since the last
sample to that thread's current stack (``sys._current_frames``), so idle waits cost nothing.
The collapsed stacks (flamegraph.pl input: ``thread;frame;frame... µs``) are rewritten to
``<path>`` every 5 s and at exit, with the sampler's own CPU under :data:`SELF`;
:func:`top` summarises such a file. ``BENCH_SAMPLE_ROLES`` (comma-separated
``QUEUEFLOW_ROLE`` values, default all) limits it to some workers. Indicative only: a sample
charges the whole interval's CPU to the stack seen at its end.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path

__all__ = ["SELF", "start", "top"]

#: The stack under which the sampler's own CPU is written (subtract it from the process's).
SELF = "bench-sampler;sampler-own-cpu"


def _stack(frame: object) -> str:
    names = []
    f = frame
    while f is not None:
        code = f.f_code  # type: ignore[attr-defined]
        names.append(f"{Path(code.co_filename).name}:{code.co_name}")
        f = f.f_back  # type: ignore[attr-defined]
    return ";".join(reversed(names))


def start(path: str, interval_s: float = 0.005) -> None:
    """Sample every thread's stack weighted by its CPU time; write collapsed stacks to
    ``path`` (see the module docstring)."""
    counts: collections.Counter[str] = collections.Counter()
    last: dict[int, float] = {}

    def write() -> None:
        lines = [f"{stack} {round(us)}" for stack, us in counts.most_common()]
        Path(path).write_text("\n".join(lines) + "\n")

    def run() -> None:
        me = threading.get_ident()  # this thread: its own CPU is counted apart
        own = time.pthread_getcpuclockid(me)
        written = time.monotonic()
        while True:
            time.sleep(interval_s)
            counts[SELF] = time.clock_gettime(own) * 1e6
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                try:
                    cpu = time.clock_gettime(time.pthread_getcpuclockid(ident))
                except (OSError, ProcessLookupError):
                    continue
                used = cpu - last.get(ident, cpu)
                last[ident] = cpu
                if used > 0:
                    counts[f"{names.get(ident, ident)};{_stack(frame)}"] += used * 1e6
            if time.monotonic() - written > 5:
                write()
                written = time.monotonic()

    threading.Thread(target=run, name="bench-sampler", daemon=True).start()
    import atexit

    atexit.register(write)


def top(path: str, n: int = 30) -> str:
    """The ``n`` functions with the most inclusive and self CPU in a collapsed-stacks file."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0.0
    for line in Path(path).read_text().splitlines():
        stack, _, us = line.rpartition(" ")
        value = float(us)
        total += value
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] += value
        own[frames[-1]] += value
    out = [f"total {total / 1e6:.3f} s CPU"]
    out += [f"incl {v / total:6.1%} {k}" for k, v in inclusive.most_common(n)]
    out += [f"self {v / total:6.1%} {k}" for k, v in own.most_common(n)]
    return "\n".join(out)


if __name__ == "__main__":
    print(top(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30))
    os._exit(0)
