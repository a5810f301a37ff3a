"""Key-ordered sharing on the real broker (docs/concepts.md "Key-ordered sharing"): many members
on one partition handle each key in offset order and never one key at two members at once; a
REJECT parks its key, ``queueflow share-groups --release-key`` / ``--skip-key`` free it, and a
parked key survives a leader restart that recovers from the changelogs."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import queueflow
from queueflow import ShareConsumer
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.devtools.cli import cli
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
}
MEMBER_SETTINGS = {"group.share.heartbeat.interval.ms": 500, "max.poll.records": 20}
RECORDS, KEYS, MEMBERS = 3000, 100, 6


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two 1-partition topics (3,000 records over 100 keys; a small one to park keys on), led
    by one leader worker."""
    big, small = (f"qf-keys-{name}-{uuid.uuid4().hex[:8]}" for name in ("big", "small"))
    create_topic(kafka_bootstrap, big, 1)
    create_topic(kafka_bootstrap, small, 1)
    rng = random.Random(24)
    keys = [f"acct-{rng.randrange(KEYS)}" for _ in range(RECORDS)]
    asyncio.run(
        produce_records(
            kafka_bootstrap, big, [f"{i}" for i in range(RECORDS)], keys=keys, partition=0
        )
    )
    small_keys = ["a", "b", "a", "b", "a", "c", "a", "b"]
    asyncio.run(
        produce_records(
            kafka_bootstrap,
            small,
            [f"{k}{i}" for i, k in enumerate(small_keys)],
            keys=small_keys,
            partition=0,
        )
    )
    app_id = f"qf-keys-{uuid.uuid4().hex[:8]}"
    datadir = tmp_path_factory.mktemp("keys")
    worker = LeaderWorker(app_id, [big, small], kafka_bootstrap, datadir / "data", LEADER_SETTINGS)
    with worker.start():
        yield {
            "big": big,
            "small": small,
            "keys": keys,
            "app_id": app_id,
            "worker": worker,
            "datadir": datadir,
        }


def consumer(bootstrap: str, app_id: str, group: str, **kwargs: Any) -> ShareConsumer:
    return ShareConsumer(
        group,
        app_id=app_id,
        bootstrap_servers=bootstrap,
        settings=MEMBER_SETTINGS,
        ordering="key",
        **kwargs,
    )


async def make_key_ordered(bootstrap: str, app_id: str, topic: str, group: str) -> None:
    """Create ``group`` (a member joins and leaves) and set ``share.ordering=key`` for it."""
    plain = ShareConsumer(
        group, app_id=app_id, bootstrap_servers=bootstrap, settings=MEMBER_SETTINGS
    )
    await plain.subscribe([topic])
    await plain.close()
    admin = ShareGroupAdmin(app_id, KafkaClientConfig.from_broker(bootstrap))
    await admin.alter_group_configs(group, {"share.ordering": "key"})


def share_groups(*args: str) -> Any:
    result = CliRunner().invoke(cli, ["share-groups", *args], catch_exceptions=False)
    print(f"$ queueflow share-groups {' '.join(args)}\n{result.output}")
    return result


def test_six_members_on_one_partition_keep_every_key_in_order(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id, keys = app["big"], app["app_id"], app["keys"]
    handled: dict[str, list[int]] = defaultdict(list)  # key -> offsets, in handling order
    busy: dict[str, str] = {}  # key -> the member handling it now
    overlaps: list[str] = []
    members: dict[str, set[str]] = defaultdict(set)  # key -> members that handled it

    async def member(name: str, done: asyncio.Event) -> None:
        c = consumer(kafka_bootstrap, app_id, "ordered")
        await c.subscribe([topic])
        try:
            while not done.is_set():
                for r in await c.poll(timeout_ms=200):
                    key = r.key.decode()
                    if key in busy:
                        overlaps.append(f"{key} at {busy[key]} and {name} (offset {r.offset})")
                    busy[key] = name
                    await asyncio.sleep(random.random() / 1000)  # the handler runs
                    handled[key].append(r.offset)
                    members[key].add(name)
                    del busy[key]
                if len({o for v in handled.values() for o in v}) >= RECORDS:
                    done.set()
        finally:
            await c.close()

    async def scenario() -> float:
        await make_key_ordered(kafka_bootstrap, app_id, topic, "ordered")
        done = asyncio.Event()
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(member(f"m{i}", done) for i in range(MEMBERS))), 35)
        return time.monotonic() - started

    seconds = asyncio.run(scenario())
    print(f"{RECORDS} records over {KEYS} keys, {MEMBERS} members: {seconds:.1f} s")
    assert not overlaps, overlaps[:5]
    expected: dict[str, list[int]] = defaultdict(list)
    for offset, key in enumerate(keys):
        expected[key].append(offset)
    for key, offsets in handled.items():
        firsts = list(dict.fromkeys(offsets))  # a redelivery repeats a record, in place
        assert firsts == expected[key], f"key {key} out of order: {firsts[:10]}"
    assert set(handled) == set(expected)
    assert sum(len(set(v)) for v in handled.values()) == RECORDS
    assert len({m for ms in members.values() for m in ms}) == MEMBERS  # keys spread over all


