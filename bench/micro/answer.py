"""The Kafka-protocol listener's ShareFetch answer from a leader's carried bytes, µs per record.

What the listener's queueflow member does with one share-partition's direct-path answer and
what the listener then sends: the carried bytes (v2 batches of 125 records of a 1 KiB value,
uncompressed, as S11's producer writes them, with fewer records per batch; ``listener_batches``
of them per repeat, all acquired) parsed, then the ShareFetch v1 answer's partition built and
the whole answer encoded with kio (:func:`queueflow.listener.codec.encode_response`):

* ``listener.answer.reencode``: as before forwarding: the eager parse
  (:func:`queueflow.member.reader.records_from_batches`, CRC checked), then every record written
  anew with kio's writer (:func:`queueflow.listener.batches.record_batch`) and its
  ``AcquiredRecords``;
* ``listener.answer.forward``: now: lazy views (:func:`queueflow.member.lazy_records.
  lazy_records_from_batches`, CRC checked, never decoded) and the carried bytes forwarded
  (:func:`queueflow.listener.batches.answer_records`);
* ``listener.answer.ratio``: forward ÷ reencode of each interleaved pair (unit ``ratio``).

No network, no leader, no client: the listener's own CPU per record of answer building.
"""

from __future__ import annotations

import datetime
import gc
import time
from collections.abc import Callable
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i64

from bench.micro.timing import Result, Sizes, summarize
from queueflow.listener.batches import acquired_ranges, answer_records, record_batch
from queueflow.listener.codec import encode_response
from queueflow.listener.metadata import TopicIds
from queueflow.member.lazy_records import lazy_records_from_batches
from queueflow.member.reader import records_from_batches

__all__ = ["BENCHMARKS", "bench_answer", "carried"]

#: Records per batch: S11's producer (bench/harness.py: ``batch.size`` 512 KiB, ``linger.ms``
#: 20) writes batches of up to about 500 records of 1 KiB; 125 is what the listener's earlier
#: ``record_batch`` figure in docs/performance.md used.
BATCH_RECORDS = 125
VALUE_BYTES = 1024
TOPIC, PARTITION = "jobs", 0
_M = load_payload_module(78, 1, EntityType.response)
_TOPIC_ID = TopicIds("bench").id_of(TOPIC)


def carried(batches: int) -> bytes:
    """``batches`` v2 batches of :data:`BATCH_RECORDS` records from offset 0, as a leader
    carries them."""
    parts = []
    for b in range(batches):
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 24)
        for i in range(BATCH_RECORDS):
            builder.append(
                i, timestamp=1_700_000_000_000 + i, key=None, value=b"x" * VALUE_BYTES, headers=[]
            )
        data = bytearray(builder.build())
        data[0:8] = (b * BATCH_RECORDS).to_bytes(8, "big")  # outside the CRC
        parts.append(bytes(data))
    return b"".join(parts)


def _answer(data: bytes, ranges: list[tuple[int, int, int]]) -> bytes:
    """The encoded ShareFetch v1 answer of one share-partition."""
    partition = _M.PartitionData(
        partition_index=i32(PARTITION),
        error_code=ErrorCode.none,
        error_message=None,
        acknowledge_error_code=i16(0),
        acknowledge_error_message=None,
        current_leader=_M.LeaderIdAndEpoch(leader_id=i32(0), leader_epoch=i32(0)),
        records=data,
        acquired_records=tuple(
            _M.AcquiredRecords(
                first_offset=i64(first), last_offset=i64(last), delivery_count=i16(count)
            )
            for first, last, count in ranges
        ),
    )
    response = _M.ShareFetchResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        error_message=None,
        acquisition_lock_timeout=datetime.timedelta(seconds=30),
        responses=(_M.ShareFetchableTopicResponse(topic_id=_TOPIC_ID, partitions=(partition,)),),
        node_endpoints=(_M.NodeEndpoint(node_id=i32(0), host="127.0.0.1", port=i32(9192)),),
    )
    return encode_response(1, response)


def _reencode(data: bytes, acquired: list[tuple[int, int, int]]) -> bytes:
    records, _gaps, _bad = records_from_batches(data, TOPIC, PARTITION, acquired)
    return _answer(record_batch(records), acquired_ranges(records))


def _forward(data: bytes, acquired: list[tuple[int, int, int]]) -> bytes:
    records, _gaps, _bad = lazy_records_from_batches(data, TOPIC, PARTITION, acquired)
    return _answer(*answer_records(records, data))


def _timed(call: Callable[[], object], units: int) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1e6 / units


def bench_answer(sizes: Sizes) -> list[Result]:
    n = sizes.listener_batches * BATCH_RECORDS
    data = carried(sizes.listener_batches)
    acquired = [(0, n - 1, 1)]
    ways: dict[str, Callable[[bytes, list[Any]], bytes]] = {
        "reencode": _reencode,
        "forward": _forward,
    }
    if data not in _forward(data, acquired) or data in _reencode(data, acquired):
        raise AssertionError("the forwarded answer does not hold the carried bytes as they are")
    samples: dict[str, list[float]] = {"reencode": [], "forward": []}
    gc.collect()
    gc.disable()
    try:
        for i in range(sizes.repeats):
            order = ["reencode", "forward"] if i % 2 == 0 else ["forward", "reencode"]
            for name in order:
                samples[name].append(_timed(lambda w=ways[name]: w(data, acquired), n))
    finally:
        gc.enable()
    whats = {
        "reencode": "carried bytes -> eager records -> a batch written anew (kio) -> answer",
        "forward": "carried bytes -> lazy views -> the bytes forwarded -> answer",
    }
    out = [summarize(f"listener.answer.{w}", "record", n, samples[w], whats[w]) for w in ways]
    ratios = [f / r for f, r in zip(samples["forward"], samples["reencode"], strict=True)]
    out.append(
        summarize("listener.answer.ratio", "ratio", n, ratios, "forward / reencode of each pair")
    )
    return out


#: Name prefix -> the function that runs those benchmarks.
BENCHMARKS: dict[str, Callable[[Sizes], list[Result]]] = {"listener": bench_answer}
