"""``simple``: KIP-932's SimpleAssignor, the default (see :mod:`queueflow.engine.assignor`)."""

from __future__ import annotations

from queueflow.engine.assignor import assign
from queueflow.engine.assignors.base import AssignmentSpec
from queueflow.structs import TopicPartition

__all__ = ["SimpleAssignor"]


class SimpleAssignor:
    """Kafka's final SimpleAssignor: balance first (assignment sizes differ by at most one;
    with more members than partitions each partition is shared by ``floor`` or ``ceil`` of M/P
    members), then stickiness. Ignores lag and racks. Every member supports it."""

    name = "simple"

    def assign(self, spec: AssignmentSpec) -> dict[str, list[TopicPartition]]:
        """Member id → its sorted share-partitions (:func:`queueflow.engine.assignor.assign`)."""
        return assign(
            {m: s.subscribed_topics for m, s in spec.members.items()},
            spec.partitions,
            {m: s.previous for m, s in spec.members.items()},
        )
