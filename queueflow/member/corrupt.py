"""Records in a Kafka record batch that fails its CRC check (``check.crcs``): failed
deliveries, not a loop.

A batch corrupted on the way reads clean the next time; one corrupted in the log fails every
time. So the first offset the read could not get (:class:`~queueflow.member.reader.
CorruptRecords`) is RELEASEd as a failed delivery: its delivery count rises on each try, and at
``share.delivery.count.limit`` the leader archives it (KIP-932 "Delivery count", dead-lettered
with reason ``delivery_limit`` where the group has a dead-letter topic). The records read before
it are delivered as usual; the acquired offsets after it are RELEASEd undelivered (never read,
their delivery given back, docs/concepts.md "Delivery counts"), so only the corrupt records
ever count, one offset per fetch. Each is counted in
``queueflow_handler_errors_total{reason="corrupt_batch"}`` and logged
(``corrupt_record_batch_released``, at most 20 lines per 10 s): nothing is lost silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiokafka.errors import CorruptRecordException

from queueflow.member.reader import CorruptRecords, ReadResult
from queueflow.protocol import messages as protocol
from queueflow.structs import AcknowledgeType, TopicPartition

if TYPE_CHECKING:
    from queueflow.member.session import ShareFetchSession

__all__ = ["release_corrupt"]


def release_corrupt(
    session: ShareFetchSession,
    tp: TopicPartition,
    acquired: Sequence[protocol.WireAcquired],
    exc: CorruptRecordException,
) -> ReadResult:
    """The read of ``acquired`` (ranges ``(first, last, delivery_count)`` in offset order) of
    ``tp`` failed its CRC check with ``exc``: RELEASE the corrupt offset as a failed delivery
    and the offsets after it undelivered (see the module docstring), count and log it.

    Returns:
        What was read before the corrupt batch (a :class:`CorruptRecords`' ``read``; nothing
        for another source's plain ``CorruptRecordException``, whose corrupt offset is taken
        to be the first acquired one).
    """
    if isinstance(exc, CorruptRecords):
        offset, read = exc.offset, exc.read
    else:
        offset, read = acquired[0][0], ([], [], [])
    delivery_count = 0
    for first, last, count in acquired:
        if first <= offset <= last:
            delivery_count = count
        for o in range(max(first, offset), last + 1):
            session.acks.add(tp, o, AcknowledgeType.RELEASE, undelivered=o != offset)
    session.ctx.metrics.handler_errors.labels(session.group, tp.topic, "corrupt_batch").inc()
    suppressed = session._undecodable_log.admit()
    if suppressed is not None:
        session._log.error(
            "corrupt_record_batch_released",
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            delivery_count=delivery_count,
            error=str(exc),
            suppressed=suppressed,
            note="a record batch fails its CRC check (check.crcs): this offset is RELEASEd as "
            "a failed delivery and archived at share.delivery.count.limit; the records before "
            "it are delivered, those after it go back undelivered",
        )
    return read
