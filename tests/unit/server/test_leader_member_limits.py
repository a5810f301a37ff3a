"""The leader's pure handlers apply the member abuse limits: a RENEW past
``share.record.lock.max.renewal.ms`` is refused and named stale, a member beyond its in-flight
limit acquires nothing without an error, and a member fenced for RELEASing without handling is
logged (``member_fenced_release_abuse``), counted and refused with ``FENCED_MEMBER_EPOCH``."""

from __future__ import annotations

from queueflow.engine.partition import SharePartitionConfig
from queueflow.errors import ErrorCode
from queueflow.protocol import messages as protocol
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader import handlers
from queueflow.server.leader.results import MetricIncrement
from queueflow.structs import AcknowledgeType

TOPIC = "jobs"
NOW = 1_000_000
ACCEPT, RELEASE, RENEW = (
    int(AcknowledgeType.ACCEPT),
    int(AcknowledgeType.RELEASE),
    int(AcknowledgeType.RENEW),
)


def share_partition(**limits: int) -> DurableSharePartition:
    config = SharePartitionConfig(**limits)  # type: ignore[arg-type]
    return DurableSharePartition.create({}, "g", TOPIC, 0, config, 0, 0)


def request(
    max_records: int = 10,
    acks: list[tuple[int, int, tuple[int, ...]]] | None = None,
    member_id: str = "m",
) -> protocol.ShareFetchRequest:
    return protocol.ShareFetchRequest(
        group="g",
        topic=TOPIC,
        partition=0,
        member_id=member_id,
        request_id=7,
        reply_partition=0,
        max_records=max_records,
        acks=acks or [],
        deadline_ms=NOW + 1000,
    )


def test_a_renew_past_the_cap_is_refused_and_named_stale_with_the_other_acks_kept() -> None:
    durable = share_partition(max_renewal_ms=30_000)
    handlers.share_fetch(durable, request(max_records=4), NOW, acquire_from=(4, None))
    acks = [(0, 1, (ACCEPT,)), (2, 3, (RENEW,))]
    fetched = handlers.share_fetch(
        durable, request(max_records=0, acks=acks), NOW + 10_000, acquire_from=None
    )
    assert fetched.response.ack_error == ErrorCode.INVALID_RECORD_STATE.value
    assert "share.record.lock.max.renewal.ms=30000" in fetched.response.ack_error_message
    assert fetched.response.ack_stale == [(2, 3)]
    # The member sends the rest again without the stale RENEW: accepted.
    again = handlers.share_fetch(
        durable, request(max_records=0, acks=[(0, 1, (ACCEPT,))]), NOW + 10_000, acquire_from=None
    )
    assert again.response.ack_error == "NONE"
    assert durable.engine.start_offset == 2
    # The lock of 2..3 runs out at acquisition + cap, and another member gets them.
    later = handlers.share_fetch(
        durable, request(member_id="victim"), NOW + 30_000, acquire_from=(4, None)
    )
    assert later.response.acquired == [(2, 3, 2)]


def test_a_member_beyond_its_in_flight_limit_acquires_nothing_without_an_error() -> None:
    durable = share_partition(member_max_in_flight_records=5)
    first = handlers.share_fetch(durable, request(max_records=500), NOW, acquire_from=(100, None))
    assert first.response.acquired == [(0, 4, 1)]
    more = handlers.share_fetch(durable, request(max_records=500), NOW, acquire_from=(100, None))
    assert more.response.acquired == [] and more.response.error == "NONE"
    other = handlers.share_fetch(
        durable, request(max_records=500, member_id="o"), NOW, acquire_from=(100, None)
    )
    assert other.response.acquired == [(5, 9, 1)]


def test_a_release_loop_fences_the_member_logs_it_and_refuses_it() -> None:
    durable = share_partition(release_abuse_records=50)
    now = NOW
    fence_logs = []
    for _ in range(10):
        now += 10
        fetched = handlers.share_fetch(
            durable, request(max_records=20), now, acquire_from=(1000, None)
        )
        if fetched.response.error == ErrorCode.FENCED_MEMBER_EPOCH.value:
            break
        acks = [(lo, hi, (RELEASE,)) for lo, hi, _ in fetched.response.acquired]
        released = handlers.share_fetch(
            durable, request(max_records=0, acks=acks), now, acquire_from=None
        )
        assert released.response.ack_error == "NONE"
        fence_logs += [e for e in released.effects.logs if e.event == "member_fenced_release_abuse"]
        if fence_logs:
            assert MetricIncrement("member_fences", ("g", TOPIC, "release")) in (
                released.effects.metrics
            )
    else:
        raise AssertionError("the member was never fenced")
    [log] = fence_logs
    assert log.fields["member_id"] == "m" and log.fields["released"] >= 50
    assert "share.member.release.abuse.records=50" in log.fields["setting"]
    assert "RELEASEing records without handling" in fetched.response.error_message or (
        "share.member.release.abuse" in fetched.response.error_message
    )
    assert durable.engine.archived_total == 0
    victim = handlers.share_fetch(
        durable, request(member_id="victim"), now, acquire_from=(1000, None)
    )
    assert victim.response.acquired[0][2] == 1  # first deliveries again


def test_a_tick_that_expires_locks_held_to_the_cap_in_bulk_logs_the_fence() -> None:
    durable = share_partition(max_renewal_ms=60_000, release_abuse_records=40)
    now, logs = NOW, []
    for _ in range(3):
        got = handlers.share_fetch(durable, request(max_records=20), now, acquire_from=(20, None))
        assert got.response.acquired
        for at in (now + 29_000, now + 58_000):  # RENEWed to the cap
            renewed = handlers.share_fetch(
                durable, request(max_records=0, acks=[(0, 19, (RENEW,))]), at, acquire_from=None
            )
            assert renewed.response.ack_error == "NONE"
        now += 60_000
        ticked = handlers.tick([durable], now)
        logs += [e for e in ticked.logs if e.event == "member_fenced_release_abuse"]
        if logs:
            assert durable in ticked.writes
            break
    [log] = logs
    assert log.fields["member_id"] == "m" and log.fields["released"] >= 40
    refused = handlers.share_fetch(durable, request(), now, acquire_from=(20, None))
    assert refused.response.error == ErrorCode.FENCED_MEMBER_EPOCH.value
