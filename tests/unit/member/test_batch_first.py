"""The batch-first data plane of a member: acknowledgements kept as offset runs
(:class:`~queueflow.member.acks.OutcomeRuns`), ShareRecords parsed straight from Kafka record
batches (:func:`~queueflow.member.reader.records_from_batches`) with ``check.crcs``, and
histogram observations added per ShareFetch (:class:`~queueflow.metrics.PendingObservations`).
"""

from __future__ import annotations

import random
import struct
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.consumer.fetcher import READ_UNCOMMITTED, PartitionRecords
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition as KafkaTopicPartition
from inprocess_helpers import TOPIC, events, run, settings, until
from prometheus_client import CollectorRegistry, Histogram
from structlog.testing import capture_logs
from test_undecodable_records import bad_batch

from queueflow._compat import tolerate_undecodable_records, undecodable_records
from queueflow.member.acks import AcknowledgementBuffer, OutcomeRuns, to_wire
from queueflow.member.reader import records_from_batches, share_records
from queueflow.metrics import PendingObservations
from queueflow.protocol.messages import AckError
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster, _RecordSource

TP = TopicPartition("t", 0)
ACCEPT, RELEASE, REJECT = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT


# -- acknowledgements as offset runs -----------------------------------------------------------
def test_outcomes_in_offset_order_are_one_run() -> None:
    buffer = AcknowledgementBuffer()
    for offset in range(100, 600):
        buffer.add(TP, offset, ACCEPT)
    assert buffer._pending[TP].runs == [[100, 599, ACCEPT]]
    assert buffer.pending(TP) == 500
    assert buffer.take(TP) == [(100, 599, (1,))]
    assert buffer.pending(TP) == 0 and buffer.partitions() == []


def test_a_range_is_one_run_whatever_its_length() -> None:
    buffer = AcknowledgementBuffer()
    buffer.add_range(TP, 0, 9_999, ACCEPT)
    buffer.add_range(TP, 10_000, 10_004, REJECT)
    assert buffer._pending[TP].runs == [[0, 9_999, ACCEPT], [10_000, 10_004, REJECT]]
    assert buffer.pending(TP) == 10_005
    assert buffer.take(TP) == [(0, 9_999, (1,)), (10_000, 10_004, (3,))]


@pytest.mark.parametrize("seed", range(20))
def test_runs_equal_the_per_offset_outcomes_in_any_order(seed: int) -> None:
    """Out of order, overlapping, overwritten: the runs are what a per-offset map (a later
    outcome wins) folds into, and the count is its size."""
    rng = random.Random(seed)
    runs = OutcomeRuns()
    model: dict[int, AcknowledgeType] = {}
    for _ in range(200):
        first = rng.randrange(0, 120)
        last = first + rng.choice([0, 0, 0, 1, 3, 10])
        kind = rng.choice([ACCEPT, ACCEPT, RELEASE, REJECT, AcknowledgeType.GAP])
        runs.add(first, last, kind)
        for offset in range(first, last + 1):
            model[offset] = kind
        assert len(runs) == len(model)
        assert runs.wire() == to_wire(model)
        probe = rng.randrange(-2, 135)
        assert (probe in runs) == (probe in model)


def test_a_range_replaces_the_errors_and_options_of_its_offsets() -> None:
    buffer = AcknowledgementBuffer()
    buffer.add(TP, 5, RELEASE, AckError(type="E", message="boom"), delay_ms=100)
    buffer.add_range(TP, 4, 6, ACCEPT)
    acks = buffer.take(TP)
    assert acks == [(4, 6, (1,))]
    assert buffer.errors_for(TP, acks) == [] and buffer.options(TP, acks) == ([], [])


def test_a_newer_outcome_wins_over_a_failed_request_put_back() -> None:
    buffer = AcknowledgementBuffer()
    buffer.add_range(TP, 0, 9, ACCEPT)
    sent = buffer.take(TP)
    buffer.add(TP, 3, REJECT)
    buffer.restore(TP, sent)
    assert buffer.take(TP) == [(0, 2, (1,)), (4, 9, (1,))]  # the repeat, alone, first
    assert buffer.take(TP) == [(3, 3, (3,))]


