"""What the admin tests (test_admin, test_admin_write) share: the leader's and members' settings
(KIP-932 names) and the bound of every wait."""

from __future__ import annotations

LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 60_000,  # held records stay Acquired
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
}
MEMBER_SETTINGS = {"group.share.heartbeat.interval.ms": 500, "max.poll.records": 50}
WAIT_S = 60.0
