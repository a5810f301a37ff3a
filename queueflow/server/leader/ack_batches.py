"""A ShareFetch's acknowledgements as engine batches, with their RELEASE options.

The wire carries acknowledgements as ``(first, last, types)`` ranges and the RELEASE options
keyed by offset ranges (:class:`~queueflow.protocol.messages.ShareFetchRequest`
``ack_delay_ms``, ``ack_undelivered``). :func:`ack_batches` splits the ranges where an
option changes, so each :class:`~queueflow.engine.partition.AcknowledgementBatch` carries one
``delay_ms`` and one ``undelivered`` (docs/concepts.md "Delayed redelivery", "Delivery
counts"). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from queueflow.engine.partition import AcknowledgementBatch
from queueflow.structs import AcknowledgeType

__all__ = ["ack_batches"]


def _option_at(offset: int, ranges: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    for r in ranges:
        if r[0] <= offset <= r[1]:
            return r
    return None


def ack_batches(
    acks: Sequence[tuple[int, int, tuple[int, ...]]],
    delays: Sequence[tuple[int, int, int]] = (),
    undelivered: Sequence[tuple[int, int]] = (),
) -> list[AcknowledgementBatch]:
    """Engine batches of wire ``acks`` with the options of ``delays`` / ``undelivered``.

    Without options each wire range is one batch (the common case, no per-offset work).

    Raises:
        ValueError: an unknown acknowledge type (the caller answers INVALID_REQUEST).

    >>> [(b.first_offset, b.last_offset, b.delay_ms) for b in ack_batches(
    ...     [(0, 3, (2,))], delays=[(2, 5, 1000)])]
    [(0, 1, 0), (2, 3, 1000)]
    """
    if not delays and not undelivered:
        return [
            AcknowledgementBatch(first, last, tuple(AcknowledgeType(t) for t in types))
            for first, last, types in acks
        ]
    out: list[AcknowledgementBatch] = []
    for first, last, types in acks:
        kinds = tuple(AcknowledgeType(t) for t in types)
        start = first
        key: tuple[int, bool] | None = None
        for offset in range(first, last + 2):
            here: tuple[int, bool] | None = None
            if offset <= last:
                delay = _option_at(offset, delays)
                here = (delay[2] if delay else 0, _option_at(offset, undelivered) is not None)
            if offset == first:
                key = here
                continue
            if offset <= last and here == key:
                continue
            assert key is not None
            part = kinds if len(kinds) == 1 else kinds[start - first : offset - first]
            out.append(AcknowledgementBatch(start, offset - 1, part, key[0], key[1]))
            start, key = offset, here
    return out