def test_an_empty_range_is_refused() -> None:
    with pytest.raises(ValueError, match="empty offset range"):
        OutcomeRuns().add(5, 4, ACCEPT)


# -- records straight from record batches ------------------------------------------------------
def build(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]],
    base_offset: int,
    compression_type: int = 0,
    offset_deltas: list[int] | None = None,
) -> bytes:
    """A v2 record batch as a fetch answer carries it (aiokafka's builder)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression_type,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 22,
    )
    for i, (key, value, headers) in enumerate(records):
        delta = offset_deltas[i] if offset_deltas else i
        builder.append(
            delta, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=headers
        )
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)  # outside the CRC
    return bytes(data)


def eager(data: bytes, acquired: list[tuple[int, int, int]]) -> list[ShareRecord]:
    """The records as the consumer's path builds them (a ConsumerRecord each, then
    share_records), for comparison."""
    tolerate_undecodable_records()
    tp = KafkaTopicPartition("t", 0)
    out: list[ShareRecord] = []
    for first, last, count in acquired:
        with undecodable_records():
            messages = list(
                PartitionRecords(
                    tp, MemoryRecords(data), [], first, None, None, True, READ_UNCOMMITTED
                )
            )
        share_records(messages, "t", 0, first, last, count, out, [])
    for r in out:
        r.delivered_at = 0.0
    return out


SAMPLE: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
    (b"k0", b"v0", []),
    (None, b"v1", [("a", b"1"), ("b", b"")]),
    (b"k2", None, [("h", b"x" * 300)]),
    (None, None, []),
    (b"", b"", [("dup", b"1"), ("dup", b"2")]),
    (b"k5", b"v" * 5000, []),
]


@pytest.mark.parametrize("compression", [0, 1], ids=["none", "gzip"])
def test_records_from_batches_equal_the_consumers_records(compression: int) -> None:
    data = build(SAMPLE, 1_000, compression) + build(SAMPLE, 1_006, compression)
    acquired = [(1_000, 1_011, 2)]
    records, gaps, bad = records_from_batches(data, "t", 0, acquired)
    assert records == eager(data, acquired) and len(records) == 12
    assert gaps == [] and bad == []
    first = records[1]
    assert (first.key, first.value, first.raw_value, first.headers) == (
        None,
        b"v1",
        b"v1",
        (("a", b"1"), ("b", b"")),
    )
    assert (records[3].key, records[3].value, records[3].delivery_count) == (None, None, 2)
    assert records[0].timestamp == 1_700_000_000_000 and records[0].timestamp_type == 0


def test_only_acquired_offsets_are_returned_and_the_holes_are_gaps() -> None:
    # Offsets 0..9 with 3 and 4 compacted away; two acquired ranges, one past the data.
    deltas = [0, 1, 2, 5, 6, 7, 8, 9]
    data = build([(None, b"v%d" % d, []) for d in deltas], 0, offset_deltas=deltas)
    acquired = [(1, 4, 1), (7, 12, 3)]
    records, gaps, bad = records_from_batches(data, "t", 0, acquired)
    got = [(r.offset, r.delivery_count) for r in records]
    assert got == [(1, 1), (2, 1), (7, 3), (8, 3), (9, 3)]
    assert gaps == [3, 4, 10, 11, 12] and bad == []
    assert records == [r for r in eager(data, [(1, 4, 1), (7, 9, 3)])]


def test_an_undecodable_record_is_reported_apart_with_its_reason() -> None:
    data = bad_batch(40, {2})
    records, gaps, bad = records_from_batches(data, "t", 0, [(40, 44, 1)])
    assert [r.offset for r in records] == [40, 41, 43, 44] and gaps == []
    ((record, reason),) = bad
    assert record.offset == 42 and "UTF-8" in reason


def test_a_corrupted_batch_fails_its_crc_check_and_returns_nothing() -> None:
    data = bytearray(build(SAMPLE, 7))
    data[-3] ^= 0xFF  # a byte of the last record's value
    with pytest.raises(CorruptRecordException, match=r"t\[0\].* offset 7 fails its CRC check"):
        records_from_batches(bytes(data), "t", 0, [(7, 12, 1)])
    # check.crcs=false: read as it is (what Kafka's consumer does too).
    records, _, _ = records_from_batches(bytes(data), "t", 0, [(7, 12, 1)], check_crcs=False)
    assert len(records) == 6 and records[5].value != SAMPLE[5][1]


def test_the_reader_passes_check_crcs_to_its_consumer() -> None:
    from queueflow.kafka.config import KafkaClientConfig
    from queueflow.member.context import KafkaMemberIO
    from queueflow.member.reader import KafkaRecordReader

    async def scenario() -> None:
        kafka = KafkaClientConfig("localhost:1")
        for check in (True, False):
            source = KafkaMemberIO(kafka, "app", check_crcs=check).record_source()
            assert isinstance(source, KafkaRecordReader) and source.check_crcs is check
            partition_reader = source._reader_for(TP, read_committed=False)
            # never started: no connection; stopped, so its consumer is not left unclosed
            await partition_reader.consumer.stop()
            assert partition_reader.consumer._check_crcs is check

    run(scenario())
    assert settings().check_crcs is True


def test_a_corrupted_batch_read_once_costs_its_first_offset_one_delivery() -> None:
    """The reader's consumer raises CorruptRecordException for a batch that fails its CRC (a
    plain one: the offset is not known, so the first acquired one is taken): the share agent
    passes none of the fetch's records to the handler, ACCEPTs none; the first offset is
    RELEASEd as a failed delivery (its count rises), the rest undelivered, and it logs
    corrupt_record_batch_released; the second read is clean and each record is handled once."""
    clock = FakeClock()
    handled: list[tuple[int, int]] = []
    reads = 0
    original = _RecordSource.read

    async def corrupt_once(self: _RecordSource, *args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        if reads == 1:
            raise CorruptRecordException("Invalid CRC - jobs-0")
        return await original(self, *args, **kwargs)

    async def handler(record: ShareRecord) -> None:
        handled.append((record.offset, record.delivery_count))

    async def scenario() -> None:
        async with InProcessCluster({TOPIC: 1}, clock=clock, settings=settings()) as cluster:
            for i in range(5):
                cluster.produce(TOPIC, b"r%d" % i)
            with capture_logs() as logs:
                agent = await cluster.agent(handler, TOPIC, "g")
                await until(lambda: len(handled) == 5, "every record handled", clock)
                view = cluster.share_partition
                await until(lambda: int(view("g", TOPIC, 0).start_offset) == 5, "settled", clock)
            assert sorted(handled) == [(0, 2)] + [(o, 1) for o in range(1, 5)]
            assert agent.stats.accepted == 5
            (failed,) = events(logs, "corrupt_record_batch_released")
            assert failed["offset"] == 0 and "Invalid CRC" in failed["error"]
            assert not events(logs, "share_fetch_failed")

    mp = pytest.MonkeyPatch()
    mp.setattr(_RecordSource, "read", corrupt_once)
    try:
        run(scenario())
    finally:
        mp.undo()


def test_a_batch_corrupt_in_the_log_is_archived_at_the_delivery_count_limit() -> None:
    """Offset 2 is in a batch that fails its CRC on every read (corrupt in the log): the
    records around it are handled once each; offset 2 never reaches the handler, its delivery
    count rises on each fetch and the leader archives it at share.delivery.count.limit (was:
    RELEASEd undelivered and acquired again forever); counted in queueflow_handler_errors_total
    {reason="corrupt_batch"}."""
    from queueflow.member.reader import CorruptRecords

    clock = FakeClock()
    handled: list[tuple[int, int]] = []
    original = _RecordSource.read

    async def corrupt_at_2(self: _RecordSource, tp: Any, acquired: Any, *args: Any) -> Any:
        if not any(first <= 2 <= last for first, last, _ in acquired):
            return await original(self, tp, acquired, *args)
        before = [(f, min(last, 1), c) for f, last, c in acquired if f < 2]
        read = await original(self, tp, before, *args) if before else ([], [], [])
        raise CorruptRecords(2, read, "Invalid CRC - jobs-0")

    async def handler(record: ShareRecord) -> None:
        handled.append((record.offset, record.delivery_count))

    async def scenario() -> None:
        group_settings = settings(delivery_count_limit=3)
        async with InProcessCluster({TOPIC: 1}, clock=clock, settings=group_settings) as cluster:
            for i in range(5):
                cluster.produce(TOPIC, b"r%d" % i)
            with capture_logs() as logs:
                await cluster.agent(handler, TOPIC, "g")
                view = cluster.share_partition
                await until(
                    lambda: (
                        view("g", TOPIC, 0) is not None
                        and int(view("g", TOPIC, 0).start_offset) == 5
                    ),
                    "every offset settled",
                    clock,
                )
            assert sorted(handled) == [(0, 1), (1, 1), (3, 1), (4, 1)]
            released = events(logs, "corrupt_record_batch_released")
            assert [e["offset"] for e in released] == [2, 2, 2]
            assert [e["delivery_count"] for e in released] == [1, 2, 3]
            assert view("g", TOPIC, 0).archived_total >= 1
            errors = cluster.metrics.handler_errors.labels("g", TOPIC, "corrupt_batch")
            assert errors._value.get() == 3

    mp = pytest.MonkeyPatch()
    mp.setattr(_RecordSource, "read", corrupt_at_2)
    try:
        run(scenario())
    finally:
        mp.undo()


# -- histogram observations added per ShareFetch -----------------------------------------------
def test_pending_observations_equal_observe_once_flushed() -> None:
    registry = CollectorRegistry()
    a = Histogram("a", "a", ("g",), buckets=(0.01, 0.1, 1.0), registry=registry).labels("x")
    b = Histogram("b", "b", ("g",), buckets=(0.01, 0.1, 1.0), registry=registry).labels("x")
    pending = PendingObservations(b)
    amounts = [0.0, 0.01, 0.05, 0.1, 0.5, 1.0, 3.0, 0.01]
    for amount in amounts:
        a.observe(amount)
        pending.observe(amount)
    a.observe(0.2)
    a.observe(0.2)
    a.observe(0.2)
    pending.observe(0.2, 3)
    assert registry.get_sample_value("b_count", {"g": "x"}) == 0  # nothing before the flush
    pending.flush()
    pending.flush()  # nothing twice
    for suffix, labels in [("_count", {}), ("_sum", {})] + [
        ("_bucket", {"le": le}) for le in ("0.01", "0.1", "1.0", "+Inf")
    ]:
        want = registry.get_sample_value("a" + suffix, {"g": "x", **labels})
        got = registry.get_sample_value("b" + suffix, {"g": "x", **labels})
        assert got == pytest.approx(want), suffix + str(labels)


def transactional(
    base_offset: int, producer_id: int, values: list[bytes], control: bool = False
) -> bytes:
    """A transactional v2 batch of ``producer_id``; ``control``: a control batch whose records
    are the ``values`` (e.g. an abort marker), its attributes and CRC set as a broker's."""
    from aiokafka.record.util import calc_crc32c

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=1,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        key = value if control else None
        builder.append(
            i, timestamp=1_700_000_000_000, key=key, value=b"" if control else value, headers=[]
        )
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if control:
        attributes = struct.unpack_from(">h", data, 21)[0] | 0x20
        struct.pack_into(">h", data, 21, attributes)
        struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


