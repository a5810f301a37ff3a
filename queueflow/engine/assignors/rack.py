"""``rack``: members read share-partitions whose Kafka partition leader is in their rack.

Members set ``client.rack`` (KIP-848 heartbeats carry a RackId); the rack of each Kafka
partition's leader broker (``broker.rack``) comes from cluster metadata
(:attr:`AssignmentSpec.partition_racks`). A member fetches record payloads from the partition
leader, so a same-rack assignment keeps that traffic inside the rack (as KIP-881 does for
consumer groups). Balance comes first: the sizes are those of SimpleAssignor; the rack decides
who gets what.

* With no more members than partitions: members keep the share-partitions they held that are
  in their rack (or whose rack is unknown); free ones go to a same-rack member with room
  (the one with most room left); then members keep other held ones; the rest go by
  SimpleAssignor's order.
* With more members than partitions (each member gets one share-partition, each
  share-partition ``floor`` or ``ceil`` of M/P members): members keep a held one in their rack
  (or of unknown rack, if their rack has no more than its even share of members on it);
  the others take a share-partition in their rack if one has room, and otherwise the one with
  the fewest members of their own rack, so that the members of each rack are spread evenly
  over the share-partitions (a rack going down leaves no share-partition without members
  where that can be avoided). This is also all it does when partition racks are unknown (a
  cluster without ``broker.rack``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from queueflow.engine.assignors._shared import capacities, even_quotas, fill, per_topic
from queueflow.engine.assignors.base import AssignmentSpec
from queueflow.structs import TopicPartition

__all__ = ["RackAwareAssignor"]


class RackAwareAssignor:
    """Rack-aware share-group assignor (``rack``); see the module docstring for the rules."""

    name = "rack"

    def assign(self, spec: AssignmentSpec) -> dict[str, list[TopicPartition]]:
        """Member id → its sorted share-partitions, by ``rack_id`` and ``spec.partition_racks``."""
        racks = {m: s.rack_id for m, s in spec.members.items()}
        where = spec.partition_racks

        def match(m: str, tp: TopicPartition) -> bool:
            return bool(racks[m]) and where.get(TopicPartition(tp.topic, tp.partition)) == racks[m]

        def compatible(m: str, tp: TopicPartition) -> bool:
            return not racks[m] or not where.get(tp) or match(m, tp)

        def topic(
            members: list[str],
            tps: list[TopicPartition],
            held: dict[str, list[TopicPartition]],
            totals: Mapping[str, int],
        ) -> dict[str, list[TopicPartition]]:
            index = {tp: i for i, tp in enumerate(tps)}
            if len(members) > len(tps):
                quota = even_quotas(tps, len(members))
                out: dict[str, list[TopicPartition]] = {}
                on: dict[TopicPartition, Counter[str]] = {tp: Counter() for tp in tps}
                pending: list[str] = []
                # A rack's fair share of each share-partition: its members spread evenly.
                per_rack = Counter(racks[m] for m in members)
                fair = {r: -(-n // len(tps)) for r, n in per_rack.items()}

                def keeps(m: str, t: TopicPartition) -> bool:
                    spread = not racks[m] or match(m, t) or on[t][racks[m]] < fair[racks[m]]
                    return quota[t] > 0 and compatible(m, t) and spread

                for m in members:
                    kept = next((t for t in held[m] if keeps(m, t)), None)
                    if kept is None:
                        pending.append(m)
                    else:
                        quota[kept] -= 1
                        on[kept][racks[m]] += 1
                        out[m] = [kept]
                for m in pending:
                    tp = max(
                        (t for t in tps if quota[t] > 0),
                        key=lambda t: (
                            match(m, t),
                            -on[t][racks[m]] if racks[m] else 0,
                            t in held[m],
                            quota[t],
                            -index[t],
                        ),
                    )
                    quota[tp] -= 1
                    on[tp][racks[m]] += 1
                    out[m] = [tp]
                return out
            order, capacity = capacities(members, len(tps), held, totals)
            owner: dict[TopicPartition, str] = {}

            def take(tp: TopicPartition, m: str) -> None:
                owner[tp] = m
                capacity[m] -= 1

            for m in order:
                for tp in held[m]:
                    if tp not in owner and capacity[m] > 0 and compatible(m, tp):
                        take(tp, m)
            for tp in tps:
                if tp in owner:
                    continue
                same = [m for m in order if capacity[m] > 0 and match(m, tp)]
                if same:
                    take(tp, max(same, key=lambda m: (capacity[m], -order.index(m))))
            for m in order:
                for tp in held[m]:
                    if tp not in owner and capacity[m] > 0:
                        take(tp, m)
            return fill(order, capacity, tps, owner)

        return per_topic(spec, topic)
