"""Share-group administration: list groups, describe them and their offsets (issue #14).

The read side of Kafka's Admin share-group calls (notes §7.2): :meth:`ShareGroupAdmin.list_groups`
(``listGroups`` with the share filter), :meth:`ShareGroupAdmin.describe_groups`
(``describeShareGroups``) and :meth:`ShareGroupAdmin.list_offsets` (``listShareGroupOffsets``,
with KIP-1226 lag). ``queueflow share-groups`` (:mod:`queueflow.devtools.cli.share_groups`) prints
them like ``kafka-share-groups.sh``.

queueflow keeps share-group state in Faust tables, so the admin reads what the coordinator and
the leaders wrote there, from the tables' compacted changelogs: ``<app>-share-groups-changelog``
(each group's epochs, members and assignments) and ``<app>-share-state-<topic>-changelog`` (each
share-partition's SPSO and in-flight records, replayed exactly as a new leader restores them), up
to their end offsets when the call starts, plus the source topics' log end offsets. Leaders write
their changelog as they change state, so a read sees every change made before it started (up to
the producer's linger). It needs no running worker, and changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow.engine.group import ShareGroup
from queueflow.engine.state import RecordState, replay
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.kafka.admin import admin_client, existing_partition_counts
from queueflow.kafka.config import KafkaClientConfig
from queueflow.protocol import group_codec, topics
from queueflow.protocol.state_codec import decode_state, parse_state_key
from queueflow.structs import TopicPartition

__all__ = [
    "MemberDescription",
    "ShareGroupAdmin",
    "ShareGroupDescription",
    "ShareGroupListing",
    "SharePartitionOffsets",
    "describe_json",
    "groups_changelog",
    "state_changelog",
]

#: How long (ms) a read of the changelogs may take before it fails.
DEFAULT_TIMEOUT_MS = 30_000


def groups_changelog(app_id: str) -> str:
    """The changelog of the coordinator's group table: ``<app>-share-groups-changelog``."""
    return f"{app_id}-{topics.GROUPS_TABLE}-changelog"


def state_changelog(app_id: str, topic: str) -> str:
    """The changelog of ``topic``'s share-partition state table."""
    return f"{app_id}-{topics.state_table(topic)}-changelog"


