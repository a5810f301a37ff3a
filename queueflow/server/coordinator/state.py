"""The coordinator's in-memory state, which its handlers read and change.

:class:`CoordinatorState` holds the share groups of the coordinator partitions this worker
owns (loaded from the ``share-groups`` table on first use), the admin requests forwarded to
leaders and not yet answered (:mod:`.admin`), what the leaders announced (:mod:`.announcements`)
and the bookkeeping of gauges and log events. It reads the table but never writes it: writes
are :class:`~queueflow.server.coordinator.results.GroupRecord` values of a handler's result.
"""

from __future__ import annotations

from queueflow.engine.fencing import PartitionFencing
from queueflow.engine.group import ShareGroup
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import group_codec
from queueflow.protocol.auth import ticket_key
from queueflow.server import group_configs
from queueflow.server.context import ServerContext
from queueflow.server.coordinator.admin_state import PendingAdmin
from queueflow.server.coordinator.announcements import LeaderDirectory
from queueflow.server.coordinator.results import LogEvent, PersistGroup
from queueflow.server.durable import StateTable

__all__ = ["CoordinatorState"]


class CoordinatorState:
    """What the coordinator knows (see the module docstring).

    Args:
        ctx: the server context; handlers read its settings, per-group config defaults and
            app id only (never its sender, metadata or clock: they are passed what they need).
        table: the ``share-groups`` table (read here; written by the dispatcher).
        fencing: the fencing of the coordinator partitions (read for coordinator epochs).
        assignors: ``group.share.assignors``, most preferred first.
    """

    def __init__(
        self,
        ctx: ServerContext,
        table: StateTable,
        fencing: PartitionFencing,
        assignors: tuple[str, ...],
    ) -> None:
        self.ctx = ctx
        self.table = table
        self.fencing = fencing
        self.assignors = assignors
        s = ctx.settings
        #: The key of the assignment tickets in heartbeat answers (see
        #: :mod:`queueflow.server.tickets`); the leaders of the app derive the same.
        self.ticket_key = ticket_key(s.control_auth_mode, s.auth_secret, ctx.app_id)
        self.groups: dict[str, ShareGroup] = {}
        #: Admin requests forwarded to leaders and not yet answered, by group.
        self.pending: dict[str, PendingAdmin] = {}
        #: Leaders' direct endpoints and lag reports.
        self.directory = LeaderDirectory()
        #: Wall ms of the last message served (a longer silence refreshes every session).
        self.last_event_ms = 0
        #: When each group's assignment was last recomputed with fresh inputs (wall ms).
        self.refreshed_at: dict[str, int] = {}
        #: The assignor last logged (``assignor_selected``) per group.
        self.logged_assignor: dict[str, str] = {}
        #: Group epoch up to which ``queueflow_share_group_rebalances_total`` counted.
        self.epochs_counted: dict[str, int] = {}

    def epoch(self, group_id: str) -> int:
        """The coordinator epoch this worker serves ``group_id`` under (-1: not its own)."""
        own = self.fencing.partitions.get(self.ctx.coordinator_partition(group_id))
        return -1 if own is None else own.epoch

    def group(self, group_id: str, now_ms: int) -> ShareGroup:
        """The group ``group_id``: cached, else loaded from the table, else a new empty one.

        Args:
            group_id: the share group.
            now_ms: wall ms; members of a loaded group get a fresh session starting then.

        Raises:
            ShareGroupError: ``CORRUPT_STATE`` when the stored metadata can't be decoded.
        """
        group = self.groups.get(group_id)
        if group is not None:
            return group
        s = self.ctx.settings
        raw = self.table.get(group_id.encode())
        if raw is None:
            group = ShareGroup(group_id, s.session_timeout_ms, s.max_size)
        else:
            group = group_codec.decode_group(
                group_id, raw, s.session_timeout_ms, s.max_size, now_ms
            )
            self.logged_assignor[group_id] = group.assignor
        group.assignor_preference = self.assignors
        self.refreshed_at[group_id] = now_ms
        effective = group_configs.effective(self.ctx, group)
        group.session_timeout_ms = effective.session_timeout_ms
        # A live member follows its join up within a heartbeat interval: grace for two.
        group.join_grace_ms = max(s.member_join_grace_ms, 2 * effective.heartbeat_interval_ms)
        self.groups[group_id] = group
        self.epochs_counted[group_id] = group.group_epoch
        return group

    def existing_group(self, group_id: str, now_ms: int) -> ShareGroup:
        """The group an admin request names.

        Raises:
            ShareGroupError: ``GROUP_ID_NOT_FOUND`` if it was never stored; ``CORRUPT_STATE``.
        """
        if group_id not in self.groups and self.table.get(group_id.encode()) is None:
            raise ShareGroupError(
                ErrorCode.GROUP_ID_NOT_FOUND, f"share group {group_id!r} does not exist"
            )
        return self.group(group_id, now_ms)

    def persist(
        self, group: ShareGroup, reason: str | None = None
    ) -> tuple[PersistGroup, list[LogEvent]]:
        """The record storing ``group`` and the log events that go with it: with ``reason``
        (its epoch or membership changed) ``share_group_epoch``, and ``assignor_selected``
        when its assignor is not the one last logged."""
        group_id = group.group_id
        events = []
        if reason is not None:
            events.append(
                LogEvent.info(
                    "share_group_epoch",
                    group=group_id,
                    group_epoch=group.group_epoch,
                    members=len(group.members),
                    state=group.state.value,
                    reason=reason,
                )
            )
        bumps = group.group_epoch - self.epochs_counted.get(group_id, group.group_epoch)
        self.epochs_counted[group_id] = group.group_epoch
        if self.logged_assignor.get(group_id) != group.assignor:
            self.logged_assignor[group_id] = group.assignor
            selection = group.selection
            events.append(
                LogEvent.info(
                    "assignor_selected",
                    group=group_id,
                    assignor=group.assignor,
                    reason=selection.reason if selection is not None else "stored",
                    members=len(group.members),
                    group_epoch=group.group_epoch,
                )
            )
        group.heartbeats_stored_ms = max(
            (m.last_heartbeat_ms for m in group.members.values()), default=0
        )
        record = PersistGroup(
            group_id,
            group_codec.encode_group(group),
            members=len(group.members),
            group_epoch=group.group_epoch,
            rebalances=max(bumps, 0),
        )
        return record, events

    def forget(self, partitions: set[int] | list[int]) -> list[str]:
        """Drop what this worker knows of the groups of coordinator ``partitions`` (they moved
        away, or it stepped down): their groups, pending admin requests (their leaders'
        answers now go to the new coordinator) and lag reports.

        Returns:
            The ids of the groups dropped (their gauges are the caller's to remove).
        """

        def moved(group_id: str) -> bool:
            return self.ctx.coordinator_partition(group_id) in partitions

        dropped = [g for g in self.groups if moved(g)]
        for group_id in dropped:
            del self.groups[group_id]
            self.epochs_counted.pop(group_id, None)
        for group_id in [g for g in self.pending if moved(g)]:
            self.pending.pop(group_id).abandon()
        self.directory.forget_lag(moved)
        return dropped
