"""A RELEASE with a delay: :func:`release` (``queueflow.release``) and :class:`Release`.

``return queueflow.release(delay=30)`` from a handler (or ``Result(outcome=...)``, a yielded
outcome, a batch element, ``ShareConsumer.acknowledge(record, release(30))``) RELEASEs the
record so that it is Available again only 30 seconds later; until then the leader holds it
(docs/concepts.md "Delayed redelivery"). The delay is durable: a new leader keeps it.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

from queueflow.errors import ConfigurationError
from queueflow.settings import int_default
from queueflow.structs import AcknowledgeType

__all__ = ["Release", "delay_of", "kind_of", "release", "release_options"]


@dataclass(frozen=True, slots=True)
class Release:
    """RELEASE, Available again ``delay_ms`` ms after the acknowledgement (see
    :func:`release`). Accepted wherever ``RELEASE`` is."""

    delay_ms: int

    @property
    def kind(self) -> AcknowledgeType:
        """``AcknowledgeType.RELEASE``."""
        return AcknowledgeType.RELEASE


def release(delay: float | datetime.timedelta, *, max_delay_ms: int | None = None) -> Release:
    """RELEASE the record, to be delivered again no sooner than ``delay`` from now.

    Args:
        delay: seconds (``int``/``float``) or a :class:`datetime.timedelta`; rounded up to
            whole milliseconds. 0 is an ordinary RELEASE (the group's back-off policy, if
            any, still applies: ``share.redelivery.backoff.ms``).
        max_delay_ms: the bound to check against (default: the default of
            ``queueflow.redelivery.max.delay.ms``, 12 hours); the leader checks its own.

    Raises:
        ConfigurationError: ``delay`` is not a number or timedelta, is negative, not finite,
            or above the maximum; the message names the bound and its setting.
    """
    if isinstance(delay, datetime.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise ConfigurationError(
            f"release delay {delay!r} ({type(delay).__name__}): give seconds as a number or a "
            "datetime.timedelta"
        )
    top = int_default("queueflow.redelivery.max.delay.ms") if max_delay_ms is None else max_delay_ms
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(
            f"release delay {delay!r} is not allowed: it must be >= 0 seconds (and at most "
            f"{top / 1000:g} s, queueflow.redelivery.max.delay.ms)"
        )
    ms = math.ceil(seconds * 1000)
    if ms > top:
        raise ConfigurationError(
            f"release delay {delay!r} ({ms} ms) is above the maximum of {top} ms "
            f"({top / 3_600_000:g} h, queueflow.redelivery.max.delay.ms); release with a shorter "
            "delay, or park the record elsewhere"
        )
    return Release(ms)


def release_options(
    kind: AcknowledgeType | Release,
    delay: float | datetime.timedelta | None,
    max_delay_ms: int,
) -> tuple[AcknowledgeType, int]:
    """``ShareConsumer.acknowledge``'s ``kind`` and ``delay=`` as (acknowledge type, delay in
    ms), checked against ``max_delay_ms`` (``queueflow.redelivery.max.delay.ms``).

    Raises:
        ConfigurationError: a delay with another type than RELEASE, or a bad delay (see
            :func:`release`).
    """
    delay_ms = 0
    if isinstance(kind, Release):
        delay_ms = kind.delay_ms
        kind = AcknowledgeType.RELEASE
    if delay is not None:
        if kind is not AcknowledgeType.RELEASE:
            raise ConfigurationError(
                f"delay={delay!r} applies to RELEASE only, not to {kind!r}; acknowledge without "
                "a delay"
            )
        delay_ms = release(delay, max_delay_ms=max_delay_ms).delay_ms
    elif delay_ms > max_delay_ms:
        release(delay_ms / 1000, max_delay_ms=max_delay_ms)
    return kind, delay_ms


def kind_of(value: Any) -> Any:
    """``RELEASE`` for a :class:`Release`, else ``value`` unchanged."""
    return AcknowledgeType.RELEASE if type(value) is Release else value


def delay_of(value: Any) -> int:
    """The delay (ms) of a :class:`Release`, of a ``Result`` whose outcome is one, or of an
    async generator's yields holding one; else 0."""
    if type(value) is Release:
        return value.delay_ms
    outcome = getattr(value, "outcome", None)
    if type(outcome) is Release:
        return outcome.delay_ms
    if isinstance(value, list):  # an async generator's Yielded
        for item in value:
            if type(item) is Release:
                return item.delay_ms
    return 0
