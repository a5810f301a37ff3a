"""``make partition-test`` tells two leaders serving one record (the handler saw it twice at
the same delivery count) from a redelivery (the delivery count went up)."""

from __future__ import annotations

from typing import Any

from examples.partition.run import repeated_delivery_counts


def line(dc: int, partition: int = 0, outcome: str = "ACCEPT") -> dict[str, Any]:
    return {"dc": dc, "p": partition, "o": outcome}


def test_the_same_delivery_count_twice_is_counted_a_redelivery_is_not() -> None:
    lines = {
        1: [line(1)],  # handled once
        2: [line(1, 0, "RELEASE"), line(2)],  # a lock elapsed: delivered again, counted up
        3: [line(1, 2), line(1, 2)],  # two leaders handed it out
        4: [line(1, 2), line(2, 2), line(2, 2)],  # the redelivery itself twice
        5: [line(1, 1), line(1, 1)],
    }
    assert repeated_delivery_counts(lines) == {
        "repeated_delivery_counts": 3,
        "repeated_by_partition": {"1": 1, "2": 2},
        "repeated_sample": [3, 4, 5],
    }


def test_nothing_repeated() -> None:
    assert repeated_delivery_counts({1: [line(1)], 2: [line(1), line(2), line(3)]}) == {
        "repeated_delivery_counts": 0,
        "repeated_by_partition": {},
        "repeated_sample": [],
    }
