"""``make chaos`` fails (exit status 1) on a lost record and on a repeated delivery count."""

from __future__ import annotations

import pytest

from examples.chaos.__main__ import failed

CLEAN = {"lost": 0, "repeated_delivery_counts": 0}


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        (CLEAN, False),
        ({**CLEAN, "lost": 1}, True),
        ({**CLEAN, "repeated_delivery_counts": 2}, True),
        ({**CLEAN, "results_duplicates": 1}, True),
    ],
)
def test_failed(summary: dict[str, int], expected: bool) -> None:
    assert failed(summary) is expected
