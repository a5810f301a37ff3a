"""``simple``: KIP-932's SimpleAssignor, the default: Kafka's final SimpleAssignor behaviour, as
a pure function.

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

from queueflow.engine.assignors._shared import capacities, even_quotas, fill, one_each
from queueflow.engine.assignors.base import AssignmentSpec
from queueflow.structs import TopicPartition

__all__ = ["SimpleAssignor", "assign"]


class SimpleAssignor:
    """Kafka's final SimpleAssignor: balance first (assignment sizes differ by at most one;
    with more members than partitions each partition is shared by ``floor`` or ``ceil`` of M/P
    members), then stickiness. Ignores lag and racks. Every member supports it."""

    name = "simple"

    def assign(self, spec: AssignmentSpec) -> dict[str, list[TopicPartition]]:
        """Member id → its sorted share-partitions (:func:`assign`)."""
        return assign(
            {m: s.subscribed_topics for m, s in spec.members.items()},
            spec.partitions,
            {m: s.previous for m, s in spec.members.items()},
        )


def assign(
    members: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]] | None = None,
) -> dict[str, list[TopicPartition]]:
    """Assign share-partitions to members (see the module docstring).

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
    valid = set(tps)
    held = {m: [tp for tp in previous.get(m, ()) if tp in valid] for m in members}
    if len(members) > len(tps):
        # Each partition gets floor or ceil of M/P members; each member exactly one partition.
        return one_each(members, tps, held, even_quotas(tps, len(members)))
    # Each partition to exactly one member; sizes differ by at most one. The members that get
    # one extra are those with the fewest partitions of earlier topics (balance across topics),
    # then those already holding more of this topic (stickiness).
    order, capacity = capacities(members, len(tps), held, totals)
    owner: dict[TopicPartition, str] = {}
    for m in order:
        for tp in held[m]:
            if tp not in owner and capacity[m] > 0:
                owner[tp] = m
                capacity[m] -= 1
    return fill(order, capacity, tps, owner)
