"""Durable share-partition state: snapshots plus deltas in a key-value table.

KIP-932 "Managing durable share-partition state" (later revision: ShareSnapshot/ShareUpdate).
A :class:`DurableSharePartition` pairs a :class:`~queueflow.engine.partition.SharePartition` with
a table (in production a Faust table on RocksDB with a compacted changelog; in tests a dict):

* ``S/<group>/<partition>`` holds the latest full snapshot, with its snapshot epoch and the
  leader's state epoch;
* ``D/<group>/<partition>/<state epoch>/<snapshot epoch>/<delta index>`` holds each delta
  written since. Every delta has its own key, so log compaction keeps everything replay needs,
  and the state epoch in the key keeps a fenced leader's late deltas apart from its
  successor's: replay never mixes the writes of two leaders;
* after ``share.coordinator.snapshot.update.records.per.snapshot`` deltas the next write is a
  full snapshot with the snapshot epoch + 1, and the superseded deltas are deleted (tombstones).

Recovery reads the snapshot and its deltas in index order and replays them; replay is idempotent.
A new leader bumps the state epoch and writes a fresh snapshot at once. A leader that learns it
has been superseded calls :meth:`DurableSharePartition.fence`; from then on every write raises
:class:`~queueflow.errors.FencedStateEpochError` (KIP-932 ``FENCED_STATE_EPOCH``).
"""

from __future__ import annotations

from typing import Protocol

from queueflow.engine.partition import SharePartition, SharePartitionConfig
from queueflow.engine.state import (
    ShareSnapshot,
    replay,
)
from queueflow.errors import CorruptStateError, FencedStateEpochError
from queueflow.protocol.state_codec import (
    decode_snapshot,
    decode_state,
    delta_key,
    encode_parked_keys,
    encode_snapshot,
    encode_update,
    parked_keys_key,
    snapshot_key,
)

__all__ = ["DurableSharePartition", "StateTable", "delta_key", "snapshot_key"]


class StateTable(Protocol):
    """The slice of a Faust table (or a dict) the durable state needs: bytes keys and values."""

    def get(self, key: bytes, default: None = None) -> bytes | None: ...
    def __setitem__(self, key: bytes, value: bytes) -> None: ...
    def __delitem__(self, key: bytes) -> None: ...


