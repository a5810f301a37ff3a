"""The share-partition cache of one leader and each share-partition's lifecycle.

Kafka's ``SharePartitionManager`` keeps a cache of ``SharePartition`` objects, loaded from the
share coordinator's durable state on first use. Here a share-partition is loaded from the
leader's own state table (:class:`~queueflow.server.durable.DurableSharePartition`), or
initialised at ``share.auto.offset.reset`` when it has no state (KIP-932 "Managing the SPSO and
SPEO"), and it moves through the states of :class:`SharePartitionState`;
:meth:`SharePartitionCache._move` is the one place that changes them.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from queueflow.engine.fencing import generations_continuous
from queueflow.errors import CorruptStateError, FencedStateEpochError, IllegalTransitionError
from queueflow.logging import get_logger
from queueflow.server.context import ServerContext
from queueflow.server.durable import DurableSharePartition, StateTable, snapshot_key
from queueflow.server.group_configs import LeaderGroupConfigs
from queueflow.structs import TopicPartition

__all__ = [
    "SHARE_PARTITION_TRANSITIONS",
    "IllegalTransitionError",
    "SharePartitionCache",
    "SharePartitionState",
    "initial_offset",
]

#: ``(group, partition)``: a share-partition of the leader's topic.
Key = tuple[str, int]


class SharePartitionState(enum.Enum):
    """Where one share-partition stands in its leader's cache."""

    #: Not in memory: loaded (or initialised) by its next request.
    UNLOADED = "unloaded"
    #: Loaded and served.
    LIVE = "live"
    #: Its request partition was revoked while the membership lease held: fenced, every write
    #: refused, but kept in memory in case the next rebalance gives the partition straight
    #: back (:meth:`DurableSharePartition.resume`). Never after a lease lapse, a step-down or a
    #: missed generation: another leader may have written the state meanwhile.
    RETAINED = "retained"
    #: Its durable state is corrupt: every request for it is refused with the load error until
    #: its partition moves (an operator repairs or deletes the state).
    REFUSED = "refused"


#: Every allowed move of a share-partition (state -> the states it may move to).
SHARE_PARTITION_TRANSITIONS: dict[SharePartitionState, frozenset[SharePartitionState]] = {
    SharePartitionState.UNLOADED: frozenset(
        {SharePartitionState.LIVE, SharePartitionState.REFUSED}
    ),
    # UNLOADED: its state was deleted by an admin request, or its partition was dropped when
    # another leader may have served it (the lease lapsed, a step-down).
    SharePartitionState.LIVE: frozenset(
        {SharePartitionState.RETAINED, SharePartitionState.UNLOADED}
    ),
    # LIVE: resumed; UNLOADED: led elsewhere now, or written by another leader since.
    SharePartitionState.RETAINED: frozenset(
        {SharePartitionState.LIVE, SharePartitionState.UNLOADED}
    ),
    SharePartitionState.REFUSED: frozenset({SharePartitionState.UNLOADED}),
}


@dataclass(slots=True)
class _Entry:
    state: SharePartitionState
    durable: DurableSharePartition | None = None
    error: CorruptStateError | None = None


