"""What the leader reports about its share-partitions: the gauges' samples, KIP-1226 lag for
the ``lag`` assignor, and the Archived records counted as they happen."""

from __future__ import annotations

from collections.abc import Iterable

from queueflow.engine.partition import SharePartition
from queueflow.engine.reserved import DELAYED_OWNER
from queueflow.metrics import SharePartitionSample
from queueflow.server.context import LogOffsetsSource
from queueflow.server.durable import DurableSharePartition
from queueflow.structs import TopicPartition

__all__ = ["ArchivedCounter", "lag_report", "samples"]

Live = list[tuple[tuple[str, int], DurableSharePartition]]


def lag_report(
    live: Live, topic: str, offsets: LogOffsetsSource, partitions: Iterable[int]
) -> list[tuple[str, int, int]]:
    """``(group, partition, lag)`` of the ``live`` share-partitions of ``partitions``, sorted:
    KIP-1226's lag (records past the SPEO up to the last known log end, plus the Available and
    Acquired in flight). Share-partitions whose log end is not known yet are left out."""
    wanted = set(partitions)
    out = []
    for (group, p), durable in live:
        end = offsets.known_end(TopicPartition(topic, p))
        if p not in wanted or end is None:
            continue
        engine = durable.engine
        lag = max(end - engine.end_offset, 0) + engine.available_count + engine.acquired_count
        out.append((group, p, lag))
    return sorted(out)


def samples(live: Live, topic: str, offsets: LogOffsetsSource) -> list[SharePartitionSample]:
    """The state of each ``live`` share-partition for the share-partition gauges; the log end
    is the last known high watermark. O(runs)."""
    out = []
    for (group, partition), durable in live:
        engine = durable.engine
        counts = dict.fromkeys(("available", "acquired", "acknowledged", "archived"), 0)
        for run in engine.in_flight():
            # a delayed record counts as Available, as in the admin answers
            name = "available" if run.member_id == DELAYED_OWNER else run.state.name.lower()
            counts[name] += run.last_offset - run.first_offset + 1
        end = offsets.known_end(TopicPartition(topic, partition))
        lag = None
        if end is not None:
            end = max(end, engine.end_offset)
            complete = counts["acknowledged"] + counts["archived"]
            lag = max(end - engine.start_offset - complete, 0)
        out.append(
            SharePartitionSample(
                group, topic, partition, engine.start_offset, engine.end_offset, counts, end, lag
            )
        )
    return out


class ArchivedCounter:
    """The progress of each share-partition's Archived count since it was last counted (a
    restored or resumed share-partition has a new engine, which counts from 0)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], tuple[SharePartition | None, int]] = {}

    def advance(self, durable: DurableSharePartition) -> int:
        """Records ``durable`` Archived since the last call."""
        engine = durable.engine
        key = (durable.group, durable.partition)
        seen_engine, seen = self._seen.get(key, (None, 0))
        if seen_engine is not engine:
            seen = 0
        self._seen[key] = (engine, engine.archived_total)
        return max(engine.archived_total - seen, 0)
