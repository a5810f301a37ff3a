"""When a leader announces (:func:`queueflow.server.endpoint._announce_due`): at once on a
change of its live partitions or leader epoch, within ``ANNOUNCE_INTERVAL_S`` of a lag change,
and otherwise only every ``ANNOUNCE_KEEPALIVE_S`` (an idle leader is quiet)."""

from __future__ import annotations

from queueflow.server.coordinator import LAG_TTL_MS, LEADER_ADDRESS_TTL_MS
from queueflow.server.endpoint import ANNOUNCE_INTERVAL_S, ANNOUNCE_KEEPALIVE_S, _announce_due

LAG = [("g", 0, 5)]
LAST = (3, (0, 1), LAG, 100.0)


def test_the_first_announcement_and_a_changed_leadership_are_due_at_once() -> None:
    assert _announce_due(None, 3, (0, 1), LAG, 0.0)
    assert _announce_due(LAST, 4, (0, 1), LAG, 100.1)  # a new leader epoch
    assert _announce_due(LAST, 3, (0,), LAG, 100.1)  # a partition no longer live


def test_an_unchanged_announcement_waits_for_the_keepalive() -> None:
    assert not _announce_due(LAST, 3, (0, 1), LAG, 100.0 + ANNOUNCE_INTERVAL_S)
    assert not _announce_due(LAST, 3, (0, 1), LAG, 100.0 + ANNOUNCE_KEEPALIVE_S - 0.1)
    assert _announce_due(LAST, 3, (0, 1), LAG, 100.0 + ANNOUNCE_KEEPALIVE_S)


def test_a_changed_lag_is_announced_within_the_interval() -> None:
    lag = [("g", 0, 6)]
    assert not _announce_due(LAST, 3, (0, 1), lag, 100.0 + ANNOUNCE_INTERVAL_S - 0.1)
    assert _announce_due(LAST, 3, (0, 1), lag, 100.0 + ANNOUNCE_INTERVAL_S)


def test_the_coordinator_keeps_what_was_announced_for_three_keepalives() -> None:
    assert LEADER_ADDRESS_TTL_MS >= 3 * ANNOUNCE_KEEPALIVE_S * 1000
    assert LAG_TTL_MS >= 3 * ANNOUNCE_KEEPALIVE_S * 1000