class SharePartitionCache:
    """The share-partitions of one leader's request partitions (one source topic).

    Args:
        table: the topic's state table.
        topic: the source topic.
        configs: each group's configs (the engines' configuration).
        updates_per_snapshot: deltas between two snapshots.
        epoch: the leader epoch of a request partition (-1: not led).
        initial_offset: where a new share-partition of ``(group, partition)`` starts (awaits
            the broker).

    Not thread-safe; all on the leader's event loop.
    """

    def __init__(
        self,
        table: StateTable,
        topic: str,
        configs: LeaderGroupConfigs,
        updates_per_snapshot: int,
        epoch: Callable[[int], int],
        initial_offset: Callable[[str, int], Awaitable[tuple[int, int]]],
    ) -> None:
        self.table = table
        self.topic = topic
        self.configs = configs
        self.updates_per_snapshot = updates_per_snapshot
        self._epoch = epoch
        self._initial_offset = initial_offset
        self._entries: dict[Key, _Entry] = {}
        # Request partition -> how often it was dropped: a load that awaited the broker while
        # its partition was dropped must not make the share-partition live.
        self._drops: dict[int, int] = {}
        self._generation: int | None = None  # of the last assignment (forget_retained)
        self._log = get_logger("queueflow.server.leader", topic=topic)
        #: Called with the partitions dropped (:meth:`drop`), so what others keep for them is
        #: released too (the direct endpoint's record cache).
        self.on_dropped: list[Callable[[set[int]], None]] = []

    # -- the lifecycle ---------------------------------------------------------------------
    def state(self, key: Key) -> SharePartitionState:
        """The share-partition's state (``UNLOADED`` when not cached)."""
        entry = self._entries.get(key)
        return SharePartitionState.UNLOADED if entry is None else entry.state

    def _move(
        self,
        key: Key,
        to: SharePartitionState,
        durable: DurableSharePartition | None = None,
        error: CorruptStateError | None = None,
    ) -> None:
        """Move ``key`` to ``to`` (holding ``durable`` or ``error``).

        Raises:
            IllegalTransitionError: the move is not in :data:`SHARE_PARTITION_TRANSITIONS`.
        """
        current = self.state(key)
        if to not in SHARE_PARTITION_TRANSITIONS[current]:
            raise IllegalTransitionError(
                f"share-partition group={key[0]} topic={self.topic} partition={key[1]} cannot "
                f"move from {current.name} to {to.name}"
            )
        if to is SharePartitionState.UNLOADED:
            del self._entries[key]
        else:
            self._entries[key] = _Entry(
                to, durable if durable is not None else self._held(key), error
            )

    def _held(self, key: Key) -> DurableSharePartition | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.durable

    # -- views -----------------------------------------------------------------------------
    def live(self, partition: int | None = None) -> list[tuple[Key, DurableSharePartition]]:
        """The ``LIVE`` share-partitions (of request partition ``partition``, or all)."""
        return [
            (key, entry.durable)
            for key, entry in self._entries.items()
            if entry.state is SharePartitionState.LIVE
            and entry.durable is not None
            and (partition is None or key[1] == partition)
        ]

    def get_live(self, key: Key) -> DurableSharePartition | None:
        """The share-partition if it is ``LIVE``."""
        entry = self._entries.get(key)
        return (
            entry.durable if entry is not None and entry.state is SharePartitionState.LIVE else None
        )

    # -- moves -----------------------------------------------------------------------------
    def drop(self, partitions: Iterable[int], reason: str, resumable: bool = True) -> None:
        """This worker stopped leading ``partitions``: their ``LIVE`` share-partitions are
        fenced (``reason``), the ``REFUSED`` ones forgotten.

        Args:
            partitions: request partitions.
            reason: why (the fenced writes' error says it).
            resumable: ``True`` for a plain revocation while the membership lease held: the
                share-partitions are ``RETAINED`` in case the partition comes straight back.
                ``False`` when another leader may have served them meanwhile (the lease lapsed
                first, a newer fence, a stall): they are forgotten, and reloaded from the
                table (with their successor's writes) if the partition comes back.
        """
        wanted = set(partitions)
        for p in wanted:
            self._drops[p] = self._drops.get(p, 0) + 1
        for key, entry in list(self._entries.items()):
            if key[1] not in wanted:
                continue
            if entry.state is SharePartitionState.LIVE:
                assert entry.durable is not None
                entry.durable.fence(reason)
                kept = SharePartitionState.RETAINED if resumable else SharePartitionState.UNLOADED
                self._move(key, kept)
            elif entry.state is SharePartitionState.REFUSED or (
                entry.state is SharePartitionState.RETAINED and not resumable
            ):
                self._move(key, SharePartitionState.UNLOADED)
        for callback in self.on_dropped:
            callback(wanted)

    def forget_retained(self, keep: set[int], generation: int | None = None) -> None:
        """Forget the ``RETAINED`` share-partitions of partitions not in ``keep`` (led elsewhere
        now: reloaded if they ever come back), and all of them when this assignment, at Faust
        generation ``generation`` (``None``: not known), follows a generation this worker
        missed (:func:`~queueflow.engine.fencing.generations_continuous`)."""
        continuous = generation is None or generations_continuous(self._generation, generation)
        if generation is not None:
            self._generation = generation
        for key, entry in list(self._entries.items()):
            if entry.state is SharePartitionState.RETAINED and (
                key[1] not in keep or not continuous
            ):
                self._move(key, SharePartitionState.UNLOADED)

    def deleted(self, key: Key) -> None:
        """The share-partition's state was deleted (an admin request)."""
        if self.state(key) is not SharePartitionState.UNLOADED:
            self._move(key, SharePartitionState.UNLOADED)

    def create(self, group: str, partition: int, start_offset: int) -> DurableSharePartition:
        """Initialise the share-partition at ``start_offset``, write its first snapshot and
        make it ``LIVE``."""
        durable = DurableSharePartition.create(
            self.table,
            group,
            self.topic,
            partition,
            self.configs.engine(group),
            self.updates_per_snapshot,
            start_offset,
            leader_epoch=self._epoch(partition),
        )
        self._move((group, partition), SharePartitionState.LIVE, durable)
        return durable

    async def existing(self, group: str, partition: int) -> DurableSharePartition | None:
        """The share-partition if it has state (in memory or in the table), else None (it is
        not initialised, unlike :meth:`get`).

        Raises:
            CorruptStateError: as :meth:`get`.
            FencedStateEpochError: as :meth:`get`.
        """
        key = (group, partition)
        if key not in self._entries and self.table.get(snapshot_key(group, partition)) is None:
            return None
        return await self.get(group, partition)

    async def get(self, group: str, partition: int) -> DurableSharePartition:
        """The ``LIVE`` share-partition: cached, resumed, restored from the table, or
        initialised (``share.auto.offset.reset``).

        Raises:
            CorruptStateError: its state is corrupt (it is ``REFUSED`` from now on).
            FencedStateEpochError: its partition was dropped while it was being initialised.
            Exception: what the broker call for a new share-partition's start raises.
        """
        key = (group, partition)
        entry = self._entries.get(key)
        if entry is not None and entry.state is SharePartitionState.LIVE:
            assert entry.durable is not None
            return entry.durable
        if entry is not None and entry.state is SharePartitionState.REFUSED:
            assert entry.error is not None
            raise entry.error
        if entry is not None:  # RETAINED
            resumed = self._resume(key)
            if resumed is not None:
                return resumed
        try:
            durable = DurableSharePartition.load(
                self.table,
                group,
                self.topic,
                partition,
                self.configs.engine(group),
                self.updates_per_snapshot,
                leader_epoch=self._epoch(partition),
            )
        except CorruptStateError as exc:
            self._move(key, SharePartitionState.REFUSED, error=exc)
            self._log.error(
                "share_partition_refused", group=group, partition=partition, error=str(exc)
            )
            raise
        if durable is None:
            return await self._initialise(group, partition)
        self._move(key, SharePartitionState.LIVE, durable)
        self._log.info(
            "share_partition_restored",
            group=group,
            partition=partition,
            start_offset=durable.engine.start_offset,
            end_offset=durable.engine.end_offset,
            state_epoch=durable.state_epoch,
        )
        return durable

    def _resume(self, key: Key) -> DurableSharePartition | None:
        """Resume a ``RETAINED`` share-partition (``LIVE``), or forget it (``UNLOADED``) when
        another leader wrote its state since."""
        retained = self._held(key)
        assert retained is not None
        group, partition = key
        if not retained.resume(self._epoch(partition)):
            self._move(key, SharePartitionState.UNLOADED)
            return None
        retained.engine.reconfigure(self.configs.engine(group))
        self._move(key, SharePartitionState.LIVE, retained)
        self._log.info(
            "share_partition_resumed",
            group=group,
            partition=partition,
            start_offset=retained.engine.start_offset,
            end_offset=retained.engine.end_offset,
            acquired=retained.engine.acquired_count,
            state_epoch=retained.state_epoch,
        )
        return retained

    async def _initialise(self, group: str, partition: int) -> DurableSharePartition:
        drops = self._drops.get(partition, 0)
        start, skipped = await self._initial_offset(group, partition)
        if self._drops.get(partition, 0) != drops:
            raise FencedStateEpochError(
                f"share-partition group={group} topic={self.topic} partition={partition} was "
                "not initialised: this worker stopped leading its partition meanwhile"
            )
        durable = self.create(group, partition, start)
        self._log.info(
            "share_partition_initialised", group=group, partition=partition, start_offset=start
        )
        if skipped > 0:
            reset = self.configs.offset_reset(group, self.topic, partition)
            self._log.warning(
                "share_partition_started_past_records",
                group=group,
                partition=partition,
                start_offset=start,
                records_skipped=skipped,
                auto_offset_reset=reset.kind,
                note="the records already in the partition are never delivered to this group; "
                "to have them, set the group config share.auto.offset.reset=earliest before "
                "the group's first fetch (share_settings / group_configs, or `queueflow "
                "share-groups --reset-offsets --to-earliest` on the empty group)",
            )
        return durable


async def initial_offset(
    ctx: ServerContext, configs: LeaderGroupConfigs, topic: str, group: str, partition: int
) -> tuple[int, int]:
    """Where a new share-partition of ``group`` starts: the group's ``share.auto.offset.reset``
    (``earliest``: the log start; ``latest``: the log end; ``by_duration:D``: the first record
    at most ``D`` old, else the log end), or the log start for a partition added to the topic
    at runtime; and how many offsets of the log it starts past (never delivered to the group).

    Raises:
        Exception: what the broker's ListOffsets raises.
    """
    tp = TopicPartition(topic, partition)
    offsets = ctx.log_offsets
    reset = configs.offset_reset(group, topic, partition)
    log_start = await offsets.log_start(tp)
    if reset.kind == "earliest":
        return log_start, 0
    start: int | None = None
    if reset.kind == "by_duration":
        found = await offsets.offset_for_time(tp, ctx.clock.now_ms() - reset.duration_ms)
        if found is not None:
            start = max(found, log_start)
    if start is None:
        start = await offsets.log_end(tp)
    return start, max(start - log_start, 0)
