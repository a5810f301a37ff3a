"""A share-partition kept in memory across a rebalance (``RETAINED``) is served again from memory
only when no other leader can have served it meanwhile; after a membership-lease lapse, a
step-down or a missed generation it is reloaded from the table, with its successor's writes
(docs/architecture.md "Keeping a partition across a rebalance")."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueflow.engine.fencing import (
    ack_advances_recovery,
    generations_continuous,
    write_ownership,
)
from queueflow.engine.partition import AcknowledgementBatch
from queueflow.server.durable import DurableSharePartition
from queueflow.server.group_configs import LeaderGroupConfigs
from queueflow.server.leader.cache import SharePartitionCache, SharePartitionState
from queueflow.settings import ShareGroupSettings
from queueflow.structs import AcknowledgeType

TOPIC = "jobs"
KEY = ("g", 0)
ACCEPT = AcknowledgeType.ACCEPT


async def _start(group: str, partition: int) -> tuple[int, int]:
    return 0, 0


def leader(table: dict[bytes, bytes], generation: int) -> SharePartitionCache:
    return SharePartitionCache(
        table, TOPIC, LeaderGroupConfigs(ShareGroupSettings()), 100, lambda p: generation, _start
    )


def get(cache: SharePartitionCache) -> DurableSharePartition:
    return asyncio.run(cache.get(*KEY))


def holding_ten(cache: SharePartitionCache) -> DurableSharePartition:
    """The share-partition of ``cache`` with records 0..9 Acquired by member "m", persisted."""
    durable = get(cache)
    durable.engine.acquire("m", 10, log_end_offset=10, now_ms=0)
    durable.persist()
    return durable


def test_a_share_partition_is_reloaded_not_resumed_after_a_lease_lapse() -> None:
    # A is cut off from the broker, its lease lapses, B leads the partition and accepts
    # records 0..9, then the rebalance after the heal gives the partition back to A.
    table: dict[bytes, bytes] = {}
    a = leader(table, generation=1)
    mine = holding_ten(a)
    a.drop({0}, "its partition was revoked by a Faust rebalance", resumable=False)
    assert a.state(KEY) is SharePartitionState.UNLOADED
    assert mine.fenced is not None  # a request still running can't write
    b = leader(table, generation=2)
    successor = get(b)
    successor.engine.acknowledge("m", [AcknowledgementBatch(0, 9, (ACCEPT,))], now_ms=1)
    successor.persist()
    a.forget_retained({0}, 3)
    back = get(a)
    assert back is not mine
    assert (back.engine.start_offset, back.state_epoch) == (10, 2)  # B's writes, B's epoch + 1


def test_a_plain_revocation_while_the_lease_held_keeps_the_share_partition_in_memory() -> None:
    table: dict[bytes, bytes] = {}
    a = leader(table, generation=1)
    mine = holding_ten(a)
    a.drop({0}, "its partition was revoked by a Faust rebalance")
    assert a.state(KEY) is SharePartitionState.RETAINED
    a.forget_retained({0}, 2)
    assert get(a) is mine
    assert mine.engine.acquired_count == 10


def test_a_retained_share_partition_is_forgotten_after_a_missed_generation() -> None:
    table: dict[bytes, bytes] = {}
    a = leader(table, generation=1)
    holding_ten(a)
    a.forget_retained({0}, 1)
    a.drop({0}, "its partition was revoked by a Faust rebalance")
    a.forget_retained({0}, 3)  # generation 2 happened without this worker
    assert a.state(KEY) is SharePartitionState.UNLOADED


def test_an_unresumable_drop_also_forgets_what_an_earlier_drop_retained() -> None:
    table: dict[bytes, bytes] = {}
    a = leader(table, generation=1)
    holding_ten(a)
    a.drop({0}, "revoked")
    a.drop({0}, "a newer leader's fence", resumable=False)
    assert a.state(KEY) is SharePartitionState.UNLOADED


@pytest.mark.parametrize(
    ("written", "acked", "advances"),
    [
        (2, 2, True),  # the same ownership
        (2, None, False),  # acknowledged after the lease lapsed
        (2, 3, False),  # acknowledged after a rebalance
        (None, None, False),  # made while the lease had lapsed (or before it was proven)
        (None, 3, False),
    ],
)
def test_only_an_ack_under_the_writes_own_ownership_advances_recovery(
    written: int | None, acked: int | None, advances: bool
) -> None:
    assert ack_advances_recovery(written, acked) is advances


@given(st.integers(0, 1000), st.one_of(st.none(), st.integers(-10_000, 10_000)))
def test_write_ownership_is_the_generation_while_the_lease_holds(
    generation: int, remaining_ms: int | None
) -> None:
    held = remaining_ms is None or remaining_ms > 0
    assert write_ownership(generation, remaining_ms) == (generation if held else None)


@given(st.one_of(st.none(), st.integers(0, 1000)), st.integers(0, 1002))
def test_generations_are_continuous_only_one_by_one_or_repeated(
    previous: int | None, current: int
) -> None:
    assert generations_continuous(previous, current) is (
        previous is None or current in (previous, previous + 1)
    )
