"""Helpers the built-in assignors share: per-topic iteration, capacities and quotas that give
the SimpleAssignor's balance bounds, and the placement of members when they outnumber
partitions."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from queueflow.engine.assignors.base import AssignmentSpec
from queueflow.structs import TopicPartition

__all__ = ["TopicAssigner", "capacities", "even_quotas", "fill", "one_each", "per_topic"]

#: Assigns one topic: (subscribers sorted, its share-partitions, held, totals so far) → out.
TopicAssigner = Callable[
    [list[str], list[TopicPartition], dict[str, list[TopicPartition]], Mapping[str, int]],
    dict[str, list[TopicPartition]],
]


def per_topic(spec: AssignmentSpec, assign_topic: TopicAssigner) -> dict[str, list[TopicPartition]]:
    """Run ``assign_topic`` for every subscribed topic the cluster knows, in name order, and
    merge the results (every member appears, possibly with ``[]``; lists sorted)."""
    result: dict[str, list[TopicPartition]] = {m: [] for m in spec.members}
    names = sorted(
        {t for m in spec.members.values() for t in m.subscribed_topics if t in spec.partitions}
    )
    for topic in names:
        subscribers = sorted(m for m, s in spec.members.items() if topic in s.subscribed_topics)
        tps = [TopicPartition(topic, p) for p in range(spec.partitions[topic])]
        if not subscribers or not tps:
            continue
        valid = set(tps)
        held = {m: [tp for tp in spec.members[m].previous if tp in valid] for m in subscribers}
        totals = {m: len(result[m]) for m in subscribers}
        for member, assigned in assign_topic(subscribers, tps, held, totals).items():
            result[member].extend(assigned)
    return {m: sorted(tps) for m, tps in result.items()}


def capacities(
    members: Sequence[str],
    n_parts: int,
    held: Mapping[str, Sequence[TopicPartition]],
    totals: Mapping[str, int],
) -> tuple[list[str], dict[str, int]]:
    """With no more members than partitions: how many share-partitions each member gets
    (``floor`` or ``ceil`` of P/M). The extra ones go to members with the fewest partitions of
    earlier topics, then those holding more of this topic. Returns (that order, capacities)."""
    base, extra = divmod(n_parts, len(members))
    order = sorted(members, key=lambda m: (totals.get(m, 0), -len(held[m]), m))
    return order, {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}


def even_quotas(tps: Sequence[TopicPartition], n_members: int) -> dict[TopicPartition, int]:
    """With more members than partitions: members per share-partition, ``floor`` or ``ceil``
    of M/P (the first M mod P partitions get one more)."""
    n_parts = len(tps)
    return {
        tp: n_members // n_parts + (1 if i < n_members % n_parts else 0) for i, tp in enumerate(tps)
    }


def one_each(
    members: Sequence[str],
    tps: Sequence[TopicPartition],
    held: Mapping[str, Sequence[TopicPartition]],
    quota: dict[TopicPartition, int],
) -> dict[str, list[TopicPartition]]:
    """With more members than partitions, give each member exactly one share-partition: the
    first it held that still has ``quota`` (members wanted there) left, else the one with the
    most quota left (the earliest of equals). ``quota`` is consumed."""
    out: dict[str, list[TopicPartition]] = {}
    pending: list[str] = []
    for m in members:
        kept = next((tp for tp in held[m] if quota[tp] > 0), None)
        if kept is None:
            pending.append(m)
        else:
            quota[kept] -= 1
            out[m] = [kept]
    for m in pending:
        tp = max(tps, key=lambda t: quota[t])  # max() keeps the earliest of equals
        quota[tp] -= 1
        out[m] = [tp]
    return out


def fill(
    order: Sequence[str],
    capacity: dict[str, int],
    tps: Sequence[TopicPartition],
    owner: dict[TopicPartition, str],
) -> dict[str, list[TopicPartition]]:
    """Give the share-partitions without an owner to members in ``order`` up to their
    ``capacity`` (consumed), and return member → its share-partitions."""
    free = [tp for tp in tps if tp not in owner]
    for m in order:
        while capacity[m] > 0 and free:
            owner[free.pop(0)] = m
            capacity[m] -= 1
    out: dict[str, list[TopicPartition]] = {m: [] for m in order}
    for tp, m in owner.items():
        out[m].append(tp)
    return out
