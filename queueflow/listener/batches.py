"""Acquired records as Kafka record batches and ``AcquiredRecords`` ranges (KIP-932
"ShareFetch API"). Pure.

As Kafka's share-partition leader does, an answer returns whole record batches as the broker
stored them (possibly compressed, with their producer ids) and lets its ``AcquiredRecords``
ranges say which offsets this member acquired: clients deliver only those
(:func:`answer_records`). Where the queueflow member has no batch bytes (records it read
itself from the broker rather than got from a leader's direct-path answer) they are written
anew with kio's record-batch writer (:func:`record_batch`).
"""

from __future__ import annotations

import datetime
import io
import struct
from collections.abc import Sequence
from typing import cast

from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from queueflow.structs import ShareRecord

__all__ = ["acquired_ranges", "answer_records", "batch_spans", "record_batch"]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
#: Record-batch attribute bit: the timestamps are LogAppendTime.
_LOG_APPEND_TIME = 0x08
_NO_ATTRIBUTES = i8(0)
#: v2 record batch header: base offset, batch length (after these 12 bytes), leader epoch,
#: magic; the last offset delta at byte 23.
_HEAD = struct.Struct(">qiib")
_DELTA = struct.Struct(">i")
_DELTA_AT, _V2_HEADER_BYTES = 23, 61


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


def batch_spans(data: bytes) -> list[tuple[int, int]] | None:
    """``(first, last)`` offsets of each record batch of ``data`` (base offset, base offset
    plus last offset delta), in order; None when ``data`` is not a sequence of whole v2
    batches in increasing offset order (then it is not forwarded)."""
    spans: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    while pos < end:
        if pos + _V2_HEADER_BYTES > end:
            return None
        base, length, _epoch, magic = _HEAD.unpack_from(data, pos)
        size = 12 + length
        if magic != 2 or size < _V2_HEADER_BYTES or pos + size > end:
            return None
        (delta,) = _DELTA.unpack_from(data, pos + _DELTA_AT)
        if delta < 0 or (spans and base <= spans[-1][1]):
            return None
        spans.append((base, base + delta))
        pos += size
    return spans


def answer_records(
    records: Sequence[ShareRecord], batches: bytes
) -> tuple[bytes, list[tuple[int, int, int]]]:
    """The ``Records`` and ``AcquiredRecords`` of one share-partition's ShareFetch answer.

    Args:
        records: the acquired records to deliver, in offset order (what the queueflow member
            fetched: gaps and undecodable records are already acknowledged by it and left out).
        batches: record batches that hold the records inside their offset spans, as a leader
            carried them (``FetchResult.batches``), or ``b""``.

    Returns:
        ``(bytes, ranges)``: ``batches`` as they are, followed by a batch written anew of the
        records after their last offset (read by the member itself), when every record is
        either inside a batch or after them; otherwise (no batches, or records between or
        before them) every record written anew. ``ranges``: :func:`acquired_ranges` of
        ``records``, so a client skips every other offset of the forwarded batches (records
        of other members, already acknowledged, or not delivered here).
    """
    ranges = acquired_ranges(records)
    spans = batch_spans(batches) if batches and records else None
    if not spans:
        return record_batch(records), ranges
    rest = len(records)  # the first record after the last batch
    top = spans[-1][1]
    while rest and records[rest - 1].offset > top:
        rest -= 1
    i = 0
    for first, last in spans:  # each record before ``rest`` must lie inside a batch
        while i < rest and records[i].offset <= last:
            if records[i].offset < first:
                return record_batch(records), ranges
            i += 1
    if rest == len(records):
        return batches, ranges
    return batches + record_batch(records[rest:]), ranges
