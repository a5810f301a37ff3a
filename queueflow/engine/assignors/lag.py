"""``lag``: more members on the share-partitions with more lag.

The lag of a share-partition is KIP-1226's: records not yet delivered to completion (log end
offset - SPSO - Acknowledged/Archived in flight), as its leader last reported it (see
:attr:`AssignmentSpec.lag`; unknown counts as 0).

* With more members than partitions, every share-partition gets one member, and each of the
  M - P others goes to the share-partition with the most lag per member so far (the D'Hondt
  method: lags 300/100/0 and 5 members give 3/1/1). Without lag it is SimpleAssignor's even
  split. Every member gets exactly one share-partition; members keep theirs where the new
  split allows (stickiness).
* With no more members than partitions, each share-partition goes to one member and the sizes
  differ by at most one (as SimpleAssignor); which member gets which balances the lag: the
  share-partitions, most lag first, go to the member with the least lag so far that has room,
  preferring the one that held it on a tie (so without lag it is sticky).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from queueflow.engine.assignors._shared import capacities, fill, one_each, per_topic
from queueflow.engine.assignors.base import AssignmentSpec
from queueflow.structs import TopicPartition

__all__ = ["LagAwareAssignor", "lag_quotas"]


def lag_quotas(
    tps: list[TopicPartition], n_members: int, lag: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Members per share-partition when ``n_members`` >= ``len(tps)`` > 0: one each, then each
    further member to the share-partition with the highest lag per member (ties: fewer
    members, then the lower partition). The quotas sum to ``n_members``."""
    quota = {tp: 1 for tp in tps}
    index = {tp: i for i, tp in enumerate(tps)}
    for _ in range(n_members - len(tps)):
        tp = max(
            tps,
            key=lambda t: (Fraction(max(lag.get(t, 0), 0), quota[t]), -quota[t], -index[t]),
        )
        quota[tp] += 1
    return quota


class LagAwareAssignor:
    """Lag-aware share-group assignor (``lag``); see the module docstring for the rules."""

    name = "lag"

    def assign(self, spec: AssignmentSpec) -> dict[str, list[TopicPartition]]:
        """Member id → its sorted share-partitions, weighted by ``spec.lag``."""
        lag = spec.lag

        def topic(
            members: list[str],
            tps: list[TopicPartition],
            held: dict[str, list[TopicPartition]],
            totals: Mapping[str, int],
        ) -> dict[str, list[TopicPartition]]:
            if len(members) > len(tps):
                return one_each(members, tps, held, lag_quotas(tps, len(members), lag))
            order, capacity = capacities(members, len(tps), held, totals)
            holder = {tp: m for m in members for tp in held[m]}
            load = dict.fromkeys(members, 0)
            count = dict.fromkeys(members, 0)
            owner: dict[TopicPartition, str] = {}
            for tp in sorted(tps, key=lambda t: (-max(lag.get(t, 0), 0), t.partition)):
                room = [m for m in order if capacity[m] > 0]
                m = min(room, key=lambda c: (load[c], holder.get(tp) != c, count[c], c))
                owner[tp] = m
                capacity[m] -= 1
                load[m] += max(lag.get(tp, 0), 0)
                count[m] += 1
            return fill(order, capacity, tps, owner)

        return per_topic(spec, topic)
