"""The worked examples of KIP-932 (seed 000), replayed step by step on the engine.

1. "Managing durable share-partition state" -> "Examples": the table of operations on offsets
   100-121, from "Starting state of topic-partition with latest offset 100" to "Acknowledge
   111,112" (SPSO=120, SPEO=121).
2. "In-flight records example": the figure of offsets 0-9 with SPSO=2.

After every step the test compares the SPSO, the SPEO and the state and delivery count of every
offset of the example against the table.
"""

from __future__ import annotations

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    AcquiredRecords,
    RecordState,
    SharePartition,
    SharePartitionConfig,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    replay,
)

AV = RecordState.AVAILABLE
AQ = RecordState.ACQUIRED
AK = RecordState.ACKNOWLEDGED
AR = RecordState.ARCHIVED

Spec = dict[tuple[int, int], tuple[RecordState, int]]


def expect_state(sp: SharePartition, spso: int, speo: int, spec: Spec, offsets: range) -> None:
    """Check SPSO, SPEO and (state, delivery count) of every offset in ``offsets``.

    ``spec`` maps inclusive offset ranges to (state, count) and must cover every in-flight offset
    (SPSO..SPEO-1). Offsets before the SPSO must be reported Archived with count 0, and offsets at
    or after the SPEO Available with count 0 (KIP-932 "In-flight records").
    """
    assert (sp.start_offset, sp.end_offset) == (spso, speo)
    expected: dict[int, tuple[RecordState, int]] = {}
    for (first, last), value in spec.items():
        for o in range(first, last + 1):
            assert o not in expected, f"spec covers {o} twice"
            expected[o] = value
    for o in range(spso, speo):
        assert o in expected, f"spec does not cover in-flight offset {o}"
    actual: dict[int, tuple[RecordState, int]] = {}
    for o in offsets:
        view = sp.record(o)
        actual[o] = (view.state, view.delivery_count)
        if o < spso:
            expected.setdefault(o, (AR, 0))
        elif o >= speo:
            expected.setdefault(o, (AV, 0))
    assert actual == {o: expected[o] for o in offsets}
    # The run view agrees with the per-record view, and covers exactly SPSO..SPEO-1.
    covered = [o for run in sp.in_flight() for o in range(run.first_offset, run.last_offset + 1)]
    assert covered == list(range(spso, speo))
    assert sp.in_flight_count == speo - spso


def ack(
    sp: SharePartition, member: str, first: int, last: int, kind: AcknowledgeType, now: int
) -> None:
    sp.acknowledge(member, [AcknowledgementBatch(first, last, (kind,))], now)


