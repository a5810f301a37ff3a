"""Clocks, injected wherever time is read, so that leaders, coordinators and members run under a
:class:`~queueflow.testing.FakeClock` in unit tests.

Two readings, with their units in the names:

* :meth:`Clock.now_ms`: wall-clock ms. Acquisition-lock deadlines, session deadlines and request
  deadlines are compared across processes, so they use the wall clock (KIP-932 lock durations
  are wall-clock durations too).
* :meth:`Clock.monotonic`: monotonic seconds, for what one process measures of itself (fetch
  round trips, back-offs, the stall guard).
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    """What queueflow reads time from."""

    def now_ms(self) -> int:
        """Wall-clock time in ms since the epoch."""
        ...

    def monotonic(self) -> float:
        """Monotonic time in seconds (only differences mean anything)."""
        ...


class SystemClock:
    """The real clocks: :func:`time.time` and :func:`time.monotonic`."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        return time.monotonic()


#: The clock used when none is injected.
SYSTEM_CLOCK: Clock = SystemClock()
