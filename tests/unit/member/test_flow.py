"""Share-agent flow control (``queueflow.member.flow``), pure: batch sizes and back-off."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from queueflow.member.flow import Backoff, FlowControl


@given(
    concurrency=st.integers(1, 64),
    max_poll=st.integers(1, 10_000),
    handler_s=st.floats(1e-6, 10.0),
    cycle_s=st.floats(1e-4, 10.0),
    lock_s=st.floats(1.0, 3600.0),
)
def test_high_water_stays_within_its_bounds(
    concurrency: int, max_poll: int, handler_s: float, cycle_s: float, lock_s: float
) -> None:
    flow = FlowControl(concurrency, max_poll, lock_s)
    flow.handler_s, flow.fetch_cycle_s = handler_s, cycle_s
    rate = concurrency / handler_s
    assert flow.high_water >= 2 * concurrency
    assert flow.high_water <= max(2 * concurrency, max_poll, int(rate * lock_s / 2))
    assert flow.high_water <= max(2 * concurrency, int(rate * lock_s / 2))


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
