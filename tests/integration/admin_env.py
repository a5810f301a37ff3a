"""What the admin tests (test_admin, test_admin_write) share: the leader's and members' settings
(KIP-932 names), the bound of every wait, and the members they start."""

from __future__ import annotations

from queueflow import ShareConsumer

LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 60_000,  # held records stay Acquired
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
}
MEMBER_SETTINGS = {"group.share.heartbeat.interval.ms": 500, "max.poll.records": 50}
WAIT_S = 60.0


def member(bootstrap: str, app_id: str, group: str) -> ShareConsumer:
    """A member of ``group`` (explicit acknowledgement, client id ``<group>-client``)."""
    return ShareConsumer(
        group,
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode="explicit",
        settings=MEMBER_SETTINGS,
        client_id=f"{group}-client",
    )
