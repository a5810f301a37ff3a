"""The value types every layer shares: records, acknowledge types and topic-partitions.

Standard library only, so that the engine and the protocol can use them without pulling in
Kafka clients. One definition of each: import them from here (or from :mod:`queueflow`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["AcknowledgeType", "ShareRecord", "TopicPartition"]


class TopicPartition(NamedTuple):
    """A topic-partition ``(topic, partition)``.

    A named tuple, so it equals and hashes like a plain ``(topic, partition)`` tuple and like
    :class:`aiokafka.TopicPartition` (also a ``(topic, partition)`` named tuple).
    """

    topic: str
    partition: int


class AcknowledgeType(enum.IntEnum):
    """How a consumer acknowledges a record (KIP-932 ShareAcknowledge ``AcknowledgeTypes``).

    Wire values as in Kafka's ``AcknowledgeType``; ``GAP`` (0) marks an offset that has no
    record, e.g. removed by compaction or a transaction marker. ``RENEW`` (4, KIP-1222) keeps
    the record Acquired by the same member and extends its acquisition lock: the record still
    needs a final ACCEPT, RELEASE or REJECT.
    """

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


@dataclass(slots=True)
class ShareRecord:
    """A record delivered to a share-group member.

    Attributes:
        topic / partition / offset: where the record lives.
        key / value: the raw bytes (``value`` is replaced by the decoded value for share agents).
        headers: sequence of (name, bytes), as the Kafka client returned them.
        timestamp: the record's timestamp in ms.
        delivery_count: how many times it has been delivered, this delivery included (KIP-932).
        raw_value / raw_key: the bytes as read from Kafka, before any decoding.
        lock_deadline: ``time.monotonic()`` seconds by which this member must have acknowledged
            it: the ShareFetch's send time plus the acquisition lock duration, so at or before
            the leader's own deadline (``inf`` when unknown).
        timestamp_type: Kafka's timestamp type of ``timestamp``: 0 CreateTime, 1 LogAppendTime.
        delivered_at: ``time.monotonic()`` seconds when the member read it after the ShareFetch
            answer that acquired it (0.0 when unknown); the start of the acknowledgement latency.
    """

    topic: str
    partition: int
    offset: int
    key: Any
    value: Any
    headers: Sequence[tuple[str, bytes]]
    timestamp: int
    delivery_count: int
    raw_value: bytes | None = field(default=None, repr=False)
    raw_key: bytes | None = field(default=None, repr=False)
    lock_deadline: float = field(default=math.inf, repr=False)
    timestamp_type: int = field(default=0, repr=False)
    delivered_at: float = field(default=0.0, repr=False, compare=False)