def test_control_batches_are_gaps_and_aborted_transactions_too_when_listed() -> None:
    abort = struct.pack(">HH", 0, 0)
    data = (
        transactional(0, 7, [b"a0", b"a1", b"a2"])
        + transactional(3, 7, [abort], control=True)
        + build([(None, b"c4", []), (None, b"c5", [])], 4)
    )
    acquired = [(0, 5, 1)]
    # read_uncommitted: the aborted records are read; the marker is a gap.
    records, gaps, _ = records_from_batches(data, "t", 0, acquired)
    assert [r.value for r in records] == [b"a0", b"a1", b"a2", b"c4", b"c5"] and gaps == [3]
    # read_committed: the aborted transaction listed by the fetch makes its records gaps.
    records, gaps, _ = records_from_batches(data, "t", 0, acquired, aborted_transactions=[(7, 0)])
    assert [r.value for r in records] == [b"c4", b"c5"] and gaps == [0, 1, 2, 3]


def test_raw_records_skip_the_consumer_record_and_give_the_same_share_records() -> None:
    """Inside raw_records() (the reader's reads) the fetched partition's iteration hands over
    the parser's records, and share_records makes the same ShareRecords from them as from
    ConsumerRecords; outside it (another task, Faust's consumers) ConsumerRecords as before."""
    from aiokafka.structs import ConsumerRecord

    from queueflow._compat import raw_records

    data = build(SAMPLE, 50, 1)
    tp = KafkaTopicPartition("t", 0)

    def iterate() -> list[Any]:
        return list(
            PartitionRecords(tp, MemoryRecords(data), [], 50, None, None, True, READ_UNCOMMITTED)
        )

    with raw_records():
        raw = iterate()
    assert raw and not any(isinstance(m, ConsumerRecord) for m in raw)
    assert all(isinstance(m, ConsumerRecord) for m in iterate())
    out: list[ShareRecord] = []
    share_records(raw, "t", 0, 50, 55, 1, out, [])
    for r in out:
        r.delivered_at = 0.0
    assert out == eager(data, [(50, 55, 1)])


