"""The lock clock of an exactly-once leader (queueflow.server.leader.ack_clock): ``ack_safe_ms``
is the latest sample time whose high watermark the reader's position has passed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from queueflow.server.leader.ack_clock import NOT_CAUGHT_UP_MS, AckClock


def test_nothing_elapses_until_the_reader_caught_up_once() -> None:
    clock = AckClock()
    clock.reset(0)
    assert clock.expiry_ms(0, 5000) == NOT_CAUGHT_UP_MS
    clock.sampled(0, 1000, 7)
    assert clock.advanced(0, 6) is None  # one message still unread
    assert clock.expiry_ms(0, 5000) == NOT_CAUGHT_UP_MS
    assert clock.advanced(0, 7) == 1000
    assert clock.expiry_ms(0, 5000) == 1000
    assert clock.expiry_ms(0, 900) == 900  # never ahead of the wall clock
    assert clock.lag_ms(0, 5000) == 4000


def test_an_open_transaction_holds_the_clock_and_later_samples_pass_at_once() -> None:
    clock = AckClock()
    clock.reset(0)
    clock.sampled(0, 100, 0)
    clock.advanced(0, 0)
    for t in (200, 300, 400):
        clock.sampled(0, t, 5)  # an open transaction from offset 3: the position stays at 3
        clock.advanced(0, 3)
    assert clock.safe_ms(0) == 100
    clock.sampled(0, 500, 6)
    assert clock.advanced(0, 6) == 500  # committed (or aborted): its marker passed


def test_a_reset_partition_starts_over_and_a_forgotten_one_is_unknown() -> None:
    clock = AckClock()
    clock.sampled(1, 10, 0)
    clock.advanced(1, 0)
    assert clock.safe_ms(1) == 10
    clock.reset(1)
    assert clock.safe_ms(1) is None
    clock.forget(1)
    assert clock.advanced(1, 100) is None and clock.lag_ms(1, 50) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 3), st.integers(0, 4)),
        min_size=1,
        max_size=60,
    )
)
def test_the_safe_time_is_the_latest_sample_passed_and_never_moves_back(
    rounds: list[tuple[int, int, int]],
) -> None:
    """Against a model: every sample ``(T, hw)`` with ``hw <= position`` makes ``T`` safe; the
    safe time is the latest such ``T`` and is monotonic."""
    clock = AckClock()
    clock.reset(0)
    now, hw, position = 0, 0, 0
    samples: list[tuple[int, int]] = []
    last = None
    for dt, produced, read in rounds:
        now += dt
        hw += produced
        clock.sampled(0, now, hw)
        samples.append((now, hw))
        position = min(hw, position + read)
        safe = clock.advanced(0, position)
        passed = [t for t, end in samples if end <= position]
        assert safe == (max(passed) if passed else None)
        assert last is None or (safe is not None and safe >= last)
        last = safe
