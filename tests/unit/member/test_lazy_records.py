"""Lazy record views (:mod:`queueflow.member.lazy_records`) agree with the eager parse
(:func:`queueflow.member.reader.records_from_batches`) on every field, for generated fetch
answers: v2 batches compressed (gzip) or not, with headers, null keys and values, compacted
(non-contiguous) batches, control batches, and acquired ranges that cut batches anywhere."""

from __future__ import annotations

import copy
import pickle
import struct
from dataclasses import fields
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inprocess_helpers import TOPIC as SOURCE
from inprocess_helpers import direct_cluster, eventually, run

from queueflow.errors import ConfigurationError
from queueflow.member.agent import ShareAgent
from queueflow.member.lazy_records import (
    LazyShareRecord,
    UndecodableRecordError,
    lazy_records_from_batches,
)
from queueflow.member.reader import records_from_batches
from queueflow.structs import ShareRecord
from queueflow.testing.inprocess import InProcessCluster

TOPIC, PARTITION = "jobs", 3
GZIP = 1
CONTROL = 0x20  # the control-batch bit of a v2 batch's attributes

payload = st.one_of(st.none(), st.binary(max_size=12))
headers = st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3)
record = st.tuples(payload, payload, headers, st.integers(0, 2**40))
batch = st.fixed_dictionaries(
    {
        "records": st.lists(record, min_size=1, max_size=8),
        "compression": st.sampled_from([0, GZIP]),
        "compacted": st.booleans(),  # leave every other offset out
        "control": st.booleans(),
    }
)


def build(batches: list[dict[str, Any]], base: int) -> tuple[bytes, int]:
    """The batches as a fetch answer carries them, from offset ``base``; and the next
    offset after them."""
    out = b""
    for spec in batches:
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=spec["compression"],
            is_transactional=int(spec["control"]),
            producer_id=7 if spec["control"] else -1,
            producer_epoch=0 if spec["control"] else -1,
            base_sequence=-1,
            batch_size=1 << 20,
        )
        step = 2 if spec["compacted"] and len(spec["records"]) > 1 else 1
        delta = 0
        for key, value, hdrs, ts in spec["records"]:
            if spec["control"]:  # a commit marker's key: version 0, type 1
                key, value, hdrs = struct.pack(">hh", 0, 1), b"\0\0\0\0\0\0", []
            builder.append(delta, timestamp=ts, key=key, value=value, headers=hdrs)
            delta += step
        data = bytearray(builder.build())
        struct.pack_into(">q", data, 0, base)
        if spec["control"]:
            (attributes,) = struct.unpack_from(">h", data, 21)
            struct.pack_into(">h", data, 21, attributes | CONTROL)
            struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
        out += bytes(data)
        base += delta - step + 1
    return out, base


def ranges_from(cuts: list[int], end: int, base: int) -> list[tuple[int, int, int]]:
    """Disjoint acquired ranges inside ``base..end-1`` from sorted cut points."""
    points = sorted({base + c % max(end - base, 1) for c in cuts})
    out = []
    for i in range(0, len(points) - 1, 2):
        out.append((points[i], points[i + 1], 1 + i % 3))
    return out or [(base, end - 1, 1)]


def fields_of(r: ShareRecord) -> tuple[Any, ...]:
    return tuple(getattr(r, f.name) for f in fields(ShareRecord))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(batch, min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 1000), max_size=6),
    base=st.integers(0, 2**40),
)
def test_lazy_and_eager_views_agree_on_every_field(
    batches: list[dict[str, Any]], cuts: list[int], base: int
) -> None:
    data, end = build(batches, base)
    acquired = ranges_from(cuts, end, base)
    times = {"lock_deadline": 123.5, "delivered_at": 7.25}
    eager = records_from_batches(data, TOPIC, PARTITION, acquired, **times)
    lazy = lazy_records_from_batches(data, TOPIC, PARTITION, acquired, **times)
    assert [r.offset for r in lazy[0]] == [r.offset for r in eager[0]]
    assert lazy[1] == eager[1]  # gaps: control, compacted, past the end
    assert lazy[2] == eager[2] == []
    again = lazy_records_from_batches(data, TOPIC, PARTITION, acquired, **times)[0]
    for view, plain, other in zip(lazy[0], eager[0], again, strict=True):
        assert fields_of(view) == fields_of(plain)
        assert type(view) is ShareRecord  # decoded: a plain record from then on
        assert other == plain and plain == other
    fresh = lazy_records_from_batches(data, TOPIC, PARTITION, acquired, **times)[0]
    for view, plain in zip(fresh, eager[0], strict=True):
        assert repr(view) == repr(plain)
    fresh = lazy_records_from_batches(data, TOPIC, PARTITION, acquired, **times)[0]
    assert pickle.loads(pickle.dumps(fresh)) == eager[0]
    fresh = lazy_records_from_batches(data, TOPIC, PARTITION, acquired, **times)[0]
    assert copy.deepcopy(fresh) == eager[0] and [copy.copy(r) for r in fresh] == eager[0]


