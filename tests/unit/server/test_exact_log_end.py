"""A leader acquires against the exact log end (docs/architecture.md "The leader's steps"):
the end it knows serves a backlog; short of ``max_records`` it asks the broker; a long poll that
knows of nothing new parks instead (its wait reads the partition)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from inprocess_helpers import TOPIC, run

from queueflow.server.leader.fetching import ShareFetcher
from queueflow.structs import TopicPartition

TP = TopicPartition(TOPIC, 0)


class _Ends:
    """Log offsets whose known high watermark lags the broker's."""

    def __init__(self, known: int | None, broker: int) -> None:
        self.known, self.broker, self.asked = known, broker, 0

    def known_end(self, tp: TopicPartition) -> int | None:
        return self.known

    async def log_end(self, tp: TopicPartition) -> int:
        self.asked += 1
        self.known = self.broker
        return self.broker


@pytest.mark.parametrize(
    ("known", "speo", "max_records", "max_wait_ms", "end", "asked"),
    [
        (5, 0, 100, 0, 20, 1),  # short of max_records: exact, not a cached end
        (5, 0, 100, 500, 20, 1),  # a long poll that knows of some records: exact too
        (None, 0, 1, 500, 20, 1),  # never asked
        (5, 5, 100, 500, 5, 0),  # a long poll that knows of nothing new: parks, asks nothing
        (5, 5, 100, 0, 20, 1),  # ... a short poll asks
        (200, 0, 100, 0, 200, 0),  # a backlog of at least max_records: no round trip
    ],
)
def test_an_acquisition_sees_the_exact_log_end(
    known: int | None, speo: int, max_records: int, max_wait_ms: int, end: int, asked: int
) -> None:
    offsets = _Ends(known, broker=20 if known is None or known < 20 else known)
    fetcher = ShareFetcher(
        cast(Any, SimpleNamespace(log_offsets=offsets)),
        TOPIC,
        cast(Any, None),
        cast(Any, None),
        cast(Any, None),
    )
    request = SimpleNamespace(max_records=max_records, max_wait_ms=max_wait_ms)
    got = run(fetcher._log_end(TP, cast(Any, request), speo))
    assert (got, offsets.asked) == (end, asked)