@dataclass(frozen=True, slots=True)
class ShareGroupListing:
    """A share group and its state (``Empty``, ``Stable`` or ``Dead``; notes §8)."""

    group_id: str
    state: str


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member of a share group as its coordinator last stored it.

    Attributes:
        member_id: the member id (``CONSUMER-ID``).
        client_id: the member's client id.
        host: the host it heartbeats from.
        member_epoch: its member epoch.
        subscribed_topics: the topics it subscribes to.
        assignment: its share-partitions, ordered.
    """

    member_id: str
    client_id: str
    host: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class ShareGroupDescription:
    """A share group (``describeShareGroups``).

    Attributes:
        group_id: the group id.
        state: ``Empty``, ``Stable`` or ``Dead``.
        group_epoch / assignment_epoch: KIP-932 epochs.
        partitions: partition count per subscribed topic, as the coordinator saw it.
        members: the members, ordered by member id.
    """

    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    partitions: Mapping[str, int]
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True, slots=True)
class SharePartitionOffsets:
    """One share-partition's offsets (``listShareGroupOffsets``, KIP-1226).

    Attributes:
        topic / partition: the share-partition.
        start_offset: the SPSO; ``None`` when the group has no state for it yet.
        end_offset: the SPEO (exclusive end of the in-flight records).
        log_end_offset: the partition's log end offset (high watermark) when read.
        lag: records not yet delivered to completion: ``log_end_offset - start_offset`` minus
            the Acknowledged and Archived records in flight (KIP-1226 "delivery complete
            count"); ``None`` without state.
        in_flight: in-flight records per state name (``AVAILABLE``, ``ACQUIRED``,
            ``ACKNOWLEDGED``, ``ARCHIVED``); records between the SPSO and the SPEO that were
            never delivered count as ``AVAILABLE``.
        error: why the state could not be read (corrupt state), else ``None``.
    """

    topic: str
    partition: int
    start_offset: int | None
    end_offset: int | None
    log_end_offset: int
    lag: int | None
    in_flight: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None


class ShareGroupAdmin:
    """Read-only share-group administration of one queueflow app.

    Args:
        app_id: the app id (Faust's ``id``) whose internal topics hold the groups.
        config: how to reach the cluster (bootstrap servers and security settings).
        timeout_ms: how long one call may take to read the changelogs (ms).

    Every call raises :class:`~queueflow.errors.ConfigurationError` when the app has no
    group table (a wrong app id, or no worker ever ran), and ``TimeoutError`` when a changelog
    cannot be read to its end within ``timeout_ms``.
    """

    def __init__(
        self, app_id: str, config: KafkaClientConfig, timeout_ms: int = DEFAULT_TIMEOUT_MS
    ) -> None:
        if not app_id:
            raise ConfigurationError("app_id must name the queueflow app (its Faust id)")
        self.app_id = app_id
        self.config = config
        self.timeout_ms = timeout_ms

    async def list_groups(self, states: Iterable[str] | None = None) -> list[ShareGroupListing]:
        """Every share group of the app, ordered by id, optionally only those in ``states``
        (``Empty``, ``Stable``, ``Dead``; case-insensitive).

        Raises:
            ConfigurationError: an unknown state name, or no group table (see the class).
        """
        wanted = _states(states)
        groups = await self._groups()
        return [
            ShareGroupListing(g.group_id, g.state.value)
            for g in sorted(groups.values(), key=lambda g: g.group_id)
            if wanted is None or g.state.value.lower() in wanted
        ]

    async def describe_groups(self, group_ids: Iterable[str]) -> list[ShareGroupDescription]:
        """Describe ``group_ids`` (in that order).

        Raises:
            ShareGroupError: ``GROUP_ID_NOT_FOUND`` for a group the app doesn't know; the
                message lists the known groups.
        """
        groups = await self._groups()
        return [_describe(_known(groups, g)) for g in group_ids]

    async def list_offsets(
        self, group_id: str, topics_: Iterable[str] | None = None
    ) -> list[SharePartitionOffsets]:
        """The SPSO, SPEO, lag and in-flight counts of every share-partition of ``group_id``
        (of the topics its members subscribe to, or ``topics_``), ordered by topic and
        partition.

        Raises:
            ShareGroupError: ``GROUP_ID_NOT_FOUND``.
        """
        groups = await self._groups()
        group = _known(groups, group_id)
        counts = dict(group.partitions)
        names = sorted(topics_) if topics_ is not None else sorted(counts)
        unknown = [t for t in names if t not in counts]
        if unknown:
            counts.update(await self._partition_counts(unknown))
        ends = await self._log_ends([TopicPartition(t, p) for t in names for p in range(counts[t])])
        out: list[SharePartitionOffsets] = []
        for topic in names:
            table = await self._read(state_changelog(self.app_id, topic), required=False)
            by_partition = _state_by_partition(table, group_id)
            for p in range(counts[topic]):
                tp = TopicPartition(topic, p)
                out.append(_offsets(group_id, topic, p, by_partition.get(p), ends[tp]))
        return out

    # -- reading -----------------------------------------------------------------------------
    async def _groups(self) -> dict[str, ShareGroup]:
        table = await self._read(groups_changelog(self.app_id), required=True)
        now = int(time.time() * 1000)
        groups: dict[str, ShareGroup] = {}
        for key, value in table.items():
            group_id = key.decode(errors="replace")
            # (sessions are not stored: the timeout and size limit only matter to a coordinator)
            groups[group_id] = group_codec.decode_group(group_id, value, 45_000, 2**31 - 1, now)
        return groups

    async def _consumer(self) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            **self.config.client_kwargs(f"{self.config.client_id}-admin"),
            group_id=None,
            enable_auto_commit=False,
        )
        await consumer.start()
        return consumer

    async def _read(self, topic: str, required: bool) -> dict[bytes, bytes]:
        """The latest value of every key of the compacted ``topic``, up to its end offsets
        now (tombstones delete)."""
        count = (await self._existing([topic])).get(topic)
        if not count:
            if required:
                raise ConfigurationError(
                    f"no share groups found for app {self.app_id!r}: topic {topic!r} does "
                    "not exist; check the app id (the Faust app's id) and that a worker of "
                    "the app has run"
                )
            return {}
        consumer = await self._consumer()
        try:
            tps = [KafkaTopicPartition(topic, p) for p in range(count)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            latest: dict[bytes, bytes] = {}
            deadline = time.monotonic() + self.timeout_ms / 1000
            pending = {tp for tp in tps if ends[tp] > 0}
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"could not read {topic} to its end within {self.timeout_ms} ms; "
                        "check the cluster, or raise the timeout"
                    )
                batch = await consumer.getmany(*pending, timeout_ms=500, max_records=10_000)
                for tp, records in batch.items():
                    for r in records:
                        if r.offset >= ends[tp] or r.key is None:
                            continue
                        if r.value is None:
                            latest.pop(r.key, None)
                        else:
                            latest[r.key] = r.value
                for tp in list(pending):
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
            return latest
        finally:
            await consumer.stop()

    async def _log_ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        consumer = await self._consumer()
        try:
            ends = await asyncio.wait_for(
                consumer.end_offsets([KafkaTopicPartition(t, p) for t, p in tps]),
                self.timeout_ms / 1000,
            )
        finally:
            await consumer.stop()
        return {TopicPartition(tp.topic, tp.partition): int(end) for tp, end in ends.items()}

    async def _existing(self, names: list[str]) -> dict[str, int]:
        """Partition counts of the topics among ``names`` that exist (creates none)."""
        admin = admin_client(self.config)
        await admin.start()
        try:
            return await existing_partition_counts(admin, names)
        finally:
            await admin.close()

    async def _partition_counts(self, names: list[str]) -> dict[str, int]:
        counts = await self._existing(names)
        for name in names:
            if name not in counts:
                raise ConfigurationError(
                    f"topic {name!r} does not exist; list the topics with "
                    "'queueflow broker tool topics --list'"
                )
        return counts


def _states(states: Iterable[str] | None) -> set[str] | None:
    if states is None:
        return None
    allowed = {"empty", "stable", "dead"}
    wanted = {s.lower() for s in states}
    if not wanted <= allowed:
        raise ConfigurationError(
            f"unknown share group state(s) {sorted(wanted - allowed)}; use Empty, Stable or Dead"
        )
    return wanted


def _known(groups: Mapping[str, ShareGroup], group_id: str) -> ShareGroup:
    group = groups.get(group_id)
    if group is None:
        known = ", ".join(sorted(groups)) or "none"
        raise ShareGroupError(
            ErrorCode.GROUP_ID_NOT_FOUND,
            f"share group {group_id!r} does not exist in this app (known groups: {known})",
        )
    return group


def _describe(group: ShareGroup) -> ShareGroupDescription:
    members = tuple(
        MemberDescription(
            m.member_id,
            m.client_id,
            m.host,
            m.member_epoch,
            tuple(m.subscribed_topics),
            tuple(sorted(m.assignment)),
        )
        for m in sorted(group.members.values(), key=lambda m: m.member_id)
    )
    return ShareGroupDescription(
        group.group_id,
        group.state.value,
        group.group_epoch,
        group.assignment_epoch,
        dict(group.partitions),
        members,
    )


@dataclass(slots=True)
class _Entries:
    snapshot: bytes | None = None
    deltas: dict[tuple[int, int, int], bytes] = field(default_factory=dict)


def _state_by_partition(table: Mapping[bytes, bytes], group_id: str) -> dict[int, _Entries]:
    """The snapshot and deltas of each of ``group_id``'s share-partitions in ``table``."""
    by_partition: dict[int, _Entries] = defaultdict(_Entries)
    for key, value in table.items():
        try:
            kind, group, partition, delta = parse_state_key(key)
        except (ValueError, UnicodeDecodeError):
            continue  # not share-partition state (the leader refuses such keys the same way)
        if kind == "R" or group != group_id:
            continue
        entries = by_partition[partition]
        if delta is None:
            entries.snapshot = value
        else:
            entries.deltas[delta] = value
    return dict(by_partition)


def _offsets(
    group_id: str, topic: str, partition: int, entries: _Entries | None, log_end: int
) -> SharePartitionOffsets:
    """Replay one share-partition's state as a new leader would, and count it (KIP-1226)."""
    if entries is None or entries.snapshot is None:
        return SharePartitionOffsets(topic, partition, None, None, log_end, None)
    where = f"group={group_id} topic={topic} partition={partition}"
    snapshot = entries.snapshot
    assert snapshot is not None
    try:
        decoded, updates = decode_state(
            snapshot, lambda *epochs_index: entries.deltas.get(epochs_index), where=where
        )
        spso, batches = replay(decoded, updates, where=where)
    except ShareGroupError as exc:
        return SharePartitionOffsets(topic, partition, None, None, log_end, None, {}, str(exc))
    counts: Counter[str] = Counter()
    speo = spso
    for b in batches:
        counts[RecordState(b.state).name] += b.last_offset - b.first_offset + 1
        speo = b.last_offset + 1
    listed = sum(counts.values())
    counts[RecordState.AVAILABLE.name] += (speo - spso) - listed  # never delivered
    complete = counts[RecordState.ACKNOWLEDGED.name] + counts[RecordState.ARCHIVED.name]
    lag = max(log_end - spso - complete, 0)
    in_flight = {s.name: counts[s.name] for s in RecordState}
    return SharePartitionOffsets(topic, partition, spso, speo, log_end, lag, in_flight)


def describe_json(value: Any) -> Any:
    """``value`` (an admin result, or a list of them) as JSON-ready dicts and lists."""
    if isinstance(value, TopicPartition):
        return {"topic": value.topic, "partition": value.partition}
    if isinstance(value, list | tuple):
        return [describe_json(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {name: describe_json(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, Mapping):
        return {str(k): describe_json(v) for k, v in value.items()}
    return value
