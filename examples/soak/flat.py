"""Is a series flat after warm-up? The check ``make soak`` applies to every sampled series."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Verdict", "flatness"]


@dataclass(frozen=True)
class Verdict:
    """What :func:`flatness` found for one series.

    Attributes:
        flat: the series did not grow after warm-up (see :func:`flatness`).
        first / middle / last: medians of the warm-up part and of the middle and last thirds
            of the rest.
        growth: ``(last - middle) / middle`` (0 when the middle is 0).
        samples: how many samples the series had.
    """

    flat: bool
    first: float
    middle: float
    last: float
    growth: float
    samples: int


def flatness(
    values: Sequence[float],
    warmup: float = 0.2,
    tolerance: float = 0.25,
    slack: float = 0.0,
) -> Verdict:
    """Check that ``values`` (samples at a steady interval) stay flat after warm-up.

    The first ``warmup`` fraction of the samples is warm-up. The rest is cut in thirds; the
    series is flat when the median of the last third is at most ``(1 + tolerance)`` times the
    median of the middle third plus ``slack`` (an absolute allowance, e.g. 16 MiB of RSS).
    Medians make a restarted process's dip, or a compaction's sawtooth, count for what it is:
    a leak shows as a last third above the middle one.

    Args:
        values: the series, oldest first (at least 6 samples after warm-up to judge).
        warmup: fraction of the samples ignored at the start (0 <= warmup < 1).
        tolerance: allowed relative growth from the middle to the last third.
        slack: allowed absolute growth, in the series' unit.

    Returns:
        The verdict; a series too short to judge is reported flat with ``samples`` saying so.

    Raises:
        ValueError: ``warmup`` outside [0, 1) or a negative ``tolerance`` / ``slack``.
    """
    if not 0 <= warmup < 1 or tolerance < 0 or slack < 0:
        raise ValueError(f"warmup={warmup} (0 <= w < 1), tolerance={tolerance}, slack={slack}")
    n = len(values)
    cut = int(n * warmup)
    rest = list(values[cut:])
    first = statistics.median(values[:cut]) if cut else (values[0] if values else 0.0)
    if len(rest) < 6:
        last = rest[-1] if rest else 0.0
        return Verdict(True, float(first), float(last), float(last), 0.0, n)
    third = len(rest) // 3
    middle = statistics.median(rest[third : 2 * third])
    last = statistics.median(rest[2 * third :])
    growth = (last - middle) / middle if middle else 0.0
    flat = last <= middle * (1 + tolerance) + slack
    return Verdict(flat, float(first), float(middle), float(last), round(growth, 4), n)
