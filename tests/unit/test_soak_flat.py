"""The flatness check of ``make soak`` (:mod:`examples.soak.flat`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ is not installed
    sys.path.insert(0, str(ROOT))

from examples.soak.flat import flatness  # noqa: E402


def test_a_leak_is_not_flat_and_a_plateau_is() -> None:
    leak = [100.0 + 3 * i for i in range(100)]  # +3 per sample, steadily
    assert not flatness(leak).flat
    plateau = [10.0 * i for i in range(20)] + [200.0] * 80  # warm-up, then steady
    verdict = flatness(plateau)
    assert verdict.flat and verdict.middle == verdict.last == 200.0 and verdict.growth == 0.0


def test_a_restart_dip_and_a_sawtooth_stay_flat() -> None:
    sawtooth = [100.0 + (i % 10) * 5 for i in range(120)]  # compaction-like
    assert flatness(sawtooth).flat
    dips = [200.0 if i % 3 else 60.0 for i in range(90)]  # a killed-and-restarted process
    assert flatness(dips).flat


def test_slack_allows_small_absolute_growth() -> None:
    small = [10.0] * 60 + [12.0] * 40
    assert not flatness(small, tolerance=0.1).flat
    assert flatness(small, tolerance=0.1, slack=2.0).flat


def test_too_short_to_judge_is_reported_as_such() -> None:
    verdict = flatness([1.0, 50.0, 900.0])
    assert verdict.flat and verdict.samples == 3


def test_bad_parameters_are_refused() -> None:
    for kwargs in ({"warmup": 1.0}, {"tolerance": -0.1}, {"slack": -1.0}):
        with pytest.raises(ValueError):
            flatness([1.0] * 10, **kwargs)  # type: ignore[arg-type]


@given(st.lists(st.floats(0, 1e9), min_size=8, max_size=200), st.floats(0.0, 0.9))
def test_constant_growth_free_series_are_flat_and_doubling_is_not(
    values: list[float], warmup: float
) -> None:
    steady = [5.0] * len(values)
    assert flatness(steady, warmup=warmup).flat
    n = len(values)
    doubling = [1.0 if i < n * 0.6 else 100.0 for i in range(n)]
    verdict = flatness(doubling, warmup=warmup)
    rest = n - int(n * warmup)
    if rest >= 6 and verdict.middle == 1.0:
        assert not verdict.flat