def test_a_handler_that_touches_only_offsets_decodes_nothing() -> None:
    data, end = build(
        [
            {
                "records": [(b"k", b"v", [("h", b"x")], 5)] * 4,
                "compression": 0,
                "compacted": False,
                "control": False,
            }
        ],
        100,
    )
    records, gaps, _ = lazy_records_from_batches(data, TOPIC, PARTITION, [(100, end - 1, 2)])
    assert [r.offset for r in records] == [100, 101, 102, 103] and gaps == []
    assert all(type(r) is LazyShareRecord for r in records)
    assert [r.delivery_count for r in records] == [2] * 4
    assert records[2].value == b"v"  # one access decodes the whole batch
    assert all(type(r) is ShareRecord for r in records)
    records[0].value = "decoded"  # a decoder may replace the value; raw_value stays
    assert records[0].raw_value == b"v"


def test_a_lazy_batch_agent_gets_views_over_the_carried_records() -> None:
    """``lazy_records=True`` on the direct path: the handler's records are views (nothing
    decoded before it touches one) and every record is handled and ACCEPTed once."""
    seen: list[tuple[int, bool]] = []
    values: list[bytes] = []

    async def handler(records: list[ShareRecord]) -> None:
        seen.extend((r.offset, type(r) is LazyShareRecord) for r in records)
        if records[0].offset == 0:
            values.append(records[0].value)

    async def scenario() -> None:
        async with direct_cluster(records=12) as cluster:
            agent = ShareAgent(
                cluster.member_context, handler, SOURCE, "g", batch=True, lazy_records=True
            )
            await agent.start()
            try:
                await eventually(lambda: agent.stats.accepted >= 12, "12 records accepted")
            finally:
                await agent.stop()

    run(scenario())
    assert sorted(o for o, _lazy in seen) == list(range(12))
    assert all(lazy for _o, lazy in seen) and values == [b"r0"]


def test_lazy_records_needs_a_batch_handler() -> None:
    async def handler(record: ShareRecord) -> None:
        return None

    cluster = InProcessCluster({SOURCE: 1})
    with pytest.raises(ConfigurationError, match="lazy_records=True needs batch=True"):
        ShareAgent(cluster.member_context, handler, SOURCE, "g", lazy_records=True)


def test_an_undecodable_record_raises_on_every_access_and_the_others_decode() -> None:
    """A header name that is not UTF-8: the first touch of the batch raises once, the other
    records are decoded by it, the bad one raises on every access (so a batch handler's
    retry-alone isolates it)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(3):
        hdrs = [("XYbad", b"h")] if i == 1 else [("ok", b"1")]
        builder.append(i, timestamp=1, key=None, value=b"v%d" % i, headers=hdrs)
    raw = bytearray(bytes(builder.build()).replace(b"XYbad", b"\xff\xfebad"))
    struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))  # the CRC, made right again
    data = bytes(raw)
    records, _gaps, _bad = lazy_records_from_batches(data, TOPIC, PARTITION, [(0, 2, 1)])
    with pytest.raises(UndecodableRecordError, match="offset 1"):
        records[0].value  # noqa: B018
    assert records[0].value == b"v0" and records[2].headers == (("ok", b"1"),)
    for _ in range(2):
        with pytest.raises(UndecodableRecordError, match="offset 1"):
            records[1].value  # noqa: B018
    eager = records_from_batches(data, TOPIC, PARTITION, [(0, 2, 1)])
    assert [r.offset for r in eager[0]] == [0, 2] and [r.offset for r, _ in eager[2]] == [1]
