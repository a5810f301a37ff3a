"""Browsing a share-partition: its records with their share states, without acquiring them
(docs/guide.md "Browsing"; as Pulsar's Reader or a RabbitMQ stream consumer looks into a
queue).

A browse reads two things and changes nothing:

* the share-partition's state as its leader persisted it (the snapshot and deltas in the
  ``<app>-share-state-<topic>-changelog`` table, replayed as a new leader restores them; KIP-932
  "Managing durable share-partition state"): each in-flight record's state, delivery count and,
  for an Acquired record, its lock owner and deadline;
* the records themselves, by offset, from the source topic (a group-less consumer, as members
  read acquired records).

Nothing is acquired and no delivery count changes: no request reaches a leader, so a browse can
run while members consume, or with no worker running. Records below the SPSO are Archived and
records at or after the SPEO Available with delivery count 0 (KIP-932 "In-flight records").
A share-partition the group has no state for yet shows no state (``None``): where its delivery
will start depends on ``share.auto.offset.reset``.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from queueflow.engine.group import ShareGroup
from queueflow.engine.group_config import ISOLATION_LEVEL
from queueflow.engine.state import RecordState, StateBatch, replay
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.protocol import group_codec
from queueflow.protocol import topics as internal
from queueflow.protocol.state_codec import decode_state, parse_state_key
from queueflow.structs import TopicPartition

__all__ = [
    "DEFAULT_BROWSE_RECORDS",
    "MAX_BROWSE_RECORDS",
    "BrowseSource",
    "BrowsedRecord",
    "LogRecord",
    "browse",
    "utc_text",
]

#: Records a browse returns per share-partition unless told otherwise, and at most.
DEFAULT_BROWSE_RECORDS = 100
MAX_BROWSE_RECORDS = 10_000
#: Owners of Acquired records that are the leader itself, not a member (durable extras of the
#: leader: a record waiting out a redelivery delay, one being written to a dead-letter topic).
_RESERVED_STATES = {
    "__delayed__": "AVAILABLE (delayed until {deadline})",
    "__dead_letter__": "ARCHIVING (dead letter)",
}


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A record as the source topic holds it (ms timestamps, raw bytes)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


@dataclass(frozen=True, slots=True)
class BrowsedRecord:
    """One record of a share-partition and its share state, as browsed.

    Attributes:
        topic / partition / offset: where it is.
        key / value / headers / timestamp: the record (raw bytes; timestamp in ms).
        state: ``AVAILABLE``, ``ACQUIRED``, ``ACKNOWLEDGED`` or ``ARCHIVED`` (KIP-932 record
            states); ``None`` when the group has no state for the share-partition yet.
        delivery_count: deliveries so far (0: never delivered).
        member_id: who holds the acquisition lock (``ACQUIRED`` only, else ``None``); an id
            starting with ``__`` is the leader itself (see :attr:`shown_state`).
        lock_deadline_ms: when that lock ends, wall-clock ms (``ACQUIRED`` only).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    state: str | None
    delivery_count: int
    member_id: str | None = None
    lock_deadline_ms: int | None = None

    @property
    def shown_state(self) -> str:
        """:attr:`state` as the admin views show it: a record the leader holds itself is
        ``AVAILABLE (delayed until <UTC time>)`` (a redelivery delay) or ``ARCHIVING (dead
        letter)``; no state is ``-``."""
        template = _RESERVED_STATES.get(self.member_id or "")
        if template is not None:
            return template.format(deadline=utc_text(self.lock_deadline_ms))
        return self.state or "-"