class DurableSharePartition:
    """A share-partition engine whose changes are written to a table as deltas and snapshots.

    Build with :meth:`load` (existing state) or :meth:`create` (a new share-partition).

    Args:
        group / topic / partition: the share-partition.
        engine: the engine.
        table: where state lives.
        updates_per_snapshot: deltas between two snapshots (0: snapshot on every write).
        snapshot_epoch / state_epoch / leader_epoch: epochs of the state as loaded.
    """

    def __init__(
        self,
        group: str,
        topic: str,
        partition: int,
        engine: SharePartition,
        table: StateTable,
        updates_per_snapshot: int,
        snapshot_epoch: int = 0,
        state_epoch: int = 0,
        leader_epoch: int = 0,
        delta_index: int = 0,
    ) -> None:
        self.group = group
        self.topic = topic
        self.partition = partition
        self.engine = engine
        self.table = table
        self.updates_per_snapshot = updates_per_snapshot
        self.snapshot_epoch = snapshot_epoch
        self.state_epoch = state_epoch
        self.leader_epoch = leader_epoch
        self.delta_index = delta_index
        self.writes = 0
        self.fenced: str | None = None

    @property
    def where(self) -> str:
        """``group=G topic=T partition=P``, for errors and logs."""
        return f"group={self.group} topic={self.topic} partition={self.partition}"

    @classmethod
    def load(
        cls,
        table: StateTable,
        group: str,
        topic: str,
        partition: int,
        config: SharePartitionConfig,
        updates_per_snapshot: int,
        leader_epoch: int = 0,
    ) -> DurableSharePartition | None:
        """Restore a share-partition from its snapshot and deltas; ``None`` if it has no state.

        The restored leader takes the next state epoch and writes a fresh snapshot, so its
        predecessor's deltas are superseded. Acquired records come back Acquired by their member
        until their lock deadline (the lock is persisted), so a takeover redelivers nothing.

        Raises:
            CorruptStateError: a snapshot or delta is corrupt or of an unknown version; the
                message names the group, topic and partition.
        """
        where = f"group={group} topic={topic} partition={partition}"
        raw = table.get(snapshot_key(group, partition))
        if raw is None:
            return None
        snapshot, updates = decode_state(
            raw,
            lambda state_epoch, snapshot_epoch, index: table.get(
                delta_key(group, partition, state_epoch, snapshot_epoch, index)
            ),
            where=where,
        )
        index = len(updates)
        start, batches = replay(snapshot, updates)
        engine = SharePartition.restore(config, start, batches)
        durable = cls(
            group,
            topic,
            partition,
            engine,
            table,
            updates_per_snapshot,
            snapshot_epoch=snapshot.snapshot_epoch,
            state_epoch=snapshot.state_epoch,
            leader_epoch=leader_epoch,
            delta_index=index,
        )
        durable.write_snapshot(next_state_epoch=True)
        return durable

    @classmethod
    def create(
        cls,
        table: StateTable,
        group: str,
        topic: str,
        partition: int,
        config: SharePartitionConfig,
        updates_per_snapshot: int,
        start_offset: int,
        leader_epoch: int = 0,
    ) -> DurableSharePartition:
        """Initialise a new share-partition at ``start_offset`` (KIP-932 "Managing the SPSO and
        SPEO") and write its first snapshot."""
        engine = SharePartition(config, start_offset)
        durable = cls(
            group,
            topic,
            partition,
            engine,
            table,
            updates_per_snapshot,
            snapshot_epoch=-1,
            state_epoch=0,
            leader_epoch=leader_epoch,
        )
        durable.write_snapshot()
        return durable

    def resume(self, leader_epoch: int) -> bool:
        """Serve again, with the in-memory state (Acquired records included), a share-partition
        this worker was fenced from, if nobody has written its state since: the table still
        holds this object's snapshot and no delta after its last one. True if resumed.

        A Faust rebalance that hands a partition back to the worker that led it (every eager
        rebalance revokes all partitions first) is not a failover: reloading would turn every
        Acquired record Available and have its members' acknowledgements refused.
        """
        try:
            raw = self.table.get(snapshot_key(self.group, self.partition))
            snapshot = decode_snapshot(raw, where=self.where) if raw is not None else None
        except CorruptStateError:
            return False  # load() reports it
        if (
            snapshot is None
            or (snapshot.state_epoch, snapshot.snapshot_epoch)
            != (self.state_epoch, self.snapshot_epoch)
            or self.table.get(
                delta_key(
                    self.group,
                    self.partition,
                    self.state_epoch,
                    self.snapshot_epoch,
                    self.delta_index,
                )
            )
            is not None
        ):
            return False
        self.fenced = None
        self.leader_epoch = leader_epoch
        return True

    def fence(self, reason: str) -> None:
        """Refuse every later write: this leader has been superseded (``reason`` says how).

        KIP-932 "Share-partition leader": the share coordinator refuses writes carrying an
        old state epoch with ``FENCED_STATE_EPOCH``; here the leader learns of its successor
        from the successor's fence in the request log (see :mod:`queueflow.engine.fencing`).
        """
        self.fenced = reason

    def _check_not_fenced(self) -> None:
        if self.fenced is not None:
            raise FencedStateEpochError(
                f"share-partition {self.where}: write with state epoch {self.state_epoch} "
                f"refused, this leader is fenced ({self.fenced}); it has stepped down and its "
                "successor owns the state"
            )

    def persist(self) -> bool:
        """Write what changed since the last call as one delta (or a snapshot when due).

        Returns:
            True if anything was written.

        Raises:
            FencedStateEpochError: this leader was fenced (:meth:`fence`); nothing is written.
        """
        self._check_not_fenced()
        parked = self._persist_parked()
        update = self.engine.take_changes()
        if update is None:
            return parked
        if update.reset or self.delta_index >= self.updates_per_snapshot:
            self.write_snapshot()
        else:
            self.table[
                delta_key(
                    self.group,
                    self.partition,
                    self.state_epoch,
                    self.snapshot_epoch,
                    self.delta_index,
                )
            ] = encode_update(
                update,
                snapshot_epoch=self.snapshot_epoch,
                state_epoch=self.state_epoch,
                delta_index=self.delta_index,
            )
            self.delta_index += 1
        self.writes += 1
        return True

    def _persist_parked(self) -> bool:
        """Write the parked keys of a key-ordered share-partition if they changed
        (:func:`~queueflow.protocol.state_codec.parked_keys_key`; docs/concepts.md
        "Key-ordered sharing"); True if written."""
        keys = self.engine.key_order
        parked = None if keys is None else keys.take_parked_changes()
        if parked is None:
            return False
        self.table[parked_keys_key(self.group, self.partition)] = encode_parked_keys(parked)
        return True

    def write_snapshot(self, next_state_epoch: bool = False) -> None:
        """Write a full snapshot with the next snapshot epoch and drop the superseded deltas.

        Args:
            next_state_epoch: take the next state epoch first (a new leader taking over).

        Raises:
            FencedStateEpochError: this leader was fenced (:meth:`fence`).
        """
        self._check_not_fenced()
        old_state_epoch, old_epoch, old_count = (
            self.state_epoch,
            self.snapshot_epoch,
            self.delta_index,
        )
        if next_state_epoch:
            self.state_epoch += 1
        self.engine.take_changes()
        start, batches = self.engine.snapshot()
        self.snapshot_epoch += 1
        self.table[snapshot_key(self.group, self.partition)] = encode_snapshot(
            ShareSnapshot(
                snapshot_epoch=self.snapshot_epoch,
                state_epoch=self.state_epoch,
                leader_epoch=self.leader_epoch,
                start_offset=start,
                batches=batches,
            )
        )
        for index in range(old_count):
            key = delta_key(self.group, self.partition, old_state_epoch, old_epoch, index)
            if self.table.get(key) is not None:
                del self.table[key]
        self.delta_index = 0

    def delete(self) -> None:
        """Delete the share-partition's durable state: its snapshot and the deltas written
        since (tombstones in the changelog). KIP-932 DeleteShareGroupState (the share
        coordinator's side of ``deleteShareGroupOffsets`` / ``deleteShareGroups``); the next
        request for the share-partition initialises it afresh (``share.auto.offset.reset``).

        Raises:
            FencedStateEpochError: this leader was fenced (:meth:`fence`); nothing is deleted.
        """
        self._check_not_fenced()
        for index in range(self.delta_index):
            key = delta_key(
                self.group, self.partition, self.state_epoch, self.snapshot_epoch, index
            )
            if self.table.get(key) is not None:
                del self.table[key]
        for key in (
            snapshot_key(self.group, self.partition),
            parked_keys_key(self.group, self.partition),
        ):
            if self.table.get(key) is not None:
                del self.table[key]
        self.delta_index = 0
        self.fenced = "its state was deleted by an admin request"
