"""Acquired records as Kafka record batches and ``AcquiredRecords`` ranges (KIP-932
"ShareFetch API"), written with kio's record-batch writer. Pure."""

from __future__ import annotations

import datetime
import io
from collections.abc import Sequence
from typing import cast

from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from queueflow.structs import ShareRecord

__all__ = ["acquired_ranges", "record_batch"]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
#: Record-batch attribute bit: the timestamps are LogAppendTime.
_LOG_APPEND_TIME = 0x08
_NO_ATTRIBUTES = i8(0)


def record_batch(records: Sequence[ShareRecord]) -> bytes:
    """One uncompressed v2 record batch of ``records`` (one share-partition's, in increasing
    offset order; gaps allowed), no producer id; b"" when there are none."""
    if not records:
        return b""
    log_append = any(r.timestamp_type == 1 for r in records)
    # Per record only what differs: offsets and timestamps come from Kafka, in range, so
    # they are cast to kio's types rather than checked again (most of the cost per record).
    instants: dict[int, TZAwareMicros] = {}
    batch = NewRecordBatch(
        producer_id=i64(-1),
        producer_epoch=i16(-1),
        base_sequence=i32(-1),
        attributes=i16(_LOG_APPEND_TIME if log_append else 0),
        records=tuple(
            Record(
                attributes=_NO_ATTRIBUTES,
                timestamp=instants.get(r.timestamp) or _instant(r.timestamp, instants),
                offset=cast(i64, r.offset),
                key=r.raw_key,
                value=r.raw_value,
                headers=tuple(
                    RecordHeader(key=name.encode(), value=value) for name, value in r.headers
                )
                if r.headers
                else (),
            )
            for r in records
        ),
    )
    buffer = io.BytesIO()
    write_new_batch(buffer, batch)
    return buffer.getvalue()


def _instant(timestamp_ms: int, seen: dict[int, TZAwareMicros]) -> TZAwareMicros:
    """The datetime kio's writer wants for a timestamp in ms, kept in ``seen`` (records of a
    batch often share their millisecond). Half a millisecond more: the writer truncates
    ``datetime.timestamp() * 1000``, whose float error would otherwise turn some timestamps
    into the millisecond before. UTC and not before 1970: what TZAwareMicros requires."""
    instant = _EPOCH + datetime.timedelta(milliseconds=max(timestamp_ms, 0), microseconds=500)
    seen[timestamp_ms] = cast(TZAwareMicros, instant)
    return seen[timestamp_ms]


def acquired_ranges(records: Sequence[ShareRecord]) -> list[tuple[int, int, int]]:
    """``(first_offset, last_offset, delivery_count)`` runs of consecutive offsets with the
    same delivery count, in offset order (``records`` sorted by offset)."""
    ranges: list[tuple[int, int, int]] = []
    for r in records:
        if ranges and ranges[-1][1] == r.offset - 1 and ranges[-1][2] == r.delivery_count:
            first, _, count = ranges[-1]
            ranges[-1] = (first, r.offset, count)
        else:
            ranges.append((r.offset, r.offset, r.delivery_count))
    return ranges