def utc_text(ms: int | None) -> str:
    """Wall-clock ``ms`` as ISO-8601 UTC with milliseconds (``-`` for ``None``)."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


class BrowseSource(Protocol):
    """What a browse reads (:meth:`~queueflow.member.context.MemberIO.browse_source`)."""

    async def table(self, topic: str) -> Mapping[bytes, bytes] | None:
        """The latest value of every key of the compacted changelog ``topic``, up to its end
        now; ``None`` when the topic does not exist."""
        ...

    async def partition_count(self, topic: str) -> int | None:
        """The partition count of ``topic``, ``None`` when it does not exist."""
        ...

    async def read(
        self, tp: TopicPartition, from_offset: int | None, max_records: int, read_committed: bool
    ) -> tuple[list[LogRecord], int]:
        """Up to ``max_records`` records of ``tp`` from ``from_offset`` (``None``: the log
        start; clamped into the log) to the log end as of now, in offset order, and the offset
        the read started at.

        Raises:
            TimeoutError: the records can't be read in time.
        """
        ...


async def browse(
    source: BrowseSource,
    app_id: str,
    group_id: str,
    topic: str,
    partition: int | None = None,
    *,
    from_offset: int | None = None,
    max_records: int = DEFAULT_BROWSE_RECORDS,
) -> list[BrowsedRecord]:
    """The records of ``group_id``'s share-partitions of ``topic`` with their share states,
    acquiring nothing (see the module docstring).

    Args:
        source: where the state and the records are read.
        app_id: the app whose leaders keep the group's state.
        group_id / topic: the share group and the source topic.
        partition: one partition, or ``None`` for every partition of the topic.
        from_offset: the first offset (default: the SPSO, or the log start without state);
            the same for every partition.
        max_records: the most records per partition, 1..:data:`MAX_BROWSE_RECORDS`.

    Returns:
        The records in (partition, offset) order (offsets without a record are left out). A
        ``read_committed`` group's (``share.isolation.level`` set with the admin) records are
        read as it reads them: aborted records are left out.

    Raises:
        ShareGroupError: ``GROUP_ID_NOT_FOUND`` (the message lists the known groups and says
            how to create one).
        ConfigurationError: no such app, no such topic or partition, or a bad argument; the
            message says what to do.
        TimeoutError: the changelogs or the records can't be read in time.
    """
    _check_arguments(partition, from_offset, max_records)
    group = await _group(source, app_id, group_id)
    count = await source.partition_count(topic)
    if count is None:
        raise ConfigurationError(
            f"topic {topic!r} does not exist; list the topics with "
            "'queueflow broker tool topics --list' (browse a topic the group consumes)"
        )
    if partition is not None and partition >= count:
        raise ConfigurationError(
            f"topic {topic!r} has no partition {partition} (partitions 0..{count - 1})"
        )
    table = await source.table(internal.state_changelog(app_id, topic)) or {}
    read_committed = group.configs.get(ISOLATION_LEVEL) == "read_committed"
    out: list[BrowsedRecord] = []
    for p in range(count) if partition is None else (partition,):
        tp = TopicPartition(topic, p)
        state = _state(table, group_id, tp)
        start = from_offset if from_offset is not None else (None if state is None else state[0])
        records, _ = await source.read(tp, start, max_records, read_committed)
        out += [_browsed(tp, r, state) for r in records]
    return out


def _check_arguments(partition: int | None, from_offset: int | None, max_records: int) -> None:
    if partition is not None and partition < 0:
        raise ConfigurationError(f"partition={partition}: give a partition number >= 0")
    if from_offset is not None and from_offset < 0:
        raise ConfigurationError(f"from_offset={from_offset}: give an offset >= 0")
    if not 1 <= max_records <= MAX_BROWSE_RECORDS:
        raise ConfigurationError(
            f"max_records={max_records}: give 1..{MAX_BROWSE_RECORDS} records per partition"
        )


async def _group(source: BrowseSource, app_id: str, group_id: str) -> ShareGroup:
    """The group as its coordinator persisted it.

    Raises:
        ConfigurationError: the app has no group table.
        ShareGroupError: ``GROUP_ID_NOT_FOUND``.
    """
    name = internal.groups_changelog(app_id)
    table = await source.table(name)
    if table is None:
        raise ConfigurationError(
            f"no share groups found for app {app_id!r}: topic {name!r} does not exist; check "
            "the app id (the Faust app's id) and that a worker of the app has run"
        )
    data = table.get(group_id.encode())
    if data is None:
        known = ", ".join(sorted(k.decode(errors="replace") for k in table)) or "none"
        raise ShareGroupError(
            ErrorCode.GROUP_ID_NOT_FOUND,
            f"share group {group_id!r} does not exist in app {app_id!r} (known groups: "
            f"{known}); check the group id ('queueflow share-groups --list' lists them): a "
            "group exists once a member has joined it",
        )
    now = int(time.time() * 1000)
    return group_codec.decode_group(group_id, data, 45_000, 2**31 - 1, now)


#: (SPSO, SPEO, in-flight batches in offset order, their first offsets).
_State = tuple[int, int, list[StateBatch], list[int]]


def _state(table: Mapping[bytes, bytes], group_id: str, tp: TopicPartition) -> _State | None:
    """The persisted state of ``group_id``'s share-partition ``tp``, replayed, or ``None``.

    Raises:
        CorruptStateError: the state can't be decoded (a leader would refuse it too).
    """
    snapshot: bytes | None = None
    deltas: dict[tuple[int, int, int], bytes] = {}
    for key, value in table.items():
        try:
            kind, group, partition, delta = parse_state_key(key)
        except (ValueError, UnicodeDecodeError):
            continue  # not share-partition state
        if kind in ("S", "D") and group == group_id and partition == tp.partition:
            if delta is None:
                snapshot = value
            else:
                deltas[delta] = value
    if snapshot is None:
        return None
    where = f"group={group_id} topic={tp.topic} partition={tp.partition}"
    decoded, updates = decode_state(snapshot, lambda *at: deltas.get(at), where=where)
    spso, batches = replay(decoded, updates, where=where)
    speo = batches[-1].last_offset + 1 if batches else spso
    return spso, speo, list(batches), [b.first_offset for b in batches]


def _browsed(tp: TopicPartition, r: LogRecord, state: _State | None) -> BrowsedRecord:
    def make(
        name: str | None, count: int, member: str | None = None, deadline: int | None = None
    ) -> BrowsedRecord:
        return BrowsedRecord(
            tp.topic,
            tp.partition,
            r.offset,
            r.key,
            r.value,
            r.headers,
            r.timestamp,
            name,
            count,
            member,
            deadline,
        )

    if state is None:
        return make(None, 0)
    spso, speo, batches, firsts = state
    if r.offset < spso:
        return make(RecordState.ARCHIVED.name, 0)
    if r.offset >= speo:
        return make(RecordState.AVAILABLE.name, 0)
    i = bisect.bisect_right(firsts, r.offset) - 1
    batch = batches[i] if i >= 0 and batches[i].last_offset >= r.offset else None
    if batch is None:  # between batches: in flight, never delivered
        return make(RecordState.AVAILABLE.name, 0)
    return make(
        RecordState(batch.state).name, batch.delivery_count, batch.member_id, batch.lock_deadline_ms
    )
