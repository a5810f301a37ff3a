"""What a process with member rights can do to other members, on the real broker with
``queueflow.auth.mode=hmac`` (docs/operations.md "Threat model and attack matrix"): it holds
records by RENEWing them for good (starving a victim), acquires and RELEASEs records in a loop
until they are Archived unhandled, or joins phantom members until a real latecomer is refused
with ``GROUP_MAX_SIZE_REACHED``. Each is bounded here by a member abuse limit
(``share.record.lock.max.renewal.ms``, ``share.member.release.abuse.*``, provisional members and
``share.member.join.grace.ms``)."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from pathlib import Path

import queueflow
from queueflow import ShareConsumer, ShareRecord
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

SECRET = secrets.token_urlsafe(32)
AUTH = {"queueflow.auth.mode": "hmac", "queueflow.auth.secret": SECRET}
LOCK_MS = 2000
MAX_RENEWAL_MS = 6000
WORKER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": LOCK_MS,
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
    "share.record.lock.max.renewal.ms": MAX_RENEWAL_MS,
    "group.share.max.size": 10,
    **AUTH,
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 6000,
    "fetch.max.wait.ms": 500,
    **AUTH,
}


def member(app_id: str, bootstrap: str, **options: object) -> ShareConsumer:
    return ShareConsumer(
        "g", app_id=app_id, bootstrap_servers=bootstrap, settings=MEMBER_SETTINGS, **options
    )  # type: ignore[arg-type]


async def drain(victim: ShareConsumer, values: set[bytes], wait_s: float) -> list[ShareRecord]:
    """Poll ``victim`` (implicit mode: each poll ACCEPTs the last) until it has every value."""
    got: list[ShareRecord] = []
    deadline = time.monotonic() + wait_s
    while {r.value for r in got} != values:
        assert time.monotonic() < deadline, f"the victim got {len(got)} of {len(values)}"
        got += await victim.poll(timeout_ms=500)
    await victim.commit_sync()
    return got


def test_renewing_for_good_starves_a_victim_only_until_the_renewal_cap(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    """The attacker acquires every record and RENEWs them every 0.5 s; the RENEWs are refused
    once a record has been held share.record.lock.max.renewal.ms, its lock runs out and the
    victim gets every record."""
    topic = topic_factory(1)  # type: ignore[operator]
    app_id = f"qf-renew-{uuid.uuid4().hex[:8]}"
    values = {f"r-{i}".encode() for i in range(50)}
    asyncio.run(produce_records(kafka_bootstrap, topic, sorted(v.decode() for v in values)))

    async def scenario() -> tuple[list[ShareRecord], int, list[str], float]:
        attacker = member(app_id, kafka_bootstrap, acknowledgement_mode="explicit")
        victim = member(app_id, kafka_bootstrap)
        await attacker.subscribe([topic])
        held: list[ShareRecord] = []
        deadline = time.monotonic() + 20
        while not held:
            assert time.monotonic() < deadline, "the attacker acquired nothing"
            held = await attacker.poll(timeout_ms=500)
        started = time.monotonic()
        refusals: list[str] = []
        stop = asyncio.Event()

        async def renew_for_good() -> None:
            while not stop.is_set():
                for record in held:
                    attacker.acknowledge(record, queueflow.RENEW)
                outcome = await attacker.commit_sync()
                refusals.extend(str(e) for e in outcome.values() if e is not None)
                await asyncio.sleep(0.5)  # the attacker's pace, not a synchronisation

        renewing = asyncio.ensure_future(renew_for_good())
        try:
            await victim.subscribe([topic])
            got = await drain(victim, values, wait_s=30)
            took = time.monotonic() - started
        finally:
            stop.set()
            await renewing
            await victim.close()
            await attacker.close()
        return got, len(held), refusals, took

    with LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path, WORKER_SETTINGS).start():
        got, held, refusals, took = asyncio.run(scenario())
    print(f"renew starvation: attacker held {held}, victim had all 50 after {took:.1f} s")
    assert held > 0
    assert sorted(r.value for r in got) == sorted(values)  # each once, within the cap
    assert took < MAX_RENEWAL_MS / 1000 + 15
    assert any("share.record.lock.max.renewal.ms" in e for e in refusals), refusals


def test_an_acquire_release_loop_archives_nothing_and_the_attacker_is_fenced(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    """The attacker acquires 50 records and RELEASEs them unhandled, over and over (5 times
    would Archive them at the delivery count limit): after 200 RELEASEs
    (share.member.release.abuse.records) it is fenced, the delivery counts it caused are rolled
    back, and the victim then gets all 200 records as first deliveries."""
    topic = topic_factory(1)  # type: ignore[operator]
    app_id = f"qf-release-{uuid.uuid4().hex[:8]}"
    values = {f"l-{i}".encode() for i in range(200)}
    asyncio.run(produce_records(kafka_bootstrap, topic, sorted(v.decode() for v in values)))

    async def scenario() -> tuple[int, list[ShareRecord]]:
        attacker = member(
            app_id, kafka_bootstrap, acknowledgement_mode="explicit", max_poll_records=50
        )
        await attacker.subscribe([topic])
        released = 0
        deadline = time.monotonic() + 15
        try:
            for _ in range(12):  # the trial's loop, bounded
                if time.monotonic() > deadline:
                    break
                records = await attacker.poll(timeout_ms=1000)
                for record in records:
                    attacker.acknowledge(record, queueflow.RELEASE)
                released += len(records)
                await attacker.commit_sync()
        finally:
            await attacker.close()
        victim = member(app_id, kafka_bootstrap)
        await victim.subscribe([topic])
        try:
            return released, await drain(victim, values, wait_s=30)
        finally:
            await victim.close()

    worker = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path, WORKER_SETTINGS)
    with worker.start():
        released, got = asyncio.run(scenario())
        fences = worker.events("member_fenced_release_abuse")
    print(f"release loop: attacker released {released}; fence {fences}")
    assert released >= 200
    assert sorted(r.value for r in got) == sorted(values)  # 0 healthy records Archived
    assert {r.delivery_count for r in got} == {1}  # no count the attacker caused is left
    [fence] = fences
    assert fence["released"] >= 200 and fence["handled"] == 0
    assert "share.member.release.abuse.records=200" in fence["setting"]


async def phantom(app_id: str, bootstrap: str, topic: str) -> ShareConsumer:
    """A member that joins and never follows up (no heartbeat with its member epoch): a phantom.
    It signs its join with the member secret like any member; its heartbeats stop at once."""
    consumer = member(app_id, bootstrap)
    await consumer.subscribe([topic])
    session = consumer._session
    assert session is not None
    await session._membership.stop()  # within the heartbeat interval: never followed up
    return consumer


def test_phantom_joins_dont_keep_a_latecomer_out(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    """With group.share.max.size=10 and a real member in the group, 20 phantom joins (members
    that join with the member secret and never follow up) leave room for a real latecomer,
    which joins and gets records; the phantoms are removed (provisional_member_expired)."""
    topic = topic_factory(1)  # type: ignore[operator]
    app_id = f"qf-phantom-{uuid.uuid4().hex[:8]}"
    values = {f"p-{i}".encode() for i in range(20)}

    async def scenario() -> list[ShareRecord]:
        first = member(app_id, kafka_bootstrap)
        await first.subscribe([topic])
        await first.poll(timeout_ms=1500)  # joined and followed up (heartbeat every 0.5 s)
        phantoms: list[ShareConsumer] = []
        late = member(app_id, kafka_bootstrap)
        try:
            for _ in range(20):
                phantoms.append(await phantom(app_id, kafka_bootstrap, topic))
            await late.subscribe([topic])  # GROUP_MAX_SIZE_REACHED before
            await first.close()  # the latecomer alone gets the records
            await produce_records(kafka_bootstrap, topic, sorted(v.decode() for v in values))
            return await drain(late, values, wait_s=30)
        finally:
            await late.close()
            await first.close()
            for p in phantoms:
                await p.close()

    worker = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path, WORKER_SETTINGS)
    with worker.start():
        got = asyncio.run(scenario())
        expired = worker.events("provisional_member_expired")
    print(f"phantoms: {len(expired)} provisional_member_expired")
    assert sorted(r.value for r in got) == sorted(values)
    assert len(expired) >= 11  # evicted to make room (and expired after the grace)