async def handle(c: ShareConsumer, reject: str = "", want: int = 1) -> list[str]:
    """Poll until ``want`` records came (15 s at most); REJECT those of key ``reject``, ACCEPT
    the rest; their values."""
    got: list[Any] = []
    deadline = time.monotonic() + 15
    while len(got) < want and time.monotonic() < deadline:
        for r in await c.poll(timeout_ms=500):
            got.append(r)
            c.acknowledge(r, queueflow.REJECT if r.key == reject.encode() else queueflow.ACCEPT)
        await c.commit_sync()
    return [r.value.decode() for r in got]


def test_a_reject_parks_its_key_through_a_leader_restart_until_released_or_skipped(
    kafka_bootstrap: str, app: dict[str, Any], tmp_path: Path
) -> None:
    topic, app_id = app["small"], app["app_id"]
    base = ["--bootstrap-server", kafka_bootstrap, "--app", app_id]

    async def first_part() -> None:
        await make_key_ordered(kafka_bootstrap, app_id, topic, "parking")
        c = consumer(kafka_bootstrap, app_id, "parking", acknowledgement_mode="explicit")
        await c.subscribe([topic])
        assert sorted(await handle(c, reject="a", want=3)) == ["a0", "b1", "c5"]
        assert await handle(c, want=2) == ["b3", "b7"]  # a waits: parked by a0
        await c.close()

    asyncio.run(first_part())
    described = share_groups(*base, "--describe", "--group", "parking")
    assert described.exit_code == 0
    assert "PARKED-KEY" in described.output and " a " in described.output
    assert "rejected" in described.output

    # A new leader worker that recovers from the changelogs keeps the key parked.
    app["worker"].stop()
    fresh = LeaderWorker(
        app_id, [app["big"], topic], kafka_bootstrap, tmp_path / "data2", LEADER_SETTINGS
    )
    with fresh.start():
        release_then_skip(kafka_bootstrap, app_id, topic, base)


def release_then_skip(bootstrap: str, app_id: str, topic: str, base: list[str]) -> None:
    refused = share_groups(*base, "--group", "parking", "--topic", topic, "--release-key", "zz")
    assert refused.exit_code == 1 and "is not parked" in refused.output
    unknown = share_groups(*base, "--group", "nope", "--topic", topic, "--release-key", "a")
    assert unknown.exit_code == 1 and "does not exist" in unknown.output
    released = share_groups(*base, "--group", "parking", "--topic", topic, "--release-key", "a")
    assert released.exit_code == 0, released.output
    assert f"Released key 'a' of share group 'parking' on {topic}[0]" in released.output

    async def second_part() -> None:
        c = consumer(bootstrap, app_id, "parking", acknowledgement_mode="explicit")
        await c.subscribe([topic])
        assert await handle(c, reject="a", want=1) == ["a2"]  # proceeds, and parks a again
        await c.close()

    asyncio.run(second_part())
    skipped = share_groups(
        *base, "--group", "parking", "--topic", topic, "--partition", "0", "--skip-key", "a"
    )
    assert skipped.exit_code == 0, skipped.output
    assert "2 waiting records archived" in skipped.output  # a4 and a6
    admin = ShareGroupAdmin(app_id, KafkaClientConfig.from_broker(bootstrap))
    (offsets,) = asyncio.run(admin.list_offsets("parking", [topic]))
    assert offsets.parked_keys == () and offsets.start_offset == 8 and offsets.lag == 0
