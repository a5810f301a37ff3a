"""The share-partition engine (:class:`queueflow.engine.SharePartition`) alone, as a leader
drives it: no Faust, no Kafka, no wire encoding.

* ``engine.accept.b{1,100,500}``: ``acquire`` of a batch of 1, 100 or 500 new records, then
  ``acknowledge`` of the batch with ACCEPT as one range (KIP-932 ``AcknowledgementBatches``),
  then ``take_changes`` as the leader's persistence does after every request: µs per record.
* ``engine.release10.b100``: the same with batches of 100 and every tenth acknowledged record
  RELEASEd (one acknowledgement batch per run, as a member sends them): released records are
  acquired again by later fetches (up to the delivery count limit); µs per record acquired.
* ``engine.expire.idle``: ``expire_locks`` with 10,000 records in flight and no lock due (what the
  leader's ticker does almost every time): µs per call.
* ``engine.expire.all``: ``expire_locks`` when the locks of all 10,000 records in flight
  (20 acquisitions of 500 by 4 members) are due: µs per record released.

The clock moves 1 ms per fetch. Acquisition limits are lifted
(``share.member.max.acquisition.rate=0``) so that the engine's own cost is measured.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

from bench.micro.timing import Result, Sizes, sample, summarize
from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    SharePartition,
    SharePartitionConfig,
)

__all__ = ["BENCHMARKS"]

#: First offset of the share-partitions (realistic offsets, not small cached ints).
START = 1_000_000
#: Exclusive log end: "the log always has more records".
LOG_END = 1 << 60
#: The members holding the records in flight for the lock-expiry tick.
MEMBERS = tuple(f"member-{i}" for i in range(4))
ACCEPT = (AcknowledgeType.ACCEPT,)
RELEASE = (AcknowledgeType.RELEASE,)


def _config(in_flight: int = 2_000) -> SharePartitionConfig:
    return SharePartitionConfig(
        max_in_flight_records=max(in_flight, 100),
        member_max_in_flight_records=min(max(in_flight, 1_000), 10_000),
        member_max_acquisition_rate=0,
    )


def _accept_cycles(sp: SharePartition, batch: int, records: int, clock: list[int]) -> None:
    """``records // batch`` fetches of ``batch`` records, each ACCEPTed as one range."""
    member = MEMBERS[0]
    acquire, acknowledge, take = sp.acquire, sp.acknowledge, sp.take_changes
    now = clock[0]
    for _ in range(records // batch):
        now += 1
        acks = [
            AcknowledgementBatch(r.first_offset, r.last_offset, ACCEPT)
            for r in acquire(member, batch, LOG_END, now)
        ]
        acknowledge(member, acks, now)
        take()
    clock[0] = now


def _release_cycles(
    sp: SharePartition, batch: int, records: int, clock: list[int], counter: list[int]
) -> int:
    """Fetches of ``batch`` records until ``records`` were acquired; every tenth acknowledged
    record (counted across fetches) is RELEASEd. Returns the records acquired."""
    member = MEMBERS[0]
    acquired = 0
    now = clock[0]
    seen = counter[0]
    while acquired < records:
        now += 1
        acks: list[AcknowledgementBatch] = []
        for r in sp.acquire(member, batch, LOG_END, now):
            first = r.first_offset
            for offset in range(r.first_offset, r.last_offset + 1):
                seen += 1
                if seen % 10 == 0:
                    if offset > first:
                        acks.append(AcknowledgementBatch(first, offset - 1, ACCEPT))
                    acks.append(AcknowledgementBatch(offset, offset, RELEASE))
                    first = offset + 1
            if first <= r.last_offset:
                acks.append(AcknowledgementBatch(first, r.last_offset, ACCEPT))
            acquired += r.last_offset - r.first_offset + 1
        sp.acknowledge(member, acks, now)
        sp.take_changes()
    clock[0], counter[0] = now, seen
    return acquired


def _fill(in_flight: int, now: int) -> SharePartition:
    """A share-partition with ``in_flight`` records Acquired by :data:`MEMBERS`, in fetches of
    500 one ms apart (each fetch its own lock deadline), changes taken."""
    sp = SharePartition(_config(in_flight), START)
    members = itertools.cycle(MEMBERS)
    for i in range(in_flight // 500 or 1):
        sp.acquire(next(members), min(500, in_flight), LOG_END, now + i)
        sp.take_changes()
    return sp


def bench_accept(sizes: Sizes) -> list[Result]:
    out = []
    for batch in (1, 100, 500):
        records = max(sizes.engine_records // (10 if batch == 1 else 1), batch)
        records -= records % batch
        sp = SharePartition(_config(), START)
        clock = [0]
        _accept_cycles(sp, batch, records, clock)  # warm-up
        samples = sample(
            functools.partial(_accept_cycles, sp, batch, records, clock),
            units=records,
            repeats=sizes.repeats,
        )
        what = f"acquire {batch} + acknowledge ACCEPT (one range) + take_changes"
        out.append(summarize(f"engine.accept.b{batch}", "record", records, samples, what))
    return out


def bench_release(sizes: Sizes) -> list[Result]:
    batch, records = 100, max(sizes.engine_records, 100)
    sp = SharePartition(_config(), START)
    clock, counter = [0], [0]
    _release_cycles(sp, batch, records, clock, counter)  # warm-up (a steady redelivery flow)
    done: list[int] = []
    samples = sample(
        lambda: done.append(_release_cycles(sp, batch, records, clock, counter)),
        units=records,
        repeats=sizes.repeats,
    )
    # A fetch may acquire a few more than asked for the last one: correct per repeat.
    samples = [s * records / d for s, d in zip(samples, done, strict=True)]
    what = "acquire 100 + acknowledge, every 10th record RELEASEd (redelivered later)"
    return [summarize("engine.release10.b100", "record", records, samples, what)]


def bench_expire(sizes: Sizes) -> list[Result]:
    n = sizes.in_flight
    lock = _config(n).record_lock_duration_ms
    sp = _fill(n, 0)
    calls = max(sizes.calls, 100)

    def idle() -> None:
        expire = sp.expire_locks
        for t in range(calls):
            expire(t)  # every deadline is >= lock duration: nothing due

    idle_samples = sample(idle, units=calls, repeats=sizes.repeats)
    state: list[SharePartition] = []

    def fresh() -> None:
        state[:] = [_fill(n, 0)]

    def expire_all() -> None:
        state[0].expire_locks(lock + n)

    all_samples = sample(expire_all, units=n, repeats=sizes.repeats, setup=fresh)
    return [
        summarize(
            "engine.expire.idle",
            "call",
            calls,
            idle_samples,
            f"expire_locks with {n:,} in flight, none due",
        ),
        summarize(
            "engine.expire.all",
            "record",
            n,
            all_samples,
            f"expire_locks releasing {n:,} in flight ({n // 500 or 1} deadlines)",
        ),
    ]


#: Name prefix -> the function that runs those benchmarks.
BENCHMARKS: dict[str, Callable[[Sizes], list[Result]]] = {
    "engine.accept": bench_accept,
    "engine.release10": bench_release,
    "engine.expire": bench_expire,
}
