"""An operator's release or skip of a parked key, as a pure handler (key-ordered share groups,
``share.ordering=key``; docs/concepts.md "Key-ordered sharing").

The coordinator forwards a :class:`~queueflow.protocol.messages.ParkedKeyRequest` to each
share-partition's leader as a :class:`~queueflow.protocol.messages.ResetSharePartition` with
``key_action`` set; the leader answers with a
:class:`~queueflow.protocol.messages.ResetSharePartitionResult` whose ``start_offset`` is the
number of records the skip Archived (0 for a release), or -1 when the key was not parked there.
"""

from __future__ import annotations

from queueflow.engine.key_order import show_hash
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader.results import LeaderResult, LogEvent

__all__ = ["act_on_key"]


def act_on_key(
    message: protocol.ResetSharePartition,
    durable: DurableSharePartition | None,
    *,
    partition: int,
    offset: int,
) -> LeaderResult:
    """Release (its waiting records proceed) or skip (its waiting records that the leader has
    read, up to ``share.partition.max.record.locks`` past the SPSO, are Archived, then it is
    free) the parked key ``message.key_hash`` of ``durable`` on behalf of
    the admin request read at request ``offset``.

    Raises:
        ShareGroupError: ``INVALID_REQUEST`` for a skip while the key index has not caught up
            with the in-flight records (just after a leader change: retry); nothing changed.
    """
    answer = protocol.ResetSharePartitionResult(
        group=message.group,
        topic=message.topic,
        partition=partition,
        admin_id=message.admin_id,
        request_id=message.request_id,
    )
    key = int(message.key_hash, 16)
    engine = None if durable is None else durable.engine
    order = None if engine is None else engine.key_order
    if durable is None or engine is None or order is None or not order.is_parked(key):
        return LeaderResult(coordinator_replies=(answer,))  # start_offset -1: not parked here
    skipped = 0
    if message.key_action == "skip":
        if order.indexed_end < engine.end_offset:
            raise ShareGroupError(
                ErrorCode.INVALID_REQUEST,
                f"the key index of {message.topic}[{partition}] has not caught up with its "
                "in-flight records yet (a new leader is reading them); retry the skip",
            )
        runs = ((r.first_offset, r.last_offset, r.state) for r in engine.in_flight())
        limit = engine.start_offset + engine.config.max_in_flight_records
        skipped = engine.archive_available(order.waiting(key, runs, engine.end_offset, limit))
    parked = order.release(key)
    assert parked is not None
    answer.start_offset = skipped
    log = LogEvent(
        "info",
        "parked_key_skipped" if message.key_action == "skip" else "parked_key_released",
        {
            "group": message.group,
            "partition": partition,
            "key": parked.key,
            "key_hash": show_hash(key),
            "parked_offset": parked.offset,
            "records_archived": skipped,
            "admin_id": message.admin_id,
        },
    )
    return LeaderResult(
        writes=(durable,),
        position=offset,
        flush=True,
        changed=True,
        logs=(log,),
        coordinator_replies=(answer,),
    )
