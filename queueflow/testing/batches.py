"""Kafka v2 record batches of the in-process cluster's partitions, for its leaders' direct-path
answers (:class:`queueflow.server.record_cache.BatchSource`), built as Kafka stores them."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

from queueflow.structs import TopicPartition

__all__ = ["InProcessBatches", "record_batch"]

_CONTROL = 0x20


class _Stored(Protocol):
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str | bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class _Fetched:
    data: bytes
    high_watermark: int


def record_batch(offset: int, stored: _Stored, *, transactional: bool = False) -> bytes:
    """One batch holding the record at ``offset`` (``stored.value`` None: a control batch, as a
    transaction marker); a header name given as ``bytes`` is written as those bytes (not
    UTF-8: undecodable)."""
    builder = DefaultRecordBatchBuilder(
        2, 0, int(transactional), 1 if transactional else -1, 0, -1, 1 << 24
    )
    raw: list[tuple[bytes, bytes]] = []
    headers: list[tuple[str, bytes]] = []
    for name, value in stored.headers:
        if isinstance(name, bytes):  # a placeholder of the same length, replaced below
            placeholder = f"\x01qf{len(raw)}\x01".ljust(len(name), "\x01")[: len(name)]
            raw.append((placeholder.encode(), name))
            name = placeholder
        headers.append((name, value))
    builder.append(
        0, timestamp=stored.timestamp, key=stored.key, value=stored.value or b"", headers=headers
    )
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, offset)
    for placeholder_bytes, name in raw:
        at = bytes(data).index(placeholder_bytes, 61)
        data[at : at + len(name)] = name
    if stored.value is None:
        attributes = struct.unpack_from(">h", data, 21)[0] | _CONTROL
        struct.pack_into(">h", data, 21, attributes)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


class InProcessBatches:
    """Fetches of the in-memory partitions: one batch per offset, up to the last stable offset
    (whether a record past it is aborted is not known yet, and a batch says it for good).

    Args:
        records: partition -> its stored records.
        stable_end: partition -> its last stable offset.
        aborted: the aborted records (their batches are transactional).
    """

    def __init__(
        self,
        records: dict[TopicPartition, list[Any]],
        stable_end: Callable[[TopicPartition], int],
        aborted: set[tuple[TopicPartition, int]],
    ) -> None:
        self.records = records
        self.stable_end = stable_end
        self.aborted = aborted
        #: Fetches served (tests count them).
        self.fetches = 0

    async def fetch(self, tp: TopicPartition, offset: int, max_bytes: int) -> _Fetched:
        """Whole batches from ``offset`` on, about ``max_bytes`` (at least one)."""
        self.fetches += 1
        tp = TopicPartition(*tp)
        log: Sequence[Any] = self.records[tp]
        parts: list[bytes] = []
        size = 0
        for o in range(offset, min(len(log), self.stable_end(tp))):
            data = record_batch(o, log[o], transactional=(tp, o) in self.aborted)
            if parts and size + len(data) > max_bytes:
                break
            parts.append(data)
            size += len(data)
        return _Fetched(b"".join(parts), len(log))

    async def close(self) -> None:
        """Nothing to close."""