class _CorruptLog:
    """A consumer over offsets ``0..size-1`` whose ``corrupt`` offsets sit in a batch that
    fails its CRC: ``getmany`` raises when it reaches one (aiokafka moves its position past
    the records it had collected and drops them)."""

    def __init__(self, size: int, corrupt: set[int]) -> None:
        self.size, self.corrupt, self.pos, self.calls = size, corrupt, 0, 0

    def seek(self, tp: Any, offset: int) -> None:
        self.pos = offset

    async def position(self, tp: Any) -> int:
        return self.pos

    async def getmany(self, tp: Any, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        self.calls += 1
        out, offset = [], self.pos
        while len(out) < max_records and offset < self.size:
            if offset in self.corrupt:
                self.pos = offset
                raise CorruptRecordException(f"Invalid CRC - {tp}")
            out.append(
                SimpleNamespace(
                    offset=offset, key=None, value=b"v", headers=[], timestamp=0, timestamp_type=0
                )
            )
            offset += 1
        self.pos = offset
        return {tp: out}


@pytest.mark.parametrize(("corrupt", "at"), [({5, 6}, 5), ({0}, 0), ({9}, 9)])
def test_the_reader_reads_up_to_a_corrupt_batch_and_names_its_offset(
    corrupt: set[int], at: int
) -> None:
    from queueflow.kafka.config import KafkaClientConfig
    from queueflow.member.reader import CorruptRecords, PartitionReader

    async def scenario() -> None:
        reader = PartitionReader(KafkaClientConfig("localhost:1"), "t", 0)
        await reader.consumer.stop()  # never started; replaced by the fake log
        reader.consumer = _CorruptLog(10, corrupt)  # type: ignore[assignment]
        with pytest.raises(CorruptRecords) as caught:
            await reader._read([(0, 9, 1)], 5_000)
        records, gaps, bad = caught.value.read
        assert caught.value.offset == at and isinstance(caught.value, CorruptRecordException)
        assert [r.offset for r in records] == list(range(at)) and not gaps and not bad
        assert reader.position == -1  # the next read seeks

    run(scenario())
