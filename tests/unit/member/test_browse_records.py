"""Browsing (docs/guide.md "Browsing"), in process: ``ShareConsumer.browse`` shows each record
with its share state, delivery count and lock, acquires nothing and changes no delivery count;
bad input is refused with a message saying what to do."""

from __future__ import annotations

import re

import pytest
from inprocess_helpers import TOPIC, produce, run, settings, settle

import queueflow
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.member.browse import BrowsedRecord
from queueflow.member.consumer import IllegalStateError
from queueflow.testing.inprocess import InProcessCluster


def states(records: list[BrowsedRecord]) -> list[tuple[int, str | None, int]]:
    return [(r.offset, r.state, r.delivery_count) for r in records]


def test_browse_shows_states_and_acquires_nothing() -> None:
    async def scenario() -> None:
        async with InProcessCluster({TOPIC: 1}, settings=settings()) as cluster:
            produce(cluster, 6)
            holder = cluster.consumer("g", acknowledgement_mode="explicit", max_poll_records=3)
            await holder.subscribe([TOPIC])
            held = await holder.poll(timeout_ms=2000)
            assert [r.offset for r in held] == [0, 1, 2]
            holder.acknowledge(held[1], queueflow.ACCEPT)
            holder.acknowledge(held[2], queueflow.REJECT)
            await holder.commit_sync()
            await settle(cluster)
            engine = cluster.share_partition("g", TOPIC, 0)
            before = list(engine.in_flight())
            acquisitions = cluster.metrics.acquisitions.labels("g", TOPIC, "0")._value.get()
            browser = cluster.consumer("g")  # not subscribed: browsing needs no membership
            seen = await browser.browse(TOPIC)
            assert [(r.offset, r.value) for r in seen] == [(o, b"r%d" % o) for o in range(6)]
            first = seen[0]
            assert (first.state, first.delivery_count) == ("ACQUIRED", 1)
            assert first.member_id == holder.member_id
            assert first.lock_deadline_ms == engine.record(0).lock_deadline_ms
            assert states(seen[1:]) == [
                (1, "ACKNOWLEDGED", 1),
                (2, "ARCHIVED", 1),
                (3, "AVAILABLE", 0),
                (4, "AVAILABLE", 0),
                (5, "AVAILABLE", 0),
            ]
            assert [r.member_id for r in seen[1:]] == [None] * 5
            # Nothing was acquired or changed by the browse.
            assert list(engine.in_flight()) == before
            assert cluster.metrics.acquisitions.labels("g", TOPIC, "0")._value.get() == (
                acquisitions
            )
            # One partition, from an offset, a bounded number of records.
            assert states(await browser.browse(TOPIC, 0, from_offset=4, max_records=1)) == [
                (4, "AVAILABLE", 0)
            ]
            # The records are delivered as if no browse had happened: 3..5 for the first
            # time, 0 (released when its holder leaves) for the second.
            await holder.close()
            taker = cluster.consumer("g", acknowledgement_mode="explicit")
            await taker.subscribe([TOPIC])
            counts: dict[int, int] = {}
            while len(counts) < 4:
                for r in await taker.poll(timeout_ms=500):
                    counts[r.offset] = r.delivery_count
                    taker.acknowledge(r, queueflow.ACCEPT)
            assert counts == {0: 2, 3: 1, 4: 1, 5: 1}
            await taker.close()
            await browser.close()
            with pytest.raises(IllegalStateError, match="closed"):
                await browser.browse(TOPIC)

    run(scenario())


def test_browse_of_a_topic_the_group_has_no_state_for_shows_no_state() -> None:
    async def scenario() -> None:
        async with InProcessCluster({TOPIC: 1, "other": 1}, settings=settings()) as cluster:
            cluster.produce("other", b"x")
            member = cluster.consumer("g")
            await member.subscribe([TOPIC])
            await member.close()
            (record,) = await cluster.consumer("g").browse("other")
            assert (record.state, record.delivery_count, record.shown_state) == (None, 0, "-")

    run(scenario())


@pytest.mark.parametrize(
    ("group", "topic", "kwargs", "error", "message"),
    [
        ("nobody", TOPIC, {}, ShareGroupError, "share group 'nobody' does not exist in app"),
        ("g", "no-such-topic", {}, ConfigurationError, "topic 'no-such-topic' does not exist"),
        ("g", TOPIC, {"partition": 3}, ConfigurationError, "has no partition 3 (partitions 0..0)"),
        ("g", TOPIC, {"partition": -1}, ConfigurationError, "give a partition number >= 0"),
        ("g", TOPIC, {"from_offset": -5}, ConfigurationError, "give an offset >= 0"),
        ("g", TOPIC, {"max_records": 0}, ConfigurationError, "give 1..10000 records"),
    ],
)
def test_bad_browses_say_what_to_do(
    group: str, topic: str, kwargs: dict[str, int], error: type[Exception], message: str
) -> None:
    async def scenario() -> None:
        async with InProcessCluster({TOPIC: 1}, settings=settings()) as cluster:
            member = cluster.consumer("g")
            await member.subscribe([TOPIC])
            await member.close()
            with pytest.raises(error, match=re.escape(message)) as raised:
                await cluster.consumer(group).browse(topic, **kwargs)
            if group == "nobody":
                assert isinstance(raised.value, ShareGroupError)
                assert raised.value.code is ErrorCode.GROUP_ID_NOT_FOUND
                assert "known groups: g" in str(raised.value)
                assert "'queueflow share-groups --list' lists them" in str(raised.value)

    run(scenario())


def test_a_reserved_owner_is_shown_as_the_leader_s_own_state() -> None:
    delayed = BrowsedRecord(TOPIC, 0, 5, None, b"v", (), 0, "ACQUIRED", 2, "__delayed__", 1500)
    dead = BrowsedRecord(TOPIC, 0, 6, None, b"v", (), 0, "ACQUIRED", 5, "__dead_letter__", 0)
    held = BrowsedRecord(TOPIC, 0, 7, None, b"v", (), 0, "ACQUIRED", 1, "member-1", 0)
    assert delayed.shown_state == "AVAILABLE (delayed until 1970-01-01T00:00:01.500Z)"
    assert dead.shown_state == "ARCHIVING (dead letter)"
    assert held.shown_state == "ACQUIRED"