def test_durable_state_examples_table() -> None:
    """KIP-932 "Managing durable share-partition state" -> "Examples", row by row.

    Mapping of the table to engine calls (members: A fetches 100-109, B fetches 110-119,
    C fetches "110, 120", D fetches "111,112"; time in ms):

    * "Fetch records 100-109"  -> ``acquire("A", 500, log_end_offset=110, now=0)``.
    * "Fetch records 110-119"  -> three acquire calls by B at now=1000, which together fetch
      110-119 (log end 120): ``max_records=1`` (110), then ``max_records=2`` with a 1000 ms
      consumer lock (111-112), then the rest (113-119) with the default 30000 ms lock. This makes
      "Lock timeout elapsed 111, 112" exactly ``expire_locks(2000)``: only 111-112 have
      deadline 2000 (110 is re-acquired later with its own lock).
    * "Release 110" / "Acknowledge ..." -> ``acknowledge`` with RELEASE / ACCEPT by the owner.
    * "Fetch records 110, 120" -> ``acquire("C", 500, log_end_offset=121, now=1500)``.
    * "Fetch records 111,112"  -> ``acquire("D", 500, log_end_offset=121, now=2500)``.
    """
    sp = SharePartition(SharePartitionConfig(), start_offset=100)
    offsets = range(98, 124)
    start = ShareSnapshot(0, 0, 0, 100, ())
    updates: list[ShareUpdate] = []

    def check(spso: int, speo: int, spec: Spec) -> None:
        expect_state(sp, spso, speo, spec, offsets)
        # Durability follows every step: replaying all updates gives the snapshot.
        update = sp.take_changes()
        if update is not None:
            updates.append(update)
        assert replay(start, updates) == sp.snapshot()

    # Starting state of topic-partition with latest offset 100: SPSO=100, SPEO=100.
    check(100, 100, {})
    assert sp.take_changes() is None

    # Fetch records 100-109: SPEO=110, records 100-109 (acquired, delivery count 1).
    got = sp.acquire("A", 500, log_end_offset=110, now_ms=0)
    assert got == [AcquiredRecords(100, 109, 1)]
    check(100, 110, {(100, 109): (AQ, 1)})
    assert sp.run_count == 1  # one batch, one run (KIP-932 "Batching")

    # Acknowledge 100-109: SPSO=110.
    ack(sp, "A", 100, 109, AcknowledgeType.ACCEPT, 10)
    check(110, 110, {})
    assert sp.snapshot() == (110, ())

    # Fetch records 110-119: SPEO=120, records 110-119 (acquired, delivery count 1).
    assert sp.acquire("B", 1, 120, 1000) == [AcquiredRecords(110, 110, 1)]
    assert sp.acquire("B", 2, 120, 1000, lock_duration_ms=1000) == [AcquiredRecords(111, 112, 1)]
    assert sp.acquire("B", 500, 120, 1000) == [AcquiredRecords(113, 119, 1)]
    check(110, 120, {(110, 119): (AQ, 1)})

    # Release 110: record 110 (available, delivery count 1).
    ack(sp, "B", 110, 110, AcknowledgeType.RELEASE, 1100)
    check(110, 120, {(110, 110): (AV, 1), (111, 119): (AQ, 1)})

    # Acknowledge 119: records 111-118 acquired, record 119 acknowledged.
    ack(sp, "B", 119, 119, AcknowledgeType.ACCEPT, 1200)
    check(110, 120, {(110, 110): (AV, 1), (111, 118): (AQ, 1), (119, 119): (AK, 1)})

    # Fetch records 110, 120: SPEO=121, record 110 (acquired, delivery count 2),
    # record 120 (acquired, delivery count 1).
    got = sp.acquire("C", 500, log_end_offset=121, now_ms=1500)
    assert got == [AcquiredRecords(110, 110, 2), AcquiredRecords(120, 120, 1)]
    check(
        110,
        121,
        {(110, 110): (AQ, 2), (111, 118): (AQ, 1), (119, 119): (AK, 1), (120, 120): (AQ, 1)},
    )

    # Lock timeout elapsed 111, 112: records 111-112 (available, delivery count 1).
    assert sp.next_lock_deadline() == 2000
    assert sp.expire_locks(1999) == 0
    assert sp.expire_locks(2000) == 2
    check(
        110,
        121,
        {
            (110, 110): (AQ, 2),
            (111, 112): (AV, 1),
            (113, 118): (AQ, 1),
            (119, 119): (AK, 1),
            (120, 120): (AQ, 1),
        },
    )

    # Acknowledge 113-118: records 113-118 acknowledged.
    ack(sp, "B", 113, 118, AcknowledgeType.ACCEPT, 2100)
    check(
        110,
        121,
        {(110, 110): (AQ, 2), (111, 112): (AV, 1), (113, 119): (AK, 1), (120, 120): (AQ, 1)},
    )

    # Fetch records 111,112: records 111-112 (acquired, delivery count 2).
    assert sp.acquire("D", 500, log_end_offset=121, now_ms=2500) == [AcquiredRecords(111, 112, 2)]
    check(110, 121, {(110, 112): (AQ, 2), (113, 119): (AK, 1), (120, 120): (AQ, 1)})

    # Acknowledge 110: SPSO=111.
    ack(sp, "C", 110, 110, AcknowledgeType.ACCEPT, 2600)
    check(111, 121, {(111, 112): (AQ, 2), (113, 119): (AK, 1), (120, 120): (AQ, 1)})

    # Acknowledge 111,112: SPSO=120; SPSO=120, SPEO=121, record 120 (acquired, delivery count 1).
    ack(sp, "D", 111, 112, AcknowledgeType.ACCEPT, 2700)
    check(120, 121, {(120, 120): (AQ, 1)})

    # Durable form at the end: the SPSO and record 120 with its count of 1 and C's lock.
    assert sp.snapshot() == (120, (StateBatch(120, 120, AQ, 1, "C", 31_500),))
    assert sp.record(120).member_id == "C"


