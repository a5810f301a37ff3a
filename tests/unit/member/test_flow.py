"""Share-agent flow control (``queueflow.member.flow``), pure: batch sizes and back-off."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueflow.member.flow import Backoff, FlowControl, acquisition_limit


@given(
    rate=st.floats(0.0, 1e6),
    lock_s=st.floats(0.0, 3600.0),
    concurrency=st.integers(1, 64),
    max_poll=st.integers(1, 10_000),
    cycle_s=st.floats(0.0, 10.0),
    lock_use=st.floats(0.05, 1.0),
)
def test_the_acquisition_limit_never_exceeds_what_starts_within_the_lock_and_is_at_least_one(
    rate: float, lock_s: float, concurrency: int, max_poll: int, cycle_s: float, lock_use: float
) -> None:
    limit = acquisition_limit(rate, lock_s, concurrency, max_poll, cycle_s, lock_use)
    assert 1 <= limit <= max_poll
    assert limit <= max(1, rate * lock_s * lock_use)


@given(
    rate=st.floats(0.01, 1e5),
    slower=st.floats(1.0, 1000.0),
    lock_s=st.floats(0.1, 600.0),
    concurrency=st.integers(1, 64),
    max_poll=st.integers(1, 10_000),
)
def test_a_slower_rate_never_raises_the_limit(
    rate: float, slower: float, lock_s: float, concurrency: int, max_poll: int
) -> None:
    fast = acquisition_limit(rate, lock_s, concurrency, max_poll)
    slow = acquisition_limit(rate / slower, lock_s, concurrency, max_poll)
    assert slow <= fast


@pytest.mark.parametrize(
    ("rate", "lock_s", "concurrency", "max_poll", "expected"),
    [
        (10.0, 2.0, 4, 500, 8),  # 100 ms handlers on 4 tasks, 2 s locks: busy target 8
        (10.0, 2.0, 1, 500, 2),  # one task: two records (one running, one next)
        (4.0, 2.0, 4, 500, 4),  # slower than the busy target: 4 start within half the lock
        (0.2, 2.0, 2, 500, 1),  # a handler slower than the lock: one record at a time
        (1e5, 30.0, 2, 500, 500),  # fast handlers: max.poll.records
    ],
)
def test_the_acquisition_limit_for_some_rates(
    rate: float, lock_s: float, concurrency: int, max_poll: int, expected: int
) -> None:
    assert acquisition_limit(rate, lock_s, concurrency, max_poll, fetch_cycle_s=0.005) == expected


def test_high_water_follows_a_slowdown_within_a_few_calls() -> None:
    flow = FlowControl(concurrency=4, max_poll_records=500, lock_s=2.0)
    now = 0.0
    for _ in range(200):  # 1 ms handlers
        now += 0.00025
        flow.observe_handled(0.001, 1, now, waiting=10)
    assert flow.high_water >= 60  # enough to keep 4 tasks busy across a fetch cycle
    for _ in range(4):  # now 100 ms each: 40 records/s on 4 tasks, 40 in half the lock
        now += 0.025
        flow.observe_handled(0.1, 1, now, waiting=10)
    assert flow.high_water <= 40


def test_the_measured_rate_caps_the_nominal_one_when_calls_do_not_overlap() -> None:
    # Handlers that block the event loop: 4 tasks of 100 ms calls, but one call at a time.
    flow = FlowControl(concurrency=4, max_poll_records=500, lock_s=2.0)
    flow.fetch_cycle_s = 0.4  # fetches wait behind the blocked loop too
    now = 0.0
    for _ in range(20):
        now += 0.1
        flow.observe_handled(0.1, 1, now, waiting=30)
    assert flow.rate == pytest.approx(10.0, rel=0.05)
    assert flow.high_water in (9, 10)  # 10 records/s x 2 s x 0.5; the nominal 40/s: 40


def test_the_measured_rate_drifts_back_to_the_nominal_one_while_no_record_waits() -> None:
    flow = FlowControl(concurrency=4, max_poll_records=500, lock_s=2.0)
    now = 0.0
    for _ in range(10):
        now += 0.1
        flow.observe_handled(0.1, 1, now, waiting=5)
    low = flow.rate
    for _ in range(100):  # calls overlap again, the queue stays empty
        now += 0.1
        flow.observe_handled(0.1, 1, now, waiting=0)
    assert flow.rate > 3 * low


def test_start_delay_counts_the_records_ahead_at_the_rate() -> None:
    flow = FlowControl(concurrency=2, max_poll_records=500, lock_s=2.0)
    flow.handler_s = 0.1  # 20 records/s
    assert flow.start_delay_s(0) == pytest.approx(0.05)
    assert flow.start_delay_s(39) == pytest.approx(2.0)


def test_reserve_up_to_high_water_and_wake_at_half() -> None:
    flow = FlowControl(concurrency=2, max_poll_records=500, lock_s=30.0)
    flow.handler_s = 0.001  # fast handlers: large batches
    high = flow.high_water
    assert not flow.must_wait()
    assert flow.reserve() == high
    assert flow.must_wait()  # full: wait for room
    assert not flow.release(flow.outstanding - flow.refill_level - 1)  # still above half
    assert flow.release(1)  # down to half: the waiting fetch loop wakes
    assert flow.outstanding == flow.refill_level == high // 2


def test_slow_handlers_get_small_batches_that_finish_within_half_the_lock() -> None:
    flow = FlowControl(concurrency=4, max_poll_records=500, lock_s=2.0)
    flow.handler_s = 0.5  # 8 records/s: at most 8 in half the lock
    assert flow.high_water == 8
    flow.handler_s = 1.0  # 4 records/s: fewer than two per handler
    assert flow.high_water == 4


def test_an_idle_share_partition_s_fetch_takes_a_share_of_the_room_left_but_at_least_one() -> None:
    flow = FlowControl(concurrency=2, max_poll_records=500, lock_s=30.0)
    flow.handler_s = 0.001
    high = flow.high_water
    assert flow.idle_fetch_limit(fetches=4) == high // 8  # a share while the room is free
    flow.take(high - 3)
    assert flow.idle_fetch_limit(fetches=4) == 3  # no more than the room left
    flow.take(10)  # over the room (idle fetches already delivered)
    assert flow.idle_fetch_limit(fetches=4) == 1  # still one: never starved by a busy one


def test_backoff_doubles_on_empty_answers_up_to_its_limit_and_resets_on_records() -> None:
    backoff = Backoff(initial_s=0.005, idle_max_s=0.02, error_max_s=1.0)
    waits = []
    for now in range(5):
        backoff.observe("tp", float(now), delivered=0, wanted=10)
        waits.append(round(backoff.idle_until("tp") - now, 3))
    assert waits == [0.005, 0.01, 0.02, 0.02, 0.02]
    backoff.observe("tp", 10.0, delivered=3, wanted=10)
    backoff.observe("tp", 11.0, delivered=0, wanted=10)
    assert round(backoff.idle_until("tp") - 11.0, 3) == 0.005
    backoff.observe("ack-only", 0.0, delivered=0, wanted=0)  # nothing asked: no back-off
    assert backoff.idle_until("ack-only") == 0.0


def test_importing_the_engine_loads_no_third_party_module() -> None:
    code = (
        "import sys; before = set(sys.modules); import queueflow.engine; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(n for n in new if n not in sys.stdlib_module_names and n != 'queueflow'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
