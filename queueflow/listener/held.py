"""The records a Kafka-protocol member's share session holds: acquired offsets the listener
returned to the client that it has not acknowledged yet, so that they can be released when the
client's connection closes (Kafka 4.x ties a share session to the connection that opened it:
on disconnect the broker releases the member's acquired records, KIP-932 "Share sessions").
Pure."""

from __future__ import annotations

from bisect import bisect_left

from queueflow.structs import TopicPartition

__all__ = ["HeldRecords"]


class HeldRecords:
    """Per share-partition, the offsets held as sorted, disjoint ``[first, last]`` runs
    (inclusive). Each ShareFetch answer adds one run or a few, each acknowledgement cuts its
    range out, so the runs stay few: costs are linear in the runs of one share-partition."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[TopicPartition, list[list[int]]] = {}

    def add(self, tp: TopicPartition, first: int, last: int) -> None:
        """``first..last`` (inclusive) was returned to the client, acquired for this member."""
        runs = self._runs.setdefault(tp, [])
        if not runs or first > runs[-1][1] + 1:  # answers mostly come in offset order
            runs.append([first, last])
            return
        if first == runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], last)
            return
        self.remove(tp, first, last)  # out of order: cut, insert, merge neighbours
        runs = self._runs.setdefault(tp, [])
        i = bisect_left(runs, [first, last])
        runs.insert(i, [first, last])
        merged: list[list[int]] = []
        for run in runs:
            if merged and run[0] <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], run[1])
            else:
                merged.append(run)
        runs[:] = merged

    def remove(self, tp: TopicPartition, first: int, last: int) -> None:
        """``first..last`` was acknowledged (or is no longer held): cut it out."""
        runs = self._runs.get(tp)
        if not runs:
            return
        if runs[0][0] >= first and runs[0][1] <= last and len(runs) == 1:
            del self._runs[tp]  # the whole answer acknowledged: the common case
            return
        kept: list[list[int]] = []
        for lo, hi in runs:
            if hi < first or lo > last:
                kept.append([lo, hi])
                continue
            if lo < first:
                kept.append([lo, first - 1])
            if hi > last:
                kept.append([last + 1, hi])
        if kept:
            runs[:] = kept
        else:
            del self._runs[tp]

    def runs(self) -> dict[TopicPartition, list[tuple[int, int]]]:
        """Every held run, ``tp -> [(first, last), ...]`` in offset order."""
        return {tp: [(lo, hi) for lo, hi in runs] for tp, runs in self._runs.items()}

    def __len__(self) -> int:
        """How many offsets are held."""
        return sum(hi - lo + 1 for runs in self._runs.values() for lo, hi in runs)
