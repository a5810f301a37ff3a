"""Names and configs of queueflow's internal topics.

For an app with id ``A``:

=================================  =================  ============================================
topic                              partitions         carries
=================================  =================  ============================================
``A-share-fetch-<topic>``          as ``<topic>``     ShareFetch/ShareAcknowledge requests, ticks
``A-share-ack-<topic>``            as ``<topic>``     transactional acknowledgements (exactly_once)
``A-share-coordinator``            1                  ShareGroupHeartbeat requests, ticks
``A-share-replies``                16                 responses, keyed by member id
``A-share-state-<topic>-changelog``  as ``<topic>``   share-partition state (Faust table)
``A-share-groups-changelog``       1                  group metadata (Faust table)
=================================  =================  ============================================

The request topics are co-partitioned with the source topic, so Faust's assignor gives partition
``p`` of the request topic and of the state changelog to the same worker: that worker is the
share-partition leader for every share group on ``(<topic>, p)``.
"""

from __future__ import annotations

import zlib

#: Partitions of the reply topic; a member reads one of them, chosen at random.
REPLY_PARTITIONS = 16
#: Partitions of the coordinator topic.
COORDINATOR_PARTITIONS = 1
#: Control topics hold short-lived requests and replies only. Retention applies to closed
#: segments, so segments roll every 10 minutes (or 64 MiB) rather than the broker's 7 days / 1 GiB.
CONTROL_TOPIC_CONFIG = {
    "retention.ms": str(3600 * 1000),
    "cleanup.policy": "delete",
    "segment.ms": str(600 * 1000),
    "segment.bytes": str(64 * 1024 * 1024),
}
#: Extra configs of the state tables' changelog topics (Faust makes them compacted). Every
#: snapshot deletes the deltas it supersedes, so a busy leader writes many tombstones: only
#: closed segments are compacted, and tombstones outlive compaction by ``delete.retention.ms``
#: (broker default 24 h), so both are shortened to keep the changelog about the size of the
#: live state. A standby offline for longer than ``delete.retention.ms`` may keep superseded
#: delta keys in its local store; they are never read (their snapshot epoch is old).
STATE_CHANGELOG_CONFIG = {
    "segment.ms": str(300 * 1000),
    "segment.bytes": str(64 * 1024 * 1024),
    "delete.retention.ms": str(600 * 1000),
}


def request_topic(app_id: str, topic: str) -> str:
    """The request topic of the share-partition leaders of ``topic``: ``<app>-share-fetch-<topic>``
    (ShareFetch requests with their acknowledgements, fences, ticks)."""
    return f"{app_id}-share-fetch-{topic}"


def ack_topic(app_id: str, topic: str) -> str:
    """The ack topic of ``topic``'s leaders: ``<app>-share-ack-<topic>``, co-partitioned with
    ``topic``. With ``queueflow.processing.guarantee=exactly_once`` members write their
    ShareAcknowledges here inside the Kafka transaction of their results, and the leader of
    request partition ``p`` reads partition ``p`` read_committed (docs/architecture.md
    "Exactly-once: transactional acknowledgements")."""
    return f"{app_id}-share-ack-{topic}"


def transactional_id_prefix(app_id: str) -> str:
    """The prefix of the members' transactional ids: ``<app>-share-txn-``."""
    return f"{app_id}-share-txn-"


def coordinator_topic(app_id: str) -> str:
    """The request topic of the share-group coordinator."""
    return f"{app_id}-share-coordinator"


def reply_topic(app_id: str) -> str:
    """The topic leaders and the coordinator answer on."""
    return f"{app_id}-share-replies"


def state_table(topic: str) -> str:
    """The Faust table holding the share-partition state of ``topic``."""
    return f"share-state-{topic}"


GROUPS_TABLE = "share-groups"


def changelog(app_id: str, table: str) -> str:
    """The changelog topic of the app's Faust table ``table``: Faust names it
    ``<app id>-<table>-changelog``."""
    return f"{app_id}-{table}-changelog"


def state_changelog(app_id: str, topic: str) -> str:
    """The changelog of ``topic``'s state table: ``<app>-share-state-<topic>-changelog``."""
    return changelog(app_id, state_table(topic))


def groups_changelog(app_id: str) -> str:
    """The changelog of the coordinator's group table: ``<app>-share-groups-changelog``."""
    return changelog(app_id, GROUPS_TABLE)


def coordinator_partition(group: str) -> int:
    """The coordinator partition that owns ``group`` (stable across processes)."""
    return zlib.crc32(group.encode()) % COORDINATOR_PARTITIONS
