"""How many records a ``ShareConsumer`` asks each share-partition for (KIP-1206
``share.acquire.mode``): pure.

``batch_optimized`` (Kafka's default) asks every share-partition for up to ``max.poll.records``,
so one poll may return up to that many per share-partition. ``record_limit`` keeps a poll
within ``max.poll.records`` across all share-partitions: the records still to be returned (from
fetches under way) and those asked for are never more than the limit, so the budget is split
among the share-partitions about to be fetched (:func:`split_budget`), turn by turn so that no
share-partition is always the one left out when the budget is smaller than their number.

KIP-1206: https://cwiki.apache.org/confluence/display/KAFKA/KIP-1206%3A+Strict+max+fetch+records+in+share+fetch
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["split_budget"]

_T = TypeVar("_T")


def split_budget(budget: int, partitions: Sequence[_T], turn: int = 0) -> dict[_T, int]:
    """Split ``budget`` records among ``partitions`` as evenly as can be.

    Args:
        budget: records that may still be asked for (``max.poll.records`` minus those returned
            or asked for already); < 1 gives every share-partition 0.
        partitions: the share-partitions about to be fetched, in a stable order.
        turn: which share-partition is first in line for the remainder (it rotates from one
            poll to the next, e.g. a poll counter).

    Returns:
        ``{partition: records to ask for}``, each >= 0, summing to at most ``budget`` (exactly
        ``budget`` when there are partitions); a partition given 0 is not fetched this time.
    """
    n = len(partitions)
    if n == 0:
        return {}
    budget = max(budget, 0)
    share, extra = divmod(budget, n)
    start = turn % n
    out: dict[_T, int] = {}
    for i, tp in enumerate(partitions):
        position = (i - start) % n  # 0 for the one first in line
        out[tp] = share + (1 if position < extra else 0)
    return out
