"""Names and configs of queueflow's internal topics.

For an app with id ``A``:

=================================  =================  ============================================
topic                              partitions         carries
=================================  =================  ============================================
``A-share-fetch-<topic>``          as ``<topic>``     ShareFetch/ShareAcknowledge requests, ticks
``A-share-ack-<topic>``            as ``<topic>``     transactional acknowledgements (exactly_once)
``A-share-coordinator``            N (see below)      ShareGroupHeartbeat requests, ticks
``A-share-replies``                16                 responses, keyed by member id
``A-share-state-<topic>-changelog``  as ``<topic>``   share-partition state (Faust table)
``A-share-groups-changelog``       as the above       group metadata (Faust table)
=================================  =================  ============================================

The request topics are co-partitioned with the source topic, so Faust's assignor gives partition
``p`` of the request topic and of the state changelog to the same worker: that worker is the
share-partition leader for every share group on ``(<topic>, p)``.

The coordinator topic has ``queueflow.coordinator.topic.num.partitions`` partitions when it is
created (an existing topic keeps its count), and so has the group table's changelog,
co-partitioned with it. A share group belongs to partition :func:`coordinator_partition` of it,
hashed as Kafka's group coordinator does (``GroupCoordinatorService.partitionFor``:
``Utils.abs(groupId.hashCode()) % numPartitions``), so the worker that owns a partition
coordinates its groups.
"""

from __future__ import annotations

import functools

from queueflow.errors import ConfigurationError

#: Partitions of the reply topic; a member reads one of them, chosen at random.
REPLY_PARTITIONS = 16
#: Partitions of the coordinator topic of apps made before it was sharded (and the count an
#: existing one-partition topic keeps); new apps get ``queueflow.coordinator.topic.num.partitions``.
LEGACY_COORDINATOR_PARTITIONS = 1
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


@functools.lru_cache(maxsize=4096)
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` of ``text``: ``s[0]*31^(n-1) + ... + s[n-1]`` over its
    UTF-16 code units (a character outside the BMP counts as its two surrogates), in signed
    32-bit arithmetic (https://docs.oracle.com/en/java/javase/17/docs/api/java.base/java/lang/String.html#hashCode()).

    Returns:
        An int in ``[-2**31, 2**31)``, equal to what the JVM computes.
    """
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(group: str, partitions: int) -> int:
    """The coordinator partition that owns share group ``group``, of a coordinator topic of
    ``partitions`` partitions: Kafka's ``Utils.abs(groupId.hashCode()) % numPartitions``
    (``GroupCoordinatorService.partitionFor``; ``Utils.abs`` maps ``Integer.MIN_VALUE`` to 0),
    so the same group id maps to the same partition number as in Kafka.

    Raises:
        ValueError: ``partitions`` < 1.
    """
    if partitions < 1:
        raise ValueError(f"a coordinator topic has at least one partition, not {partitions}")
    h = java_string_hash(group)
    return (0 if h == -(2**31) else abs(h)) % partitions


def resolve_coordinator_partitions(
    app_id: str, configured: int, topic_count: int | None, changelog_count: int | None
) -> int:
    """The partition count the app's coordinator runs with: what exists wins over the setting,
    as in Kafka, where ``offsets.topic.num.partitions`` applies only when the topic is created.

    Args:
        app_id: the app id (named in the error).
        configured: ``queueflow.coordinator.topic.num.partitions``.
        topic_count: partitions of the existing coordinator topic (``None``: none exists).
        changelog_count: partitions of the existing group table changelog (``None``: none).

    Returns:
        The group changelog's count if it exists (it holds the groups' state, by partition),
        else the coordinator topic's, else ``configured``.

    Raises:
        ConfigurationError: both topics exist with different counts: groups would be served
            from a partition other than the one holding their state.
    """
    if topic_count is not None and changelog_count is not None and topic_count != changelog_count:
        raise ConfigurationError(
            f"app {app_id!r}: the coordinator topic {coordinator_topic(app_id)!r} has "
            f"{topic_count} partitions but the group table's changelog "
            f"{groups_changelog(app_id)!r} has {changelog_count}; they must be co-partitioned "
            "(a group's requests and its state live on the same partition number). Give the "
            "topic with fewer partitions as many as the other "
            "(kafka-topics.sh --alter --partitions) only if the one with more is the coordinator "
            "topic and carried no request yet; otherwise run the app under a new app id"
        )
    if changelog_count is not None:
        return changelog_count
    if topic_count is not None:
        return topic_count
    return configured
