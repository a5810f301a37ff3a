"""The two rules that keep a share-partition from being loaded out of an incomplete or
overwritten store (docs/architecture.md "Standby stores and late snapshots"):
``store_rebuild_needed`` (a store taken over is rebuilt from the changelog) and
``snapshot_replaces`` (a late snapshot of a lower state epoch never replaces a higher one)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from queueflow.engine.fencing import generations_continuous, snapshot_replaces, store_rebuild_needed

generations = st.integers(min_value=0, max_value=50)
epochs = st.tuples(st.integers(min_value=0, max_value=20), st.integers(min_value=0, max_value=20))


def test_a_standby_store_taken_over_is_rebuilt() -> None:
    # The standby was not active in generation 3; it is in generation 4.
    assert store_rebuild_needed(False, 3, 4)


def test_a_store_kept_by_its_owner_through_consecutive_generations_is_not_rebuilt() -> None:
    assert not store_rebuild_needed(True, 3, 4)
    assert not store_rebuild_needed(True, 4, 4)  # the same assignment callback again


def test_a_store_owned_before_a_missed_generation_is_rebuilt() -> None:
    # Active in generation 1, cut off, back in generation 3: someone else led it in 2.
    assert store_rebuild_needed(True, 1, 3)


def test_the_first_assignment_of_a_worker_rebuilds() -> None:
    # A restarted worker's store on disk is whatever it was; nothing proves it whole.
    assert store_rebuild_needed(False, None, 1)


@given(st.booleans(), st.none() | generations, generations)
def test_rebuild_unless_owned_continuously(
    was_active: bool, previous: int | None, current: int
) -> None:
    kept = was_active and generations_continuous(previous, current)
    assert store_rebuild_needed(was_active, previous, current) is (not kept)


def test_the_cut_leaders_late_snapshot_does_not_replace_its_successors() -> None:
    successor = (1, 0)  # the successor restored the state at the next state epoch
    late = (0, 7)  # the old leader's snapshot epoch can be higher: it does not count
    assert not snapshot_replaces(successor, late)


def test_a_later_snapshot_of_the_same_or_a_higher_state_epoch_replaces() -> None:
    assert snapshot_replaces((1, 0), (1, 1))
    assert snapshot_replaces((1, 3), (2, 0))
    assert snapshot_replaces((1, 3), (1, 3))  # replay is idempotent


def test_an_older_snapshot_of_one_leader_does_not_replace_a_newer_one() -> None:
    assert not snapshot_replaces((1, 3), (1, 2))


def test_nothing_held_or_unreadable_never_blocks_a_snapshot() -> None:
    assert snapshot_replaces(None, (0, 0))  # a new (or re-created) share-partition
    assert snapshot_replaces((3, 1), None)  # unreadable: the load reports it as corrupt


@given(st.lists(epochs, min_size=1, max_size=30))
def test_applying_in_any_order_keeps_the_highest_snapshot(arrivals: list[tuple[int, int]]) -> None:
    held: tuple[int, int] | None = None
    for incoming in arrivals:
        if snapshot_replaces(held, incoming):
            held = incoming
    assert held == max(arrivals)


@given(epochs, epochs)
def test_exactly_one_of_two_different_snapshots_replaces_the_other(
    a: tuple[int, int], b: tuple[int, int]
) -> None:
    if a != b:
        assert snapshot_replaces(a, b) != snapshot_replaces(b, a)
    else:
        assert snapshot_replaces(a, b) and snapshot_replaces(b, a)
