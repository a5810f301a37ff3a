"""Share-group administration: list, describe, reset and delete share groups
(docs/operations.md "Inspecting share groups").

Kafka's Admin share-group calls (KIP-932 "AdminClient"). The read side:
:meth:`ShareGroupAdmin.list_groups`
(``listGroups`` with the share filter), :meth:`ShareGroupAdmin.describe_groups`
(``describeShareGroups``) and :meth:`ShareGroupAdmin.list_offsets` (``listShareGroupOffsets``,
with KIP-1226 lag). The write side: :meth:`ShareGroupAdmin.alter_share_group_offsets`
(``alterShareGroupOffsets``), :meth:`ShareGroupAdmin.delete_share_group_offsets`
(``deleteShareGroupOffsets``) and :meth:`ShareGroupAdmin.delete_share_groups`
(``deleteShareGroups``), with :meth:`ShareGroupAdmin.resolve_offsets` to turn ``--to-earliest``,
``--to-latest``, ``--to-datetime``, ``--by-duration`` and ``--to-offset`` into offsets.
``queueflow share-groups`` (:mod:`queueflow.devtools.cli.share_groups`) prints them like
``kafka-share-groups.sh``.

Writes never touch the changelogs: the coordinator owns group membership and the share-partition
leaders own share-partition state, so the admin sends a request to the coordinator on
``<app>-share-coordinator`` and reads the answer on ``<app>-share-replies`` (keyed by its admin
id), as members do. The coordinator refuses a group with members (``NON_EMPTY_GROUP``), an
unknown group (``GROUP_ID_NOT_FOUND``) or topic (``UNKNOWN_TOPIC_OR_PARTITION``), changing
nothing; otherwise it forwards the request to the leaders, which reset or delete the state
through the engine and persist it like any other change. How the race with a member joining
meanwhile is closed: see :mod:`queueflow.server.coordinator`. A running worker of the app (role
``all`` or ``leader``) is needed.

Group configs (docs/operations.md "Group configs"): :meth:`ShareGroupAdmin.describe_group_configs`
and
:meth:`ShareGroupAdmin.alter_group_configs` (Kafka's ``describeConfigs`` and
``incrementalAlterConfigs`` of a ``GROUP`` resource) are answered by the coordinator too: it
validates the values against the broker-level bounds and stores them with the group
(``queueflow configs``, :mod:`queueflow.devtools.cli.configs`).

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
import datetime as dt
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow.clock import SYSTEM_CLOCK, Clock
from queueflow.engine.group import Member, ShareGroup
from queueflow.engine.group_config import DEAD_LETTER_TOPIC, ConfigEntry, parse_duration
from queueflow.engine.key_order import ParkedKey, parse_key_hash, show_hash
from queueflow.engine.reserved import DEAD_LETTER_OWNER, DELAYED_OWNER, describe_owner
from queueflow.engine.state import RecordState, replay
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.kafka.admin import admin_client, existing_partition_counts, group_partition_owners
from queueflow.kafka.config import KafkaClientConfig, check_control_auth
from queueflow.kafka.log_reader import read_latest
from queueflow.kafka.redrive import RedriveResult, redrive, redrive_group_id
from queueflow.kafka.reply_channel import KafkaReplyChannel, ReplyHandler
from queueflow.protocol import group_codec, topics
from queueflow.protocol import messages as protocol
from queueflow.protocol.envelope import reply_dest, topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.protocol.state_codec import decode_parked_keys, decode_state, parse_state_key
from queueflow.settings import ShareGroupSettings, int_default
from queueflow.structs import TopicPartition

log = structlog.get_logger("queueflow.admin")

__all__ = [
    "AdminTransport",
    "ConfigEntry",
    "InFlightBatch",
    "MemberDescription",
    "OffsetLookup",
    "OffsetSpec",
    "ParkedKeyDescription",
    "RedriveResult",
    "ShareGroupAdmin",
    "ShareGroupDescription",
    "ShareGroupListing",
    "SharePartitionOffsets",
    "describe_json",
    "parse_datetime",
    "parse_duration",
]

#: How long (ms) a read of the changelogs may take before it fails.
DEFAULT_TIMEOUT_MS = 30_000


@dataclass(frozen=True, slots=True)
class ShareGroupListing:
    """A share group and its state (``Empty``, ``Stable`` or ``Dead``; KIP-932 "Share group
    states")."""

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
        assignors: the assignors it advertises (``()``: an older member; ``simple`` only).
        rack_id: its rack (``client.rack``), ``""`` if unset.
        last_heartbeat_ms: its last heartbeat (wall ms) as its coordinator last stored it
            (within a third of a session), ``None`` if not stored (an older coordinator).
    """

    member_id: str
    client_id: str
    host: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: tuple[TopicPartition, ...]
    assignors: tuple[str, ...] = ()
    rack_id: str = ""
    last_heartbeat_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ShareGroupDescription:
    """A share group (``describeShareGroups``).

    Attributes:
        group_id: the group id.
        state: ``Empty``, ``Stable`` or ``Dead``.
        group_epoch / assignment_epoch: KIP-932 epochs.
        partitions: partition count per subscribed topic, as the coordinator saw it.
        members: the members, ordered by member id.
        assignor: the assignor of the current assignment (``group.share.assignors``: the
            first every member supports; ``simple`` by default).
        coordinator: the worker that is the group's coordinator now (its web URL,
            ``http://host:port``, or its host), ``None`` when no worker of the app runs or it
            could not be read (see :func:`queueflow.kafka.admin.group_partition_owners`).
        session_timeout_ms: the group's ``share.session.timeout.ms`` as its coordinator last
            stored it (``None``: not stored).
        lapsed_members: members left out of :attr:`members` (and of :attr:`state`): no worker
            of the app runs the group's coordinator and their session lapsed after their last
            heartbeat (their leave was lost, e.g. the workers stopped before them); the next
            coordinator expires them (docs/operations.md "Share groups that stay non-empty").
    """

    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    partitions: Mapping[str, int]
    members: tuple[MemberDescription, ...]
    assignor: str = "simple"
    coordinator: str | None = None
    session_timeout_ms: int | None = None
    lapsed_members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class InFlightBatch:
    """A run of in-flight records ``first_offset..last_offset`` (inclusive) in one state with
    one delivery count (KIP-932 "In-flight records"; the shape of ``StateBatches``).

    Attributes:
        state: ``AVAILABLE``, ``ACQUIRED``, ``ACKNOWLEDGED`` or ``ARCHIVED``.
        delivery_count: delivery attempts so far (0: never delivered).
        member_id: the member holding the acquisition lock (``ACQUIRED`` only, else None).
        status: how to read a record the leader holds itself (a reserved owner,
            :mod:`queueflow.engine.reserved`), e.g. ``Available (delayed until
            2026-01-01T12:00:00.000Z)`` for a delayed RELEASE (its ``state`` is then
            ``AVAILABLE``); ``None`` otherwise.
    """

    first_offset: int
    last_offset: int
    state: str
    delivery_count: int
    member_id: str | None = None
    status: str | None = None


@dataclass(frozen=True, slots=True)
class ParkedKeyDescription:
    """A parked key of a key-ordered share-partition (``share.ordering=key``; docs/concepts.md
    "Key-ordered sharing"): its later records wait until it is released or skipped.

    Attributes:
        key: the key as text (``<null>`` for null keys; ``hash:...`` when not known).
        key_hash: ``hash:<16 hex digits>``, which ``--release-key`` / ``--skip-key`` also
            accept (for keys that are not text).
        offset: the record whose REJECT or delivery limit parked it.
        reason: ``rejected`` or ``delivery_limit``.
    """

    key: str
    key_hash: str
    offset: int
    reason: str


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
            never delivered count as ``AVAILABLE``. ``ARCHIVING``, present when non-zero:
            records held Acquired by ``__dead_letter__`` while they are written to the
            group's dead-letter topic (docs/guide.md "Dead-letter topics"; not in
            ``ACQUIRED``).
        error: why the state could not be read (corrupt state), else ``None``.
        batches: the in-flight records from the SPSO, in offset order, covering
            ``start_offset..`` without gaps (never-delivered records are ``AVAILABLE`` with
            delivery count 0), cut after ``records_limit`` records of
            :meth:`ShareGroupAdmin.list_offsets` (empty by default).
        leader: the worker leading the share-partition now (web URL or host, as
            :attr:`ShareGroupDescription.coordinator`), ``None`` when unknown.
        parked_keys: a key-ordered share-partition's parked keys, by the offset that parked
            them (docs/concepts.md "Key-ordered sharing").
    """

    topic: str
    partition: int
    start_offset: int | None
    end_offset: int | None
    log_end_offset: int
    lag: int | None
    in_flight: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None
    batches: tuple[InFlightBatch, ...] = ()
    leader: str | None = None
    parked_keys: tuple[ParkedKeyDescription, ...] = ()


class AdminTransport(Protocol):
    """Carries the admin's requests to the coordinator and its answers back (the shape of a
    member's transport, :class:`queueflow.member.transport.MemberTransport`).

    Attributes:
        reply_partition: the reply-topic partition the admin reads.
    """

    reply_partition: int

    async def start(self, on_reply: ReplyHandler) -> None:
        """Connect; from now on call ``on_reply(bytes)`` for each reply keyed by the admin."""
        ...

    async def send(self, topic: str, partition: int, payload: bytes) -> None:
        """Append one request record to ``topic[partition]``."""
        ...

    async def close(self) -> None:
        """Disconnect (idempotent)."""
        ...


class OffsetLookup(Protocol):
    """Log offsets of source partitions (aiokafka's consumer calls of the same names)."""

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Log start offset per partition."""
        ...

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Log end offset (high watermark) per partition."""
        ...

    async def offsets_for_times(
        self, tps: list[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        """The first offset whose timestamp is >= ``timestamp_ms`` (ms since the epoch), or
        None when there is none."""
        ...


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to reset share-partitions to, resolved by :meth:`ShareGroupAdmin.resolve_offsets`
    (the scenarios of ``kafka-share-groups.sh --reset-offsets`` plus ``kafka-consumer-groups.sh``'s
    ``--by-duration`` and ``--to-offset``).

    Build with :meth:`earliest`, :meth:`latest`, :meth:`at` (a datetime or ms since the epoch),
    :meth:`ago` (an ISO-8601 duration such as ``PT1H`` or a :class:`datetime.timedelta`) or
    :meth:`exact`.

    Attributes:
        kind: ``earliest``, ``latest``, ``timestamp``, ``duration`` or ``offset``.
        value: ms since the epoch (``timestamp``), ms (``duration``), the offset (``offset``).
    """

    kind: str
    value: int = 0

    @classmethod
    def earliest(cls) -> OffsetSpec:
        """The log start offset (``--to-earliest``)."""
        return cls("earliest")

    @classmethod
    def latest(cls) -> OffsetSpec:
        """The log end offset (``--to-latest``): only records produced later are delivered."""
        return cls("latest")

    @classmethod
    def at(cls, when: dt.datetime | int | str) -> OffsetSpec:
        """The first offset with a timestamp at or after ``when`` (``--to-datetime``): an aware
        datetime (a naive one is UTC), ms since the epoch, or text for :func:`parse_datetime`.

        Raises:
            ConfigurationError: text that :func:`parse_datetime` refuses.
        """
        if isinstance(when, str):
            return cls("timestamp", parse_datetime(when))
        if isinstance(when, dt.datetime):
            aware = when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)
            return cls("timestamp", int(aware.timestamp() * 1000))
        return cls("timestamp", int(when))

    @classmethod
    def ago(cls, duration: dt.timedelta | str) -> OffsetSpec:
        """The first offset with a timestamp at or after now minus ``duration``
        (``--by-duration``): a timedelta or an ISO-8601 duration (:func:`parse_duration`).

        Raises:
            ConfigurationError: a malformed or negative duration.
        """
        ms = (
            parse_duration(duration)
            if isinstance(duration, str)
            else int(duration.total_seconds() * 1000)
        )
        if ms < 0:
            raise ConfigurationError(f"duration {duration!r} is negative; give a duration ago")
        return cls("duration", ms)

    @classmethod
    def exact(cls, offset: int) -> OffsetSpec:
        """``offset``, clamped to the log's start and end offsets (``--to-offset``, as
        ``kafka-consumer-groups.sh`` clamps it).

        Raises:
            ConfigurationError: ``offset`` is negative.
        """
        if offset < 0:
            raise ConfigurationError(f"offset must be >= 0, got {offset}")
        return cls("offset", offset)


_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(Z|[+-]\d{2}(?::?\d{2})?)?"
)


def parse_datetime(text: str) -> int:
    """Parse ``kafka-share-groups.sh --to-datetime``'s ``YYYY-MM-DDThh:mm:ss.sss`` into ms since
    the epoch.

    As Kafka's ``Utils.getDateTime``: a time without a zone is UTC; a zone is ``Z``, ``±hh``,
    ``±hhmm`` or ``±hh:mm``. The fraction of a second is optional (1 to 9 digits; below a
    millisecond is dropped).

    Raises:
        ConfigurationError: anything else (the message shows the expected format).
    """
    m = _DATETIME.fullmatch(text.strip())
    problem = "" if m else "expected YYYY-MM-DDThh:mm:ss.sss, optionally with Z or ±hh:mm"
    if m:
        year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
        fraction, zone = m.group(7) or "", m.group(8)
        tz = dt.timezone.utc
        if zone and zone != "Z":
            digits = zone[1:].replace(":", "")
            hours, minutes = int(digits[:2]), int(digits[2:] or 0)
            if hours > 18 or minutes > 59:
                problem = f"zone offset {zone} is out of range"
            else:
                delta = dt.timedelta(hours=hours, minutes=minutes)
                tz = dt.timezone(delta if zone[0] == "+" else -delta)
        if not problem:
            try:
                when = dt.datetime(year, month, day, hour, minute, second, tzinfo=tz)
            except ValueError as exc:
                problem = str(exc)
            else:
                return int(when.timestamp()) * 1000 + int((fraction + "000")[:3])
    raise ConfigurationError(f"cannot parse datetime {text!r}: {problem}")


class ShareGroupAdmin:
    """Share-group administration of one queueflow app.

    Args:
        app_id: the app id (Faust's ``id``) whose internal topics hold the groups.
        config: how to reach the cluster (bootstrap servers and security settings).
        timeout_ms: how long one call may take (ms): to read the changelogs, or to get a write
            request answered.
        settings: share-group settings; only ``queueflow.auth.mode`` / ``.secret`` are used
            (write requests are signed like the app's workers' messages). Default: from the
            environment (:meth:`~queueflow.settings.ShareGroupSettings.load`).
        transport: how write requests reach the coordinator and answers come back, given the
            admin id (default: Kafka, the app's coordinator and reply topics).
        offsets: log offsets for :meth:`resolve_offsets` (default: a Kafka consumer).
        clock: wall-clock time (request deadlines, ``--by-duration``).
        coordinator_partitions: the partition count of the app's coordinator topic, if known
            (default: read from the cluster once, before the first request; docs/architecture.md
            "Coordinator sharding").

    Every read raises :class:`~queueflow.errors.ConfigurationError` when the app has no
    group table (a wrong app id, or no worker ever ran), and ``TimeoutError`` when a changelog
    cannot be read to its end within ``timeout_ms``.
    """

    def __init__(
        self,
        app_id: str,
        config: KafkaClientConfig,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        *,
        settings: ShareGroupSettings | None = None,
        transport: Callable[[str], AdminTransport] | None = None,
        offsets: OffsetLookup | None = None,
        clock: Clock = SYSTEM_CLOCK,
        coordinator_partitions: int | None = None,
    ) -> None:
        if not app_id:
            raise ConfigurationError("app_id must name the queueflow app (its Faust id)")
        self.app_id = app_id
        self.config = config
        self.timeout_ms = timeout_ms
        self._settings = settings
        self._transport = transport
        self._offsets = offsets
        self._clock = clock
        self.admin_id = f"admin-{uuid.uuid4()}"
        self._next_request = 0
        #: Per group, the members of the last read whose session lapsed with no coordinator.
        self._lapsed: dict[str, tuple[MemberDescription, ...]] = {}
        #: Partitions of the app's coordinator topic (0: not read yet).
        self._coordinators = coordinator_partitions or 0

    # -- writes (alterShareGroupOffsets, deleteShareGroupOffsets, deleteShareGroups) ---------
    async def alter_share_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Set the share-partition start offset (SPSO) of share-partitions of an empty group
        (``Admin.alterShareGroupOffsets``; KIP-932 "Managing the SPSO and SPEO").

        Each share-partition's in-flight records and delivery counts are discarded and its
        SPSO (and SPEO) become the given offset: the group's next member is delivered records
        from there. A share-partition without state yet is initialised at the offset.

        Args:
            group_id: the share group.
            offsets: new SPSO (>= 0) per share-partition ``TopicPartition(topic, partition)``;
                the topics must be ones the group has share-partitions of. See
                :meth:`resolve_offsets` to compute them.

        Returns:
            The SPSO now, per share-partition.

        Raises:
            ShareGroupError: ``NON_EMPTY_GROUP`` (the group has members),
                ``GROUP_ID_NOT_FOUND``, ``UNKNOWN_TOPIC_OR_PARTITION``, ``INVALID_REQUEST``
                (a negative offset, or another admin request on the group in progress): nothing
                changed. ``NON_EMPTY_GROUP`` naming share-partitions whose leader found
                Acquired records (a member joined meanwhile): the others were reset.
                ``REQUEST_TIMED_OUT``: no answer within ``timeout_ms`` (the message says
                from what).
        """
        request = protocol.AlterShareGroupOffsetsRequest(
            group=group_id,
            admin_id=self.admin_id,
            request_id=0,
            reply_partition=0,
            offsets=[(tp.topic, tp.partition, int(o)) for tp, o in sorted(offsets.items())],
        )
        response = await self._call(request, f"reset offsets of share group {group_id!r}")
        return {TopicPartition(t, p): start for t, p, _e, _m, start in response.results}

    async def delete_share_group_offsets(self, group_id: str, topics_: Iterable[str]) -> None:
        """Delete the share-partition state of ``topics_`` for an empty group
        (``Admin.deleteShareGroupOffsets``, KIP-932 DeleteShareGroupOffsets): the group no
        longer has share-partitions of those topics; a member subscribing again starts from
        ``share.auto.offset.reset``.

        Raises:
            ShareGroupError: as :meth:`alter_share_group_offsets`.
        """
        names = sorted(set(topics_))
        if not names:
            raise ConfigurationError("give at least one topic whose offsets to delete")
        request = protocol.DeleteShareGroupOffsetsRequest(
            group=group_id,
            admin_id=self.admin_id,
            request_id=0,
            reply_partition=0,
            topics=names,
        )
        await self._call(request, f"delete offsets of share group {group_id!r}")

    async def delete_share_groups(
        self, group_ids: Iterable[str]
    ) -> dict[str, ShareGroupError | None]:
        """Delete empty share groups: their metadata and the state of all their
        share-partitions (``Admin.deleteShareGroups``). Each group is deleted on its own.

        Returns:
            Per group, in the order given: ``None`` if deleted, else why not (a
            :class:`~queueflow.errors.ShareGroupError`: ``NON_EMPTY_GROUP``,
            ``GROUP_ID_NOT_FOUND``, ``REQUEST_TIMED_OUT``...).
        """
        out: dict[str, ShareGroupError | None] = {}
        for group_id in group_ids:
            request = protocol.DeleteShareGroupRequest(
                group=group_id, admin_id=self.admin_id, request_id=0, reply_partition=0
            )
            try:
                await self._call(request, f"delete share group {group_id!r}")
                out[group_id] = None
            except ShareGroupError as exc:
                out[group_id] = exc
        return out

    # -- group configs (describeConfigs / incrementalAlterConfigs of a GROUP resource) --------
    async def describe_group_configs(self, group_id: str) -> list[ConfigEntry]:
        """Every group config of ``group_id`` with its effective value and source (Kafka's
        ``Admin.describeConfigs`` of a ``GROUP`` resource): ``DYNAMIC_GROUP_CONFIG``
        (set with :meth:`alter_group_configs`), ``APP_GROUP_CONFIG`` (the app's
        ``group_configs``) or ``DEFAULT_CONFIG`` (the broker-level ``group.share.*`` setting).
        Asked of the group's coordinator, so a worker of the app must be running. A group no
        member has joined yet has the defaults and what was set for it (as Kafka).

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` (no answer within
                ``timeout_ms``).
        """
        request = protocol.DescribeGroupConfigsRequest(
            group=group_id, admin_id=self.admin_id, request_id=0, reply_partition=0
        )
        response = await self._call(request, f"describe the configs of share group {group_id!r}")
        return [ConfigEntry(*entry) for entry in response.configs]

    async def alter_group_configs(
        self,
        group_id: str,
        set_configs: Mapping[str, object] | None = None,
        delete_configs: Iterable[str] = (),
    ) -> list[ConfigEntry]:
        """Set and delete group configs of ``group_id`` (Kafka's
        ``Admin.incrementalAlterConfigs`` of a ``GROUP`` resource with SET and DELETE; issue
        #14). The coordinator validates them against the broker-level bounds and stores them
        durably with the group; they override the app's ``group_configs`` for this group only.
        Deleted ones return to the app's default for the group, else the broker-level setting.

        Args:
            group_id: a share group; as with ``kafka-configs.sh``, it need not exist yet:
                the configs are kept for it and apply from its first member's join (e.g.
                ``share.auto.offset.reset=earliest`` before the group starts).
            set_configs: config name -> value (``int`` or text), e.g.
                ``{"share.delivery.count.limit": 3, "share.auto.offset.reset": "earliest"}``.
            delete_configs: config names to delete.

        Returns:
            Every group config after the change (as :meth:`describe_group_configs`).

        Raises:
            ShareGroupError: ``INVALID_CONFIG`` (an unknown config
                name, a value not of its type or out of its range, a heartbeat interval not
                below the session timeout; the message names the config, the value and the
                allowed range); ``REQUEST_TIMED_OUT``. Nothing changes on an error.
        """
        request = protocol.AlterGroupConfigsRequest(
            group=group_id,
            admin_id=self.admin_id,
            request_id=0,
            reply_partition=0,
            set_configs={k: str(v) for k, v in (set_configs or {}).items()},
            delete_configs=list(delete_configs),
        )
        response = await self._call(request, f"alter the configs of share group {group_id!r}")
        return [ConfigEntry(*entry) for entry in response.configs]

    # -- parked keys (key-ordered share groups) ---------------------------------------------
    async def release_key(
        self, group_id: str, topic: str, key: str, partition: int | None = None
    ) -> dict[TopicPartition, int]:
        """Release a parked key of a key-ordered share group (``share.ordering=key``;
        docs/concepts.md "Key-ordered sharing"): its waiting records proceed, in offset order.
        The group need not be empty.

        Args:
            group_id: the share group.
            topic: the source topic.
            key: the key's text, ``<null>`` for null keys, or ``hash:<hex>`` as described.
            partition: one partition, or ``None`` for every partition of ``topic``.

        Returns:
            The share-partitions where the key was parked (and now is not), with 0.

        Raises:
            ShareGroupError: ``GROUP_ID_NOT_FOUND``; ``UNKNOWN_TOPIC_OR_PARTITION`` (a topic
                the group doesn't consume, a partition it doesn't have); ``INVALID_REQUEST``
                (the key is not parked there; a bad ``hash:``); ``REQUEST_TIMED_OUT``.
                Nothing changes on an error (but see ``REQUEST_TIMED_OUT`` in
                :meth:`alter_share_group_offsets`).
        """
        return await self._parked_key("release", group_id, topic, key, partition)

    async def skip_key(
        self, group_id: str, topic: str, key: str, partition: int | None = None
    ) -> dict[TopicPartition, int]:
        """Skip a parked key: its waiting records that the leader has read (those in the log,
        up to ``share.partition.max.record.locks`` past the SPSO) are Archived, then the key
        is free (later records proceed). Arguments and
        errors as :meth:`release_key`; also ``INVALID_REQUEST`` just after a leader change
        (retry).

        Returns:
            The share-partitions where the key was parked, with the records Archived there.
        """
        return await self._parked_key("skip", group_id, topic, key, partition)

    async def _parked_key(
        self, action: str, group_id: str, topic: str, key: str, partition: int | None
    ) -> dict[TopicPartition, int]:
        try:
            hashed = parse_key_hash(key)
        except ValueError as exc:
            raise ShareGroupError(ErrorCode.INVALID_REQUEST, str(exc)) from None
        request = protocol.ParkedKeyRequest(
            group=group_id,
            admin_id=self.admin_id,
            request_id=0,
            reply_partition=0,
            topic=topic,
            key_hash=f"{hashed:016x}",
            action=action,
            partition=-1 if partition is None else partition,
        )
        response = await self._call(request, f"{action} key {key!r} of share group {group_id!r}")
        done = {TopicPartition(t, p): n for t, p, _e, _m, n in response.results if n >= 0}
        if not done:
            where = topic if partition is None else f"{topic}[{partition}]"
            raise ShareGroupError(
                ErrorCode.INVALID_REQUEST,
                f"key {key!r} ({show_hash(hashed)}) is not parked in share group "
                f"{group_id!r} on {where}; list the parked keys with 'queueflow share-groups "
                f"--describe --group {group_id}'",
            )
        return done

    # -- dead-letter topics (KIP-1191; docs/guide.md "Dead-letter topics") ---------------------
    async def redrive(
        self,
        group_id: str,
        *,
        to: str | None = None,
        dry_run: bool = False,
        dead_letter_topic: str | None = None,
    ) -> RedriveResult:
        """Move the records of ``group_id``'s dead-letter topic back to their source topics
        and partitions (named by their ``queueflow.dead_letter.*`` headers), SQS's redrive,
        where the group's members handle them again as new records. Safe to interrupt: the
        progress is committed in the consumer group ``queueflow-redrive-<app>-<group>`` after
        each produced batch, and a new call resumes there (a batch produced but not committed
        is produced again). See :mod:`queueflow.kafka.redrive`.

        Args:
            group_id: the share group.
            to: produce every record to this topic instead of its source.
            dry_run: only count what would move.
            dead_letter_topic: the DLQ topic; default: the group's
                ``errors.deadletterqueue.topic.name`` (asked of its coordinator, so a worker
                must be running).

        Raises:
            ConfigurationError: the group has no dead-letter topic, or it (or ``to``) does
                not exist.
            ShareGroupError: ``GROUP_ID_NOT_FOUND``, ``REQUEST_TIMED_OUT``.
        """
        topic = dead_letter_topic
        if topic is None:
            configs = {e.name: e.value for e in await self.describe_group_configs(group_id)}
            topic = configs.get(DEAD_LETTER_TOPIC, "")
        if not topic:
            raise ConfigurationError(
                f"share group {group_id!r} has no dead-letter topic: set "
                f"{DEAD_LETTER_TOPIC} (queueflow share-groups --alter-config) or name the topic"
            )
        return await redrive(
            self.config,
            topic,
            redrive_group_id(self.app_id, group_id),
            to=to,
            dry_run=dry_run,
            timeout_s=self.timeout_ms / 1000,
        )

    async def resolve_offsets(
        self, partitions: Iterable[TopicPartition], spec: OffsetSpec
    ) -> dict[TopicPartition, int]:
        """The offsets ``spec`` names for each of ``partitions``, from the log (as
        ``kafka-share-groups.sh --reset-offsets`` computes them): earliest/latest are the log
        start/end offsets; a datetime or duration the first offset whose timestamp is at or
        after it, or the log end when there is none; an exact offset is clamped to
        [log start, log end].

        Raises:
            TimeoutError: the broker did not answer within ``timeout_ms``.
        """
        tps = sorted(set(partitions))
        if not tps:
            return {}
        lookup = self._offsets
        consumer = None
        if lookup is None:
            consumer = await self._consumer()
            lookup = _KafkaOffsets(consumer)
        try:
            return await asyncio.wait_for(
                self._resolve(lookup, tps, spec, self._clock.now_ms()), self.timeout_ms / 1000
            )
        finally:
            if consumer is not None:
                await consumer.stop()

    @staticmethod
    async def _resolve(
        lookup: OffsetLookup, tps: list[TopicPartition], spec: OffsetSpec, now_ms: int
    ) -> dict[TopicPartition, int]:
        if spec.kind == "earliest":
            return dict(await lookup.beginning_offsets(tps))
        ends = await lookup.end_offsets(tps)
        if spec.kind == "latest":
            return dict(ends)
        if spec.kind == "offset":
            starts = await lookup.beginning_offsets(tps)
            return {tp: min(max(spec.value, starts[tp]), ends[tp]) for tp in tps}
        if spec.kind not in ("timestamp", "duration"):
            raise ConfigurationError(f"unknown offset spec {spec.kind!r}")
        when = spec.value if spec.kind == "timestamp" else now_ms - spec.value
        found = await lookup.offsets_for_times(tps, max(when, 0))
        return {tp: ends[tp] if found.get(tp) is None else int(found[tp] or 0) for tp in tps}

    async def _call(
        self,
        request: protocol.AlterShareGroupOffsetsRequest
        | protocol.DeleteShareGroupOffsetsRequest
        | protocol.DeleteShareGroupRequest
        | protocol.DescribeGroupConfigsRequest
        | protocol.AlterGroupConfigsRequest
        | protocol.ParkedKeyRequest,
        what: str,
    ) -> protocol.AdminResponse:
        """Send ``request`` to the group's coordinator and wait for its answer."""
        self._next_request += 1
        request.request_id = self._next_request
        # The coordinator holds joins back until this deadline at most; leave time for its
        # answer (it is checked on the coordinator's ticks).
        request.deadline_ms = self._clock.now_ms() + self.timeout_ms * 3 // 4
        settings = self._settings if self._settings is not None else ShareGroupSettings.load()
        check_control_auth(settings, self.config)
        # Admin requests need the worker secret: a member credential can't make them.
        auth = ControlAuth.from_settings(settings, self.app_id, self.admin_id)
        make = self._transport or (
            lambda admin_id: _KafkaAdminTransport(self.config, self.app_id, admin_id)
        )
        transport = make(self.admin_id)
        request.reply_partition = transport.reply_partition
        answer: asyncio.Future[protocol.AdminResponse] = asyncio.get_running_loop().create_future()

        reply_at = reply_dest(
            topics.reply_topic(self.app_id), request.reply_partition, self.admin_id
        )

        def on_reply(data: bytes) -> None:
            try:
                reply = protocol.decode(auth.open(data, reply_at))
            except ShareGroupError:
                return  # not for us, or forged: keep waiting
            if (
                isinstance(reply, protocol.AdminResponse)
                and reply.request_id == request.request_id
                and not answer.done()
            ):
                answer.set_result(reply)

        coordinator = topics.coordinator_topic(self.app_id)
        try:
            partition = await self._coordinator_partition(request.group)
            await asyncio.wait_for(transport.start(on_reply), self.timeout_ms / 1000)
            sealed = auth.seal(protocol.encode(request), topic_dest(coordinator, partition))
            await transport.send(coordinator, partition, sealed)
            response = await asyncio.wait_for(answer, self.timeout_ms / 1000)
        except asyncio.TimeoutError:
            raise ShareGroupError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"could not {what}: no answer from the share-group coordinator of app "
                f"{self.app_id!r} ({coordinator}[{partition}]) within {self.timeout_ms} ms; is "
                "a worker of the app (role all or leader) running? If one is, a "
                "share-partition leader did not answer in time: the request may have been "
                "applied to some share-partitions, check with --describe",
            ) from None
        finally:
            await transport.close()
        if response.error != ErrorCode.NONE.value:
            raise ShareGroupError(ErrorCode(response.error), response.error_message)
        return response

    async def list_groups(self, states: Iterable[str] | None = None) -> list[ShareGroupListing]:
        """Every share group of the app, ordered by id, optionally only those in ``states``
        (``Empty``, ``Stable``, ``Dead``; case-insensitive).

        Raises:
            ConfigurationError: an unknown state name, or no group table (see the class).
        """
        wanted = _states(states)
        groups = await self._groups(await self._owners())
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
        owners = await self._owners()
        groups = await self._groups(owners)
        return [self._described(_known(groups, g), owners) for g in group_ids]

    async def list_offsets(
        self, group_id: str, topics_: Iterable[str] | None = None, *, records_limit: int = 0
    ) -> list[SharePartitionOffsets]:
        """The SPSO, SPEO, lag and in-flight counts of every share-partition of ``group_id``
        (of the topics its members subscribe to, or ``topics_``), ordered by topic and
        partition.

        Args:
            group_id: the share group.
            topics_: the topics (default: those the group's members subscribe to).
            records_limit: also return the in-flight records themselves
                (:attr:`SharePartitionOffsets.batches`), up to this many per share-partition
                from the SPSO (0: none; bounds the answer, e.g. 2,000 for a dashboard).

        Raises:
            ShareGroupError: ``GROUP_ID_NOT_FOUND``.
            ValueError: ``records_limit`` is negative.
        """
        if records_limit < 0:
            raise ValueError(f"records_limit={records_limit}; must be >= 0 (0: no batches)")
        owners = await self._owners()
        groups = await self._groups(owners)
        return await self._offsets_of(_known(groups, group_id), topics_, records_limit, owners)

    async def overview(
        self, records_limit: int = 0
    ) -> list[tuple[ShareGroupDescription, list[SharePartitionOffsets]]]:
        """Every share group of the app, described, with the offsets of its share-partitions
        (:meth:`describe_groups` plus :meth:`list_offsets` for each group, from one read of each
        changelog): what the dashboard shows.

        Args:
            records_limit: in-flight records per share-partition to return as batches (see
                :meth:`list_offsets`).

        Raises:
            ConfigurationError: no group table (see the class). ValueError: a negative
                ``records_limit``.
        """
        if records_limit < 0:
            raise ValueError(f"records_limit={records_limit}; must be >= 0 (0: no batches)")
        owners = await self._owners()
        groups = await self._groups(owners)
        tables: dict[str, dict[bytes, bytes]] = {}
        return [
            (
                self._described(group, owners),
                await self._offsets_of(group, None, records_limit, owners, tables),
            )
            for group in sorted(groups.values(), key=lambda g: g.group_id)
        ]

    def _described(
        self, group: ShareGroup, owners: Mapping[tuple[str, int], str]
    ) -> ShareGroupDescription:
        where = (
            topics.coordinator_topic(self.app_id),
            topics.coordinator_partition(group.group_id, self._coordinators),
        )
        return replace(
            _describe(group),
            coordinator=owners.get(where),
            lapsed_members=self._lapsed.get(group.group_id, ()),
        )

    async def _offsets_of(
        self,
        group: ShareGroup,
        topics_: Iterable[str] | None,
        records_limit: int,
        owners: Mapping[tuple[str, int], str],
        tables: dict[str, dict[bytes, bytes]] | None = None,
    ) -> list[SharePartitionOffsets]:
        """``list_offsets`` of ``group``; ``owners`` are the workers by the partitions they
        hold, ``tables`` caches changelogs read (topic -> table)."""
        tables = {} if tables is None else tables
        group_id = group.group_id
        counts = dict(group.partitions)
        names = sorted(topics_) if topics_ is not None else sorted(counts)
        unknown = [t for t in names if t not in counts]
        if unknown:
            counts.update(await self._partition_counts(unknown))
        ends = await self._log_ends([TopicPartition(t, p) for t in names for p in range(counts[t])])
        out: list[SharePartitionOffsets] = []
        for topic in names:
            name = topics.state_changelog(self.app_id, topic)
            if name not in tables:
                tables[name] = await self._read(name, required=False)
            table = tables[name]
            by_partition = _state_by_partition(table, group_id)
            for p in range(counts[topic]):
                tp = TopicPartition(topic, p)
                offsets = _offsets(group_id, topic, p, by_partition.get(p), ends[tp], records_limit)
                leader = owners.get((topics.request_topic(self.app_id, topic), p))
                out.append(replace(offsets, leader=leader))
        return out

    # -- reading -----------------------------------------------------------------------------
    async def _groups(self, owners: Mapping[tuple[str, int], str]) -> dict[str, ShareGroup]:
        """The stored groups, each member with its stored last heartbeat; for a group whose
        coordinator no worker runs (not in ``owners``), members whose session lapsed are left
        out (kept in ``self._lapsed``), as its next coordinator will expire them."""
        # A group's record counts in its own coordinator partition only: a coordinator could
        # write it to another one too (a Tick on that partition), and a merged read would
        # give whichever copy it read last.
        table = await self._read(topics.groups_changelog(self.app_id), required=True, home=True)
        await self._coordinator_partition("")  # sizes self._coordinators for _described
        now = self._clock.now_ms()
        default_timeout = (
            self._settings.session_timeout_ms
            if self._settings is not None
            else int_default("session_timeout_ms")
        )
        groups: dict[str, ShareGroup] = {}
        self._lapsed = {}
        for key, value in table.items():
            group_id = key.decode(errors="replace")
            group = group_codec.decode_group(
                group_id, value, default_timeout, 2**31 - 1, now, stored_sessions=True
            )
            if group.group_epoch == 0 and not group.members:
                continue  # only configs set before its first join: no group yet, as in Kafka
            where = (
                topics.coordinator_topic(self.app_id),
                topics.coordinator_partition(group_id, self._coordinators),
            )
            if where not in owners:
                lapsed = lapsed_members(group, now)
                if lapsed:
                    self._lapsed[group_id] = _describe_members(lapsed)
                    for m in lapsed:
                        del group.members[m.member_id]
            groups[group_id] = group
        return groups

    async def _consumer(self) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            **self.config.client_kwargs(f"{self.config.client_id}-admin"),
            group_id=None,
            enable_auto_commit=False,
        )
        await consumer.start()
        return consumer

    async def _read(self, topic: str, required: bool, home: bool = False) -> dict[bytes, bytes]:
        """The latest value of every key of the compacted ``topic``, up to its end offsets
        now (tombstones delete); with ``home``, only each key's records in the partition the
        key (a group id) hashes to over the topic's partition count
        (:func:`~queueflow.protocol.topics.coordinator_partition`)."""
        count = (await self._existing([topic])).get(topic)
        if not count:
            if required:
                raise ConfigurationError(
                    f"no share groups found for app {self.app_id!r}: topic {topic!r} does "
                    "not exist; check the app id (the Faust app's id) and that a worker of "
                    "the app has run"
                )
            return {}

        def at_home(key: bytes, partition: int) -> bool:
            return topics.coordinator_partition(key.decode(errors="replace"), count) == partition

        consumer = await self._consumer()
        try:
            return await read_latest(
                consumer, topic, count, self.timeout_ms, at_home if home else None
            )
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

    async def _owners(self) -> dict[tuple[str, int], str]:
        """The app's workers by the partitions they hold (coordinator and request topics);
        empty when none runs or the group can't be described (e.g. no DESCRIBE ACL on the
        app's consumer group): coordinator and leaders then show as unknown."""
        admin = admin_client(self.config)
        try:
            await admin.start()
            return await asyncio.wait_for(
                group_partition_owners(admin, self.app_id), self.timeout_ms / 1000
            )
        except Exception as exc:  # who leads is extra information: never fail a describe
            log.debug("partition_owners_unavailable", app=self.app_id, error=repr(exc))
            return {}
        finally:
            await admin.close()

    async def _coordinator_partition(self, group_id: str) -> int:
        """The coordinator partition of ``group_id``, as the app's members find it
        (FindCoordinator: the coordinator topic's partition count, read once, then the hash;
        docs/architecture.md "Coordinator sharding").

        Raises:
            ConfigurationError: the coordinator topic and the group changelog differ in
                partition count (:func:`~queueflow.protocol.topics.resolve_coordinator_partitions`).
        """
        if self._coordinators == 0:
            names = [topics.coordinator_topic(self.app_id), topics.groups_changelog(self.app_id)]
            counts = await self._existing(names)
            self._coordinators = topics.resolve_coordinator_partitions(
                self.app_id,
                topics.LEGACY_COORDINATOR_PARTITIONS,  # neither exists: nothing to find anyway
                counts.get(names[0]),
                counts.get(names[1]),
            )
        return topics.coordinator_partition(group_id, self._coordinators)

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


def lapsed_members(group: ShareGroup, now_ms: int) -> list[Member]:
    """``group``'s members whose stored last heartbeat is older than its session timeout."""
    return [
        m
        for m in group.members.values()
        if m.last_heartbeat_ms and now_ms - m.last_heartbeat_ms > group.session_timeout_ms
    ]


def _describe_members(members: Iterable[Member]) -> tuple[MemberDescription, ...]:
    return tuple(
        MemberDescription(
            m.member_id,
            m.client_id,
            m.host,
            m.member_epoch,
            tuple(m.subscribed_topics),
            tuple(sorted(m.assignment)),
            m.assignors,
            m.rack_id,
            m.last_heartbeat_ms or None,
        )
        for m in sorted(members, key=lambda m: m.member_id)
    )


def _describe(group: ShareGroup) -> ShareGroupDescription:
    return ShareGroupDescription(
        group.group_id,
        group.state.value,
        group.group_epoch,
        group.assignment_epoch,
        dict(group.partitions),
        _describe_members(group.members.values()),
        group.assignor,
        session_timeout_ms=group.session_timeout_ms,
    )


@dataclass(slots=True)
class _Entries:
    parked: bytes | None = None
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
        if kind in ("R", "A") or group != group_id:
            continue
        if kind == "K":  # a key-ordered share-partition's parked keys
            by_partition[partition].parked = value
            continue
        entries = by_partition[partition]
        if delta is None:
            entries.snapshot = value
        else:
            entries.deltas[delta] = value
    return dict(by_partition)


def _offsets(
    group_id: str,
    topic: str,
    partition: int,
    entries: _Entries | None,
    log_end: int,
    records_limit: int = 0,
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
        name = RecordState(b.state).name
        if b.member_id == DELAYED_OWNER:  # delayed: Available once its time comes
            name = RecordState.AVAILABLE.name
        elif b.member_id == DEAD_LETTER_OWNER:
            name = "ARCHIVING"  # being written to the dead-letter topic
        counts[name] += b.last_offset - b.first_offset + 1
        speo = b.last_offset + 1
    listed = sum(counts.values())
    counts[RecordState.AVAILABLE.name] += (speo - spso) - listed  # never delivered
    complete = counts[RecordState.ACKNOWLEDGED.name] + counts[RecordState.ARCHIVED.name]
    lag = max(log_end - spso - complete, 0)
    in_flight = {s.name: counts[s.name] for s in RecordState}
    if counts["ARCHIVING"]:
        in_flight["ARCHIVING"] = counts["ARCHIVING"]
    shown = _batches(spso, speo, batches, records_limit) if records_limit else ()
    parked = _parked(entries.parked, where)
    return SharePartitionOffsets(
        topic, partition, spso, speo, log_end, lag, in_flight, None, shown, parked_keys=parked
    )


def _parked(raw: bytes | None, where: str) -> tuple[ParkedKeyDescription, ...]:
    """The parked keys stored for a share-partition (none when unreadable: logged)."""
    if raw is None:
        return ()
    try:
        keys: list[ParkedKey] = decode_parked_keys(raw, where=where)
    except ShareGroupError as exc:
        log.warning("parked_keys_unreadable", where=where, error=str(exc))
        return ()
    return tuple(
        ParkedKeyDescription(
            p.key or show_hash(p.key_hash), show_hash(p.key_hash), p.offset, p.reason
        )
        for p in keys
    )


def _batches(spso: int, speo: int, batches: Iterable[Any], limit: int) -> tuple[InFlightBatch, ...]:
    """``batches`` (replayed StateBatches) as :class:`InFlightBatch`, gaps filled with
    never-delivered Available records, cut after ``limit`` records from the SPSO."""
    stop = min(speo, spso + limit)
    out: list[InFlightBatch] = []
    at = spso
    available = RecordState.AVAILABLE.name
    for b in batches:
        if at >= stop:
            break
        if b.first_offset > at:
            out.append(InFlightBatch(at, min(b.first_offset, stop) - 1, available, 0))
            at = b.first_offset
        if at >= stop:
            break
        first, last = max(b.first_offset, at), min(b.last_offset, stop - 1)
        if first <= last:
            state, member = RecordState(b.state).name, b.member_id
            status = describe_owner(member, b.lock_deadline_ms)
            if member == DELAYED_OWNER:
                state, member = available, None
            out.append(InFlightBatch(first, last, state, b.delivery_count, member, status))
            at = last + 1
    if at < stop:
        out.append(InFlightBatch(at, stop - 1, available, 0))
    return tuple(out)


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


class _KafkaOffsets:
    """:class:`OffsetLookup` over an aiokafka consumer."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        found = await self.consumer.beginning_offsets([KafkaTopicPartition(*tp) for tp in tps])
        return {TopicPartition(tp.topic, tp.partition): int(o) for tp, o in found.items()}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        found = await self.consumer.end_offsets([KafkaTopicPartition(*tp) for tp in tps])
        return {TopicPartition(tp.topic, tp.partition): int(o) for tp, o in found.items()}

    async def offsets_for_times(
        self, tps: list[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        found = await self.consumer.offsets_for_times(
            {KafkaTopicPartition(*tp): timestamp_ms for tp in tps}
        )
        return {
            TopicPartition(tp.topic, tp.partition): None if o is None else int(o.offset)
            for tp, o in found.items()
        }


class _KafkaAdminTransport(KafkaReplyChannel):
    """The admin's requests as records on the coordinator topic (acks=all, awaited); its
    answers read from one reply-topic partition (as a member's,
    :class:`queueflow.member.transport.KafkaMemberTransport`)."""

    def __init__(self, kafka: KafkaClientConfig, app_id: str, admin_id: str) -> None:
        super().__init__(
            kafka,
            topics.reply_topic(app_id),
            admin_id,
            f"{kafka.client_id}-admin",
            what="admin",
            acks="all",
            wait_for_ack=True,
            reply_fetch_wait_ms=200,
        )
        self.app_id = app_id

    async def start(self, on_reply: ReplyHandler) -> None:
        """Check that the app's reply and coordinator topics exist, then start (see
        :meth:`KafkaReplyChannel.start`).

        Raises:
            ConfigurationError: a topic is missing (a wrong app id, or no worker of the app
                ever ran): sending would auto-create it and nobody would answer.
        """
        admin = admin_client(self.kafka)
        await admin.start()
        try:
            needed = [self.reply_topic, topics.coordinator_topic(self.app_id)]
            missing = sorted(set(needed) - set(await existing_partition_counts(admin, needed)))
        finally:
            await admin.close()
        if missing:
            raise ConfigurationError(
                f"no share-group coordinator for app {self.app_id!r}: topic(s) "
                f"{', '.join(missing)} do not exist; check the app id (the Faust app's id) and "
                "that a worker of the app has run"
            )
        await super().start(on_reply)
