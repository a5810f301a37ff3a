"""A clock that moves only when told to."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A :class:`~queueflow.clock.Clock` for tests: wall and monotonic time advance together,
    and only through :meth:`advance`.

    Args:
        start_ms: the initial wall-clock time in ms.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._start_ms = start_ms

    def now_ms(self) -> int:
        """Wall-clock time in ms."""
        return self._now_ms

    def monotonic(self) -> float:
        """Monotonic time in s (0 at construction)."""
        return (self._now_ms - self._start_ms) / 1000

    def advance(self, ms: int) -> int:
        """Move forward ``ms`` milliseconds; returns the new wall-clock time in ms.

        Raises:
            ValueError: ``ms`` is negative.
        """
        if ms < 0:
            raise ValueError(f"a clock doesn't go backwards (advance({ms}))")
        self._now_ms += ms
        return self._now_ms
