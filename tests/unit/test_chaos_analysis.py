"""How ``make chaos`` classifies a healthy record the leaders Archived at the delivery count
limit after deliveries no handler saw (KIP-932 counts a delivery when the record is acquired):
with a dead-letter topic and a crash nearby it is ``archived_after_crashes`` (it is in the DLQ,
which the dead-letter check verifies), otherwise ``lost``."""

from __future__ import annotations

from pathlib import Path

from examples.chaos.analysis import analyse
from examples.chaos.config import ChaosConfig
from examples.chaos.leader_state import ARCHIVED_AT_LIMIT
from examples.chaos.ledger import Ledger
from examples.chaos.timeline import Event

T0 = 1_800_000_000.0


def _analyse(dead_letters: bool, kill_at: float | None) -> dict[str, object]:
    config = ChaosConfig(records=2, partitions=1, poison_mod=1000, dead_letters=dead_letters)
    ledger = Ledger(Path("/nonexistent"))
    ledger.lines[0] = [{"t": T0, "o": "ACCEPT", "dc": 1, "p": 0, "off": 0, "pid": 10}]
    # id 1: RELEASEd by its handler at deliveries 1..3; deliveries 4 and 5 were never handled
    ledger.lines[1] = [
        {"t": T0 + i, "o": "RELEASE", "dc": i, "p": 0, "off": 1, "pid": 10} for i in (1, 2, 3)
    ]
    events = [Event(T0 - 10, "start", 0, "all", 10)]
    if kill_at is not None:
        events.append(Event(kill_at, "kill", 0, "all", 10))
    return analyse(config, [(0, 0), (0, 1)], ledger, events, {1: ARCHIVED_AT_LIMIT})


def test_archived_after_a_crash_with_a_dlq_is_not_lost() -> None:
    summary = _analyse(dead_letters=True, kill_at=T0 + 3.5)
    assert (summary["lost"], summary["archived_after_crashes"]) == (0, 1)


def test_without_a_dlq_it_is_lost() -> None:
    summary = _analyse(dead_letters=False, kill_at=T0 + 3.5)
    assert (summary["lost"], summary["lost_archived_unprocessed"]) == (1, 1)
    assert summary["archived_after_crashes"] == 0


def test_without_a_crash_to_explain_the_unseen_deliveries_it_is_lost() -> None:
    summary = _analyse(dead_letters=True, kill_at=None)
    assert (summary["lost"], summary["archived_after_crashes"]) == (1, 0)