FIGURE: Spec = {
    (2, 2): (AQ, 1),
    (3, 3): (AV, 2),
    (4, 4): (AQ, 1),
    (5, 5): (AK, 1),
    (6, 6): (AR, 1),
}

# What queueflow persists for the figure. KIP-932: "the durable state contains the SPSO position,
# the non-zero delivery count for offset 3, the Acknowledged state of offset 5, and the Archived
# state of offset 6". queueflow also persists the Acquired records 2 and 4 with their delivery
# count and lock (owner A, deadline): the count is bumped durably at acquisition, so a crash while
# a poison record is being processed cannot under-count its deliveries, and a new leader keeps
# A's locks instead of redelivering 2 and 4 while A still processes them.
FIGURE_DURABLE = (
    2,
    (
        StateBatch(2, 2, AQ, 1, "A", 30_000),
        StateBatch(3, 3, AV, 2),
        StateBatch(4, 4, AQ, 1, "A", 30_000),
        StateBatch(5, 5, AK, 1),
        StateBatch(6, 6, AR, 1),
    ),
)


def test_in_flight_records_example_by_operations() -> None:
    """KIP-932 "In-flight records example", reached by fetches and acknowledgements only.

    queueflow's SPEO is the first offset never fetched, so 7 and 8 (Available, never delivered)
    lie beyond it: the engine reaches SPSO=2 with SPEO=7 rather than the figure's 9. Every
    offset 0-9 still reports exactly the figure's state and delivery count (offsets at or after
    the SPEO are Available with count 0). The next test reaches SPEO=9 exactly.
    """
    sp = SharePartition(SharePartitionConfig(), start_offset=0)
    # A consumer fetches 0-6 (delivery count 1) ...
    assert sp.acquire("A", 7, log_end_offset=7, now_ms=0) == [AcquiredRecords(0, 6, 1)]
    # ... accepts 0, rejects 1 (both then leave the in-flight records: "All records earlier than
    # offset 2 are in Archived state"), releases 3, accepts 5, rejects 6 and keeps 2 and 4.
    A = AcknowledgeType
    sp.acknowledge(
        "A",
        [
            AcknowledgementBatch(0, 1, (A.ACCEPT, A.REJECT)),
            AcknowledgementBatch(3, 3, (A.RELEASE,)),
            AcknowledgementBatch(5, 6, (A.ACCEPT, A.REJECT)),
        ],
        10,
    )
    # "Record 3 has previously been acquired twice ... but went back into Available state".
    assert sp.acquire("B", 1, log_end_offset=7, now_ms=20) == [AcquiredRecords(3, 3, 2)]
    ack(sp, "B", 3, 3, AcknowledgeType.RELEASE, 30)

    expect_state(sp, 2, 7, FIGURE, range(0, 10))
    assert sp.record(2).member_id == "A" and sp.record(4).member_id == "A"
    assert sp.acquired_count == 2 and sp.available_count == 1
    assert sp.snapshot() == FIGURE_DURABLE


def test_in_flight_records_example_exact_speo() -> None:
    """The figure exactly (SPSO=2, SPEO=9): 7-8 in flight, Available and never delivered.

    Records can be in flight with delivery count 0 only when restored from durable state whose
    batches reach past them (e.g. written by a leader that had already read 7-8 from the log).
    From that restored state, one consumer fetches 2-4 and releases 3.
    """
    durable = [
        StateBatch(3, 3, AV, 1),
        StateBatch(5, 5, AK, 1),
        StateBatch(6, 6, AR, 1),
        StateBatch(7, 8, AV, 0),
    ]
    sp = SharePartition.restore(SharePartitionConfig(), 2, durable)
    assert (sp.start_offset, sp.end_offset) == (2, 9)
    got = sp.acquire("A", 3, log_end_offset=20, now_ms=0)
    assert got == [
        AcquiredRecords(2, 2, 1),
        AcquiredRecords(3, 3, 2),
        AcquiredRecords(4, 4, 1),
    ]
    ack(sp, "A", 3, 3, AcknowledgeType.RELEASE, 10)

    expect_state(sp, 2, 9, {**FIGURE, (7, 8): (AV, 0)}, range(0, 10))
    assert sp.available_count == 3  # 3, 7 and 8
    # 7 and 8 have delivery count 0, so they are not persisted.
    assert sp.snapshot() == FIGURE_DURABLE
