"""The share-group assignor: Kafka's final SimpleAssignor behaviour, as a pure function.

KIP-932 "Share group membership" / Kafka 4.x ``SimpleHomogeneousAssignmentBuilder``:

* balance comes before stickiness: the assignment sizes of any two members differ by at most one;
* with no more members than partitions, each partition goes to exactly one member, as in a
  consumer group;
* with more members than partitions, each partition is shared by about members ÷ partitions
  members (``ceil`` or ``floor``), and every member gets one partition.

Among balanced assignments it keeps a member's previous partitions where it can (stickiness),
which keeps in-flight records with the member that acquired them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from queueflow.structs import TopicPartition


def assign(
    members: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]] | None = None,
) -> dict[str, list[TopicPartition]]:
    """Assign share-partitions to members.

    Args:
        members: member id → subscribed topic names.
        partitions: topic → partition count (topics unknown to the cluster are absent).
        previous: member id → its current assignment, for stickiness.

    Returns:
        member id → sorted list of (topic, partition). Every member appears, possibly with [].
    """
    previous = previous or {}
    result: dict[str, list[TopicPartition]] = {m: [] for m in members}
    topics = sorted({t for subs in members.values() for t in subs if t in partitions})
    for topic in topics:
        subscribers = sorted(m for m, subs in members.items() if topic in subs)
        tps = [TopicPartition(topic, p) for p in range(partitions[topic])]
        totals = {m: len(result[m]) for m in subscribers}
        for member, assigned in _assign_topic(subscribers, tps, previous, totals).items():
            result[member].extend(assigned)
    return {m: sorted(tps) for m, tps in result.items()}


def _assign_topic(
    members: list[str],
    tps: list[TopicPartition],
    previous: Mapping[str, Sequence[TopicPartition]],
    totals: Mapping[str, int],
) -> dict[str, list[TopicPartition]]:
    if not members or not tps:
        return {m: [] for m in members}
    n_members, n_parts = len(members), len(tps)
    valid = set(tps)
    held = {m: [tp for tp in previous.get(m, ()) if tp in valid] for m in members}
    if n_members > n_parts:
        # Each partition gets floor or ceil of M/P members; each member exactly one partition.
        return one_each(members, tps, held, even_quotas(tps, n_members))
    # Each partition to exactly one member; sizes differ by at most one. The members that get
    # one extra are those with the fewest partitions of earlier topics (balance across topics),
    # then those already holding more of this topic (stickiness).
    base, extra = divmod(n_parts, n_members)
    order = sorted(members, key=lambda m: (totals.get(m, 0), -len(held[m]), m))
    capacity = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    owner: dict[TopicPartition, str] = {}
    for m in order:
        for tp in held[m]:
            if tp not in owner and capacity[m] > 0:
                owner[tp] = m
                capacity[m] -= 1
    return fill(order, capacity, tps, owner)


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
