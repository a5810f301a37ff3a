"""Produce and Fetch, listed in ApiVersions but refused.

librdkafka turns on record batches of magic 2 (and sets the versions of its ShareFetch and
ShareAcknowledge requests) only when a broker lists Produce v3+ and Fetch v4+ (its feature
check, ``RD_KAFKA_FEATURE_MSGVER2`` in librdkafka's ``rdkafka_feature.c``); without them it
fails every ShareFetch with "Required feature not supported by broker". So the listener lists
the lowest of each (Produce v3, Fetch v4) and answers them with ``INVALID_REQUEST`` on every
partition: a listener serves share groups, not produce or plain fetch (use the Kafka cluster).
Pure."""

from __future__ import annotations

import datetime
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i32, i64

from queueflow.listener.apis import FETCH, PRODUCE

__all__ = ["refused_fetch", "refused_produce"]

_ZERO = datetime.timedelta(0)
_REFUSED = ErrorCode.invalid_request


def refused_produce(version: int, request: Any) -> Any:
    """The Produce answer (v3): every partition ``INVALID_REQUEST``, nothing written."""
    m = load_payload_module(PRODUCE, version, EntityType.response)
    return m.ProduceResponse(
        responses=tuple(
            m.TopicProduceResponse(
                name=t.name,
                partition_responses=tuple(
                    m.PartitionProduceResponse(
                        index=p.index,
                        error_code=_REFUSED,
                        base_offset=i64(-1),
                        log_append_time=None,
                    )
                    for p in t.partition_data
                ),
            )
            for t in request.topic_data
        ),
        throttle_time=_ZERO,
    )


def refused_fetch(version: int, request: Any) -> Any:
    """The Fetch answer (v4): every partition ``INVALID_REQUEST``, no records."""
    m = load_payload_module(FETCH, version, EntityType.response)
    return m.FetchResponse(
        throttle_time=_ZERO,
        responses=tuple(
            m.FetchableTopicResponse(
                topic=t.topic,
                partitions=tuple(
                    m.PartitionData(
                        partition_index=i32(p.partition),
                        error_code=_REFUSED,
                        high_watermark=i64(-1),
                        aborted_transactions=None,
                        records=None,
                    )
                    for p in t.partitions
                ),
            )
            for t in request.topics
        ),
    )
