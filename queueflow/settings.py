"""Share-group settings, declared once with their KIP-932 names, defaults, ranges and env vars.

Each setting is a :class:`Setting` in :data:`SETTINGS`, the one source of truth: the defaults of
:class:`ShareGroupSettings`, the limits the share-partition engine checks
(:class:`queueflow.engine.partition.SharePartitionConfig`) and the table in
``docs/configuration.md`` (:func:`markdown_table`) all come from it. An import-time check
(:func:`check_declarations`) fails if the dataclass and the table disagree.

``python -m queueflow.settings`` prints the Markdown table;
``python -m queueflow.settings --write docs/configuration.md`` updates the doc in place.

A value comes from, in order: the keyword given to :class:`ShareGroupSettings`, the environment
variable (the KIP-932 name upper-cased with dots turned into underscores and a ``QUEUEFLOW_``
prefix, e.g. ``QUEUEFLOW_GROUP_SHARE_RECORD_LOCK_DURATION_MS``), then the default. Names follow
KIP-932 and the Kafka 4.x broker configs where an equivalent exists; queueflow-only settings start
with ``queueflow.``.

This module uses the standard library only: the engine imports it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import inspect
import math
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, ParamSpec, TypeVar

from queueflow.errors import ConfigurationError, UnknownNameError

__all__ = [
    "ENVIRONMENT",
    "SETTINGS",
    "AuthMode",
    "AutoOffsetReset",
    "Choice",
    "EnvironmentVariable",
    "KafkaListenerLeaders",
    "KeystoreType",
    "ListenerSecurityProtocol",
    "LogFormat",
    "ProcessingGuarantee",
    "Setting",
    "ShareAcquireMode",
    "ShareGroupSettings",
    "SslClientAuth",
    "StateDurability",
    "TicketPolicy",
    "bool_default",
    "check_declarations",
    "check_environment",
    "check_keywords",
    "choice_default",
    "closest_names",
    "did_you_mean",
    "int_default",
    "known_environment",
    "listener_address",
    "lookup",
    "markdown_table",
    "refuse_unknown_keywords",
    "show_value",
    "str_default",
    "with_markdown_table",
]


class Choice(str, enum.Enum):
    """Base of the choice settings' enums: each member is its config value (a ``str``, so it
    compares, hashes, formats and encodes as that value)."""

    def __str__(self) -> str:
        return str(self.value)


class AutoOffsetReset(Choice):
    """``share.auto.offset.reset``: where a new share-partition's SPSO starts (KIP-932
    "Group configuration")."""

    LATEST = "latest"
    EARLIEST = "earliest"


class StateDurability(Choice):
    """``queueflow.leader.state.durability``: when a leader answers relative to the changelog."""

    ACKED = "acked"
    BUFFERED = "buffered"


class ShareAcquireMode(Choice):
    """``share.acquire.mode`` (KIP-1206): how many records a ``ShareConsumer`` poll may
    return. ``batch_optimized``: up to ``max.poll.records`` per share-partition per poll (Kafka:
    whole batches, so possibly more); ``record_limit``: at most ``max.poll.records`` per poll
    across all share-partitions."""

    BATCH_OPTIMIZED = "batch_optimized"
    RECORD_LIMIT = "record_limit"


class ProcessingGuarantee(Choice):
    """``queueflow.processing.guarantee``: how a share agent's outcome and its results commit
    (docs/architecture.md "Exactly-once: transactional acknowledgements")."""

    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE = "exactly_once"


class AuthMode(Choice):
    """``queueflow.auth.mode``: how control messages are authenticated (docs/operations.md
    "Threat model and attack matrix"). :attr:`ShareGroupSettings.control_auth_mode` resolves
    ``AUTO`` to ``HMAC`` or ``NONE``."""

    AUTO = "auto"
    HMAC = "hmac"
    NONE = "none"


class TicketPolicy(Choice):
    """``queueflow.auth.tickets``: whether leaders require the member's assignment ticket."""

    REQUIRED = "required"
    OPTIONAL = "optional"


class ListenerSecurityProtocol(Choice):
    """``queueflow.leader.listener.security.protocol``: whether the direct member↔leader path
    uses TLS (Kafka's ``security.protocol``, without SASL). ``auto``: ``SSL`` when the app's
    Kafka connection uses SSL (``SSL`` or ``SASL_SSL``), else ``PLAINTEXT``."""

    AUTO = "auto"
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"


class KeystoreType(Choice):
    """``queueflow.leader.listener.ssl.keystore.type``: the key store's format (Kafka's
    ``ssl.keystore.type``); PEM only (a file with the private key and the certificate chain)."""

    PEM = "PEM"


class SslClientAuth(Choice):
    """``queueflow.leader.listener.ssl.client.auth``: whether the leader asks members for a
    client certificate (Kafka's ``ssl.client.auth``: mutual TLS)."""

    NONE = "none"
    REQUESTED = "requested"
    REQUIRED = "required"


class KafkaListenerLeaders(Choice):
    """``queueflow.kafka.listener.leaders``: which node the Kafka-protocol listener names as a
    share-partition's leader in Metadata (docs/kafka-listener.md)."""

    PARTITION = "partition"
    GATEWAY = "gateway"


class LogFormat(Choice):
    """``queueflow.log.format``: how queueflow's structlog events are written to stderr."""

    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


#: The type of a setting's value.
SettingValue = int | str | bool | Choice

_BOOLEANS = {"true": True, "false": False}


def show_value(value: object) -> str:
    """A setting's value as written in configs and docs: ``true``/``false`` for booleans, a
    choice's config value, else ``str(value)``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True, slots=True)
class Setting:
    """Declaration of one setting.

    Args:
        attr: the Python attribute on :class:`ShareGroupSettings`.
        name: the KIP-932 / Kafka config name (or ``queueflow.*``).
        default: the default value; its type is the setting's type: ``int``, ``str``, ``bool``
            (written ``true``/``false`` in configs and the environment) or a :class:`Choice`
            enum (its members are the allowed values).
        minimum / maximum: inclusive bounds for integers, or ``None`` for unbounded.
        doc: one line for the configuration reference (Markdown; no ``|``).
        read_by: which process's value applies (leader, coordinator, member, share agent), for
            the configuration reference.
    """

    attr: str
    name: str
    default: SettingValue
    minimum: int | None = None
    maximum: int | None = None
    doc: str = ""
    read_by: str = ""

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The allowed values of a boolean or choice setting, as written in configs; else
        ``None``."""
        if isinstance(self.default, bool):
            return tuple(_BOOLEANS)
        if isinstance(self.default, Choice):
            return tuple(str(c.value) for c in type(self.default))
        return None

    @property
    def env(self) -> str:
        """The environment variable that overrides the default."""
        return "QUEUEFLOW_" + self.name.replace("queueflow.", "").replace(".", "_").upper()

    def allowed(self) -> str:
        """The allowed range, as shown in errors and docs: ``[lo..hi]``, ``[lo..]`` or choices."""
        if self.choices:
            return " | ".join(self.choices)
        if isinstance(self.default, str):
            return "text"
        lo = "" if self.minimum is None else str(self.minimum)
        hi = "" if self.maximum is None else str(self.maximum)
        return f"[{lo}..{hi}]"

    def parse(self, raw: Any, source: str) -> SettingValue:
        """Convert and check ``raw`` (a value, or its string form from the environment).

        Args:
            raw: the value to check; integers may be given as numeric strings, booleans as
                ``true``/``false`` (any case), choices as their config value.
            source: where it came from, for the message (``arguments``, ``$ENV_VAR``, ``default``).

        Returns:
            The value as the type of :attr:`default` (``int``, ``str``, ``bool`` or its
            :class:`Choice` enum).

        Raises:
            ConfigurationError: not an integer, out of ``[minimum..maximum]`` or not one of
                :attr:`choices`; the message names the setting, the value, ``source`` and the
                allowed range.
        """
        if isinstance(self.default, bool):
            if isinstance(raw, bool):
                return raw
            flag = _BOOLEANS.get(str(raw).strip().lower())
            if flag is None:
                raise ConfigurationError(
                    f"{self.name}={raw!r} (from {source}) is not allowed; "
                    f"choose one of {self.allowed()}, default {show_value(self.default)!r}"
                )
            return flag
        if isinstance(self.default, Choice):
            try:
                return type(self.default)(str(raw))
            except ValueError:
                raise ConfigurationError(
                    f"{self.name}={str(raw)!r} (from {source}) is not allowed; "
                    f"choose one of {self.allowed()}, default {show_value(self.default)!r}"
                ) from None
        if isinstance(self.default, int):
            try:
                number = int(raw)
            except (TypeError, ValueError):
                raise ConfigurationError(
                    f"{self.name}={raw!r} (from {source}) is not an integer; "
                    f"allowed range {self.allowed()}, default {self.default}"
                ) from None
            if (self.minimum is not None and number < self.minimum) or (
                self.maximum is not None and number > self.maximum
            ):
                raise ConfigurationError(
                    f"{self.name}={number} (from {source}) is out of range; "
                    f"allowed range {self.allowed()}, default {self.default}"
                )
            return number
        return str(raw)


_LOCK_READERS = "leader; share agent (checks `lock_duration_ms`)"

#: Every share-group setting, in the order of the configuration reference. Bounds follow the Kafka
#: 4.x broker configs (KIP-932 "Broker configuration";
#: https://kafka.apache.org/documentation/#brokerconfigs) unless a doc line says otherwise.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "record_lock_duration_ms",
        "group.share.record.lock.duration.ms",
        30000,
        1000,
        3600000,
        doc="Acquisition lock duration (ms) for records a consumer acquires.",
        read_by="leader",
    ),
    Setting(
        "min_record_lock_duration_ms",
        "group.share.min.record.lock.duration.ms",
        1000,
        1000,
        30000,
        doc=(
            "Lower bound (ms) for `group.share.record.lock.duration.ms` and for a consumer's own "
            "lock duration. Kafka's default is 15000; queueflow keeps 1000 (its former fixed "
            "minimum)."
        ),
        read_by=_LOCK_READERS,
    ),
    Setting(
        "max_record_lock_duration_ms",
        "group.share.max.record.lock.duration.ms",
        60000,
        30000,
        3600000,
        doc=(
            "Upper bound (ms) for `group.share.record.lock.duration.ms` and for a consumer's own "
            "lock duration."
        ),
        read_by=_LOCK_READERS,
    ),
    Setting(
        "delivery_count_limit",
        "group.share.delivery.count.limit",
        5,
        2,
        10,
        doc="Delivery attempts after which a record is Archived.",
        read_by="leader",
    ),
    Setting(
        "partition_max_record_locks",
        "group.share.partition.max.record.locks",
        2000,
        100,
        10000,
        doc="In-flight records per share-partition (SPEO - SPSO).",
        read_by="leader",
    ),
    Setting(
        "session_timeout_ms",
        "group.share.session.timeout.ms",
        45000,
        1000,
        None,
        doc="A member silent for longer than this (ms) is removed; its records are released.",
        read_by="coordinator",
    ),
    Setting(
        "heartbeat_interval_ms",
        "group.share.heartbeat.interval.ms",
        5000,
        100,
        None,
        doc="How often (ms) members heartbeat to the share-group coordinator; the coordinator "
        "tells each member its group's value in every heartbeat answer.",
        read_by="coordinator (members follow its answer)",
    ),
    Setting(
        "min_delivery_count_limit",
        "group.share.min.delivery.count.limit",
        2,
        2,
        5,
        doc="Lower bound for a group's `share.delivery.count.limit` (KIP-1240).",
        read_by="coordinator",
    ),
    Setting(
        "max_delivery_count_limit",
        "group.share.max.delivery.count.limit",
        10,
        5,
        25,
        doc="Upper bound for a group's `share.delivery.count.limit` (KIP-1240).",
        read_by="coordinator",
    ),
    Setting(
        "min_partition_max_record_locks",
        "group.share.min.partition.max.record.locks",
        100,
        100,
        2000,
        doc="Lower bound for a group's `share.partition.max.record.locks` (KIP-1240).",
        read_by="coordinator",
    ),
    Setting(
        "max_partition_max_record_locks",
        "group.share.max.partition.max.record.locks",
        4000,
        2000,
        10000,
        doc="Upper bound for a group's `share.partition.max.record.locks` (KIP-1240).",
        read_by="coordinator",
    ),
    Setting(
        "min_session_timeout_ms",
        "group.share.min.session.timeout.ms",
        1000,
        1000,
        None,
        doc="Lower bound (ms) for a group's `share.session.timeout.ms`. Kafka's default is "
        "45000; queueflow keeps 1000 (the lowest `group.share.session.timeout.ms`).",
        read_by="coordinator",
    ),
    Setting(
        "max_session_timeout_ms",
        "group.share.max.session.timeout.ms",
        60000,
        1000,
        None,
        doc="Upper bound (ms) for a group's `share.session.timeout.ms`.",
        read_by="coordinator",
    ),
    Setting(
        "min_heartbeat_interval_ms",
        "group.share.min.heartbeat.interval.ms",
        100,
        100,
        None,
        doc="Lower bound (ms) for a group's `share.heartbeat.interval.ms`. Kafka's default is "
        "5000; queueflow keeps 100 (the lowest `group.share.heartbeat.interval.ms`).",
        read_by="coordinator",
    ),
    Setting(
        "max_heartbeat_interval_ms",
        "group.share.max.heartbeat.interval.ms",
        15000,
        100,
        None,
        doc="Upper bound (ms) for a group's `share.heartbeat.interval.ms`.",
        read_by="coordinator",
    ),
    Setting(
        "max_size",
        "group.share.max.size",
        200,
        1,
        1000,
        doc="Members per share group.",
        read_by="coordinator",
    ),
    Setting(
        "assignors",
        "group.share.assignors",
        "simple",
        doc="Share-group assignors, comma-separated, most preferred first (`simple`, `lag`, "
        "`rack` or registered ones): a group uses the first that every member supports "
        "(docs/operations.md, Assignors).",
        read_by="coordinator",
    ),
    Setting(
        "assignor_refresh_interval_ms",
        "queueflow.assignor.refresh.interval.ms",
        30000,
        0,
        3600000,
        doc="How often (ms) the coordinator recomputes a stable group's assignment with fresh "
        "inputs (lag for `lag`, racks for `rack`) and rebalances if it changed; 0: only when "
        "membership changes.",
        read_by="coordinator",
    ),
    Setting(
        "member_assignors",
        "queueflow.member.assignors",
        "simple,lag,rack",
        doc="The assignors this member advertises in its heartbeats (comma-separated); empty: "
        "advertise none, like a member of an older queueflow (supports `simple` only).",
        read_by="member",
    ),
    Setting(
        "client_rack",
        "client.rack",
        "",
        doc="The member's rack, sent in its heartbeats for the `rack` assignor (Kafka's "
        "consumer config of the same name); empty: none.",
        read_by="member",
    ),
    Setting(
        "auto_offset_reset",
        "share.auto.offset.reset",
        AutoOffsetReset.LATEST,
        doc="Where a new share-partition's SPSO starts: the log end or the log start.",
        read_by="leader",
    ),
    Setting(
        "snapshot_update_records_per_snapshot",
        "share.coordinator.snapshot.update.records.per.snapshot",
        500,
        0,
        500,
        doc="State deltas written between two full snapshots of a share-partition.",
        read_by="leader",
    ),
    Setting(
        "max_poll_records",
        "max.poll.records",
        500,
        1,
        10000,
        doc="Records a member acquires per ShareFetch.",
        read_by="member",
    ),
    Setting(
        "share_acquire_mode",
        "share.acquire.mode",
        ShareAcquireMode.BATCH_OPTIMIZED,
        doc="KIP-1206, for a ShareConsumer: batch_optimized (up to max.poll.records per "
        "share-partition per poll) or record_limit (at most max.poll.records per poll across "
        "all share-partitions; a fetch still under way when a poll returns counts against "
        "the next poll's limit).",
        read_by="share consumer",
    ),
    Setting(
        "acknowledgement_linger_ms",
        "queueflow.acknowledgement.linger.ms",
        20,
        0,
        10000,
        doc="How long (ms) acknowledgements wait to ride along with the next fetch.",
        read_by="share agent",
    ),
    Setting(
        "request_timeout_ms",
        "queueflow.request.timeout.ms",
        10000,
        100,
        600000,
        doc="How long (ms) a member waits for a leader or coordinator to answer.",
        read_by="member",
    ),
    Setting(
        "join_timeout_ms",
        "queueflow.member.join.timeout.ms",
        15000,
        1000,
        600000,
        doc="How long (ms) a member (share agent, ShareConsumer) tries to join before it fails: "
        "its app's internal topics must exist and its coordinator answer within it.",
        read_by="member",
    ),
    Setting(
        "broker_wait_ms",
        "queueflow.broker.wait.ms",
        60000,
        0,
        3600000,
        doc="How long (ms) a worker or ShareConsumer waits at start for the Kafka cluster to "
        "answer, retrying with back-off and logging broker_unreachable; then it fails.",
        read_by="every worker and member",
    ),
    Setting(
        "coordinator_topic_partitions",
        "queueflow.coordinator.topic.num.partitions",
        8,
        1,
        1000,
        doc="Partitions of the coordinator topic `<app>-share-coordinator` (and of the group "
        "table's changelog) when it is created, as Kafka's `offsets.topic.num.partitions`: "
        "share groups are hashed to partitions as Kafka's group coordinator does, and each "
        "partition's groups are coordinated by the worker that owns it. An existing topic keeps "
        "its count (an app made before the coordinator was sharded keeps its 1); a different "
        "value is logged (`coordinator_partitions_mismatch`) and ignored (docs/architecture.md "
        '"Coordinator sharding").',
        read_by="leader (when it creates the coordinator topic)",
    ),
    Setting(
        "recovery_stall_ms",
        "queueflow.leader.recovery.stall.ms",
        60000,
        0,
        3600000,
        doc="How long (ms) Faust's table recovery may go without restoring a changelog record "
        "before the worker stops (leader_recovery_stalled) so that its partitions move to "
        "another; 0: never.",
        read_by="leader",
    ),
    Setting(
        "shutdown_timeout_ms",
        "queueflow.shutdown.timeout.ms",
        30000,
        0,
        3600000,
        doc="On SIGTERM, how long (ms) handlers may run before their records are released.",
        read_by="share agent",
    ),
    Setting(
        "fetch_max_wait_ms",
        "fetch.max.wait.ms",
        500,
        0,
        60000,
        doc="How long (ms) a leader holds a ShareFetch that finds nothing to acquire before it "
        "answers empty (KIP-932 MaxWaitMs; long poll, direct path only).",
        read_by="member",
    ),
    Setting(
        "check_crcs",
        "check.crcs",
        True,
        doc="Whether a member checks the CRC-32C of the Kafka record batches it reads (Kafka's "
        "consumer setting of the same name): a corrupted batch's records then never reach a "
        "handler and count as failed deliveries, archived at `share.delivery.count.limit`; "
        'false skips the check (docs/configuration.md "Record batch CRCs": cost, details).',
        read_by="member",
    ),
    Setting(
        "leader_listener",
        "queueflow.leader.listener",
        "0.0.0.0:0",
        doc="host:port the leader's direct endpoint listens on (port 0: any free port); empty "
        "turns the direct path off, so members use the request topics.",
        read_by="leader",
    ),
    Setting(
        "leader_listener_security_protocol",
        "queueflow.leader.listener.security.protocol",
        ListenerSecurityProtocol.AUTO,
        doc="Whether the direct member↔leader path uses TLS (Kafka: security.protocol): `SSL`, "
        "`PLAINTEXT`, or `auto`: `SSL` when the Kafka connection uses SSL (`SSL`, `SASL_SSL`). "
        'Workers and members must agree (docs/operations.md "TLS on the direct path").',
        read_by="leader; member",
    ),
    Setting(
        "leader_listener_ssl_keystore_type",
        "queueflow.leader.listener.ssl.keystore.type",
        KeystoreType.PEM,
        doc="Format of the direct path's key store (Kafka: ssl.keystore.type); PEM only.",
        read_by="leader; member",
    ),
    Setting(
        "leader_listener_ssl_keystore_location",
        "queueflow.leader.listener.ssl.keystore.location",
        "",
        doc="PEM file with the private key and certificate chain (Kafka: ssl.keystore.location): "
        "the leader's server certificate (required when the direct path uses TLS), a member's "
        "client certificate (mutual TLS; empty: the Kafka connection's SSL context as it is).",
        read_by="leader; member",
    ),
    Setting(
        "leader_listener_ssl_key_password",
        "queueflow.leader.listener.ssl.key.password",
        "",
        doc="Password of the key in the key store (Kafka: ssl.key.password); empty: not encrypted.",
        read_by="leader; member",
    ),
    Setting(
        "leader_listener_ssl_truststore_location",
        "queueflow.leader.listener.ssl.truststore.location",
        "",
        doc="PEM file of the CA certificates to trust (Kafka: ssl.truststore.location): members "
        "check the leader's certificate, the leader members' (mutual TLS); empty: the CA "
        "certificates of the Kafka connection's SSL context, else the system's.",
        read_by="leader; member",
    ),
    Setting(
        "leader_listener_ssl_endpoint_identification_algorithm",
        "queueflow.leader.listener.ssl.endpoint.identification.algorithm",
        "https",
        doc="`https`: a member checks that the leader's certificate names the host it connects "
        "to (queueflow.leader.advertised.host); empty: it does not (Kafka: "
        "ssl.endpoint.identification.algorithm).",
        read_by="member",
    ),
    Setting(
        "leader_listener_ssl_client_auth",
        "queueflow.leader.listener.ssl.client.auth",
        SslClientAuth.NONE,
        doc="Whether the leader asks members for a client certificate signed by a trusted CA "
        "(Kafka: ssl.client.auth): `required` refuses members without one (mutual TLS).",
        read_by="leader",
    ),
    Setting(
        "leader_record_cache_bytes",
        "queueflow.leader.record.cache.bytes",
        8 * 1024 * 1024,
        0,
        1024 * 1024 * 1024,
        doc="Bytes of raw record batches a leader keeps per source partition it leads, to answer "
        "direct-path ShareFetches with the acquired records (oldest read dropped first); 0: "
        "leaders carry no records and members read them from the broker.",
        read_by="leader",
    ),
    Setting(
        "kafka_listener",
        "queueflow.kafka.listener",
        "",
        doc="Where the worker's Kafka-protocol listener listens, e.g. "
        "`PLAINTEXT://127.0.0.1:9192`, so that Kafka's own share consumers (KIP-932 clients) "
        "join this app's groups (docs/kafka-listener.md); empty (default): off. The scheme is "
        "the security protocol, as in Kafka's `listeners`: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, "
        "`SASL_SSL` (`host:port` alone: `PLAINTEXT`); when the app's Kafka connection is "
        "secured, `PLAINTEXT` is refused at start.",
        read_by="leader",
    ),
    Setting(
        "kafka_listener_sasl_enabled_mechanisms",
        "queueflow.kafka.listener.sasl.enabled.mechanisms",
        "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        doc="SASL mechanisms the Kafka-protocol listener offers (Kafka: sasl.enabled.mechanisms), "
        "comma-separated, of `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`. The client's exchange is "
        "relayed to the app's Kafka cluster, which must enable the mechanism too "
        '(docs/kafka-listener.md "Security").',
        read_by="leader",
    ),
    Setting(
        "kafka_listener_ssl_keystore_location",
        "queueflow.kafka.listener.ssl.keystore.location",
        "",
        doc="PEM file with the Kafka-protocol listener's private key and certificate chain "
        "(Kafka: ssl.keystore.location); required with `SSL` and `SASL_SSL`.",
        read_by="leader",
    ),
    Setting(
        "kafka_listener_ssl_key_password",
        "queueflow.kafka.listener.ssl.key.password",
        "",
        doc="Password of the key in the listener's key store (Kafka: ssl.key.password); empty: "
        "not encrypted.",
        read_by="leader",
    ),
    Setting(
        "kafka_listener_ssl_truststore_location",
        "queueflow.kafka.listener.ssl.truststore.location",
        "",
        doc="PEM file of the CA certificates clients' certificates must chain to (Kafka: "
        "ssl.truststore.location; mutual TLS); empty: the CA certificates of the Kafka "
        "connection's SSL context, else the system's.",
        read_by="leader",
    ),
    Setting(
        "kafka_listener_ssl_client_auth",
        "queueflow.kafka.listener.ssl.client.auth",
        SslClientAuth.NONE,
        doc="Whether the listener asks clients for a certificate (Kafka: ssl.client.auth): "
        "`required` refuses clients without one signed by a trusted CA (mutual TLS; the "
        "principal is then `User:<subject DN>`, as Kafka's default SSL principal builder).",
        read_by="leader",
    ),
    Setting(
        "kafka_listener_leaders",
        "queueflow.kafka.listener.leaders",
        KafkaListenerLeaders.PARTITION,
        doc="Which node the Kafka-protocol listener names as each share-partition's leader in "
        "Metadata: `partition`: the listener of the worker that leads it (clients fetch each "
        "share-partition from its leader's worker; a ShareFetch elsewhere gets "
        "`NOT_LEADER_OR_FOLLOWER`); `gateway`: the listener asked, which serves every "
        "share-partition over queueflow's own path (docs/kafka-listener.md \"Which node leads "
        'a share-partition").',
        read_by="leader",
    ),
    Setting(
        "leader_advertised_host",
        "queueflow.leader.advertised.host",
        "",
        doc="Host name members connect to for the direct endpoint; empty: this machine's host "
        "name if it resolves, else 127.0.0.1.",
        read_by="leader",
    ),
    Setting(
        "direct_max_connections",
        "queueflow.direct.max.connections",
        1000,
        1,
        1_000_000,
        doc="Connections the leader's direct endpoint holds at once (Kafka: max.connections); "
        "at most half the process's open-file limit (RLIMIT_NOFILE) is used whatever the value; "
        "more are closed at once and counted.",
        read_by="leader",
    ),
    Setting(
        "direct_max_connections_per_ip",
        "queueflow.direct.max.connections.per.ip",
        64,
        1,
        1_000_000,
        doc="Connections the direct endpoint holds at once from one peer address (Kafka: "
        "max.connections.per.ip); more are closed at once and counted.",
        read_by="leader",
    ),
    Setting(
        "direct_unauthenticated_max_frame_bytes",
        "queueflow.direct.unauthenticated.max.frame.bytes",
        65536,
        1024,
        16 * 1024 * 1024,
        doc="The largest frame (bytes) the direct endpoint reads on a connection before one of "
        "its frames was verified (signed by a member; auth mode none: decoded as a request); a "
        "larger announced size closes the connection before its body is read (Kafka: "
        "sasl.server.max.receive.size).",
        read_by="leader",
    ),
    Setting(
        "direct_max_frame_bytes",
        "queueflow.direct.max.frame.bytes",
        1024 * 1024,
        1024,
        16 * 1024 * 1024,
        doc="The largest frame (bytes) the direct endpoint reads once a connection is verified "
        "(a ShareFetch with 10,000 single-offset acknowledgements is about 210 KB).",
        read_by="leader",
    ),
    Setting(
        "direct_unauthenticated_idle_ms",
        "queueflow.direct.unauthenticated.idle.ms",
        10000,
        100,
        3600000,
        doc="How long (ms) the direct endpoint waits for a new connection's first frame to start "
        "before closing it.",
        read_by="leader",
    ),
    Setting(
        "direct_frame_read_timeout_ms",
        "queueflow.direct.frame.read.timeout.ms",
        10000,
        100,
        3600000,
        doc="How long (ms) a frame may take to arrive once its first byte did; a slower one "
        "closes the connection (slowloris).",
        read_by="leader",
    ),
    Setting(
        "direct_connections_max_idle_ms",
        "queueflow.direct.connections.max.idle.ms",
        600000,
        1000,
        86400000,
        doc="How long (ms) a verified direct connection may go without a frame and without a "
        "request under way before the endpoint closes it (Kafka: connections.max.idle.ms); "
        "members reconnect on their next request.",
        read_by="leader",
    ),
    Setting(
        "direct_write_timeout_ms",
        "queueflow.direct.write.timeout.ms",
        10000,
        100,
        3600000,
        doc="How long (ms) an answer may wait for the peer to read earlier ones (the socket's "
        "send buffer full) before the endpoint closes the connection.",
        read_by="leader",
    ),
    Setting(
        "state_durability",
        "queueflow.leader.state.durability",
        StateDurability.ACKED,
        doc="acked: an answer (direct or on the reply topic) leaves once the broker acknowledged "
        "its state change in the changelog, so delivery counts are exact across crashes; "
        "buffered: at once (faster; a leader crash may lose a change already answered).",
        read_by="leader",
    ),
    Setting(
        "processing_guarantee",
        "queueflow.processing.guarantee",
        ProcessingGuarantee.AT_LEAST_ONCE,
        doc="at_least_once: a share agent's results are published before its outcome is "
        "recorded (a crash in between publishes them again); exactly_once: its ACCEPTs and "
        "results commit in one Kafka transaction, and leaders read the acknowledgements "
        'read_committed from the ack topic (docs/architecture.md "Exactly-once: transactional '
        'acknowledgements").',
        read_by="leader, share agent",
    ),
    Setting(
        "transaction_timeout_ms",
        "queueflow.transaction.timeout.ms",
        10000,
        1000,
        900000,
        doc="With exactly_once: the transaction timeout (ms) of the share agents' "
        "transactional producers (Kafka: transaction.timeout.ms, at most the broker's "
        "transaction.max.timeout.ms, default 900000); a transaction left open by a dead "
        "member delays lock expiries on its partitions by up to this long.",
        read_by="leader, share agent",
    ),
    Setting(
        "renew_acknowledge_enable",
        "share.renew.acknowledge.enable",
        True,
        doc="Whether members may RENEW acquisition locks (KIP-1222); share agents whose "
        "handler_timeout_ms outlasts the lock renew while the handler runs.",
        read_by="leader, share agent",
    ),
    Setting(
        "record_lock_max_renewal_ms",
        "share.record.lock.max.renewal.ms",
        900000,
        1000,
        86400000,
        doc="The longest (ms) a record may stay Acquired by one member through RENEWs "
        "(KIP-1222), counted from its acquisition: a RENEW that can't extend the lock within it "
        "is refused with INVALID_RECORD_STATE and the lock runs out as usual (default 15 minutes, "
        "30x the default lock duration; keep it above a share agent's handler_timeout_ms).",
        read_by="leader",
    ),
    Setting(
        "member_max_in_flight_records",
        "share.member.max.in.flight.records",
        1000,
        1,
        10000,
        doc="The most records one member may hold Acquired in one share-partition; a ShareFetch "
        "beyond it acquires fewer or none (no error). Distinct from "
        "`group.share.partition.max.record.locks`, which bounds the whole share-partition.",
        read_by="leader",
    ),
    Setting(
        "member_max_acquisition_rate",
        "share.member.max.acquisition.rate",
        20000,
        0,
        None,
        doc="Records per second one member may acquire from one share-partition (a token "
        "bucket holding one second's worth); a ShareFetch beyond it acquires fewer or none (no "
        "error). 0: unlimited.",
        read_by="leader",
    ),
    Setting(
        "member_release_abuse_records",
        "share.member.release.abuse.records",
        200,
        0,
        None,
        doc="A member that RELEASEs at least this many records of one share-partition on their "
        "second delivery or later within `share.member.release.abuse.window.ms` while handling "
        "(ACCEPT/REJECT) almost none "
        "(`share.member.release.abuse.ratio.percent`) is fenced from it for the window and the "
        "delivery counts its releases added are rolled back. 0: never.",
        read_by="leader",
    ),
    Setting(
        "member_release_abuse_ratio_percent",
        "share.member.release.abuse.ratio.percent",
        90,
        1,
        100,
        doc="The share (percent) of RELEASEs among a member's acknowledged records in the window "
        "at or above which `share.member.release.abuse.records` releases fence it.",
        read_by="leader",
    ),
    Setting(
        "member_release_abuse_window_ms",
        "share.member.release.abuse.window.ms",
        60000,
        1000,
        3600000,
        doc="The window (ms) over which a member's RELEASEs are counted, and how long a member "
        "fenced for releasing without handling stays refused by the share-partition.",
        read_by="leader",
    ),
    Setting(
        "member_join_grace_ms",
        "share.member.join.grace.ms",
        15000,
        1000,
        None,
        doc="A member that joined but sent no heartbeat with its member epoch within this long "
        "(ms; at least twice the heartbeat interval) is removed early; until that heartbeat it "
        "is provisional and doesn't count toward `group.share.max.size`.",
        read_by="coordinator",
    ),
    Setting(
        "lock_check_interval_ms",
        "queueflow.lock.check.interval.ms",
        250,
        10,
        60000,
        doc="How often (ms) leaders check acquisition locks and coordinators check sessions.",
        read_by="leader, coordinator (ticker)",
    ),
    Setting(
        "redelivery_max_delay_ms",
        "queueflow.redelivery.max.delay.ms",
        43200000,
        1000,
        604800000,
        doc="The longest delay (ms) a RELEASE may ask for before the record is Available again "
        "(`queueflow.release(delay=...)`; 12 hours by default, as an SQS visibility timeout); "
        "a longer one is refused with INVALID_REQUEST, the record unchanged. It also bounds "
        "the group config `share.redelivery.backoff.max.ms`.",
        read_by="leader",
    ),
    Setting(
        "delivery_throttle_enable",
        "queueflow.delivery.throttle.enable",
        False,
        doc="Throttled delivery (as Kafka 4.2): records past half the delivery count limit are "
        "acquired in smaller batches, halved with every further delivery, and the last attempt "
        "alone, so a poison record takes fewer neighbours towards the limit (docs/concepts.md "
        '"Throttled delivery"). Off by default: with it, a member that acquires and RELEASEs '
        "in a loop can Archive up to `share.member.release.abuse.records` / (limit - 1) "
        "records before it is fenced.",
        read_by="leader",
    ),
    Setting(
        "auth_mode",
        "queueflow.auth.mode",
        AuthMode.AUTO,
        doc="hmac: every control message is signed (workers with keys of "
        "`queueflow.auth.secret`, members with their member credential; member requests also "
        "encrypted to the workers) and bound to where it is sent; unsigned, forged, misaddressed, "
        "stale or replayed ones are dropped (docs/operations.md, threat model); none: no "
        "authentication (a trusted cluster); auto: hmac when `queueflow.auth.secret` or "
        "`queueflow.auth.member.credential` is set, else none on a PLAINTEXT cluster and a "
        "refusal to start on a SASL or SSL one.",
        read_by="every worker and member (same value everywhere)",
    ),
    Setting(
        "auth_secret",
        "queueflow.auth.secret",
        "",
        doc="The worker secret of `queueflow.auth.mode=hmac` (same value on every worker and "
        "admin; never logged): at least 32 random characters, e.g. from "
        '`python -c "import secrets; print(secrets.token_urlsafe(32))"`; shorter, common or '
        "low-entropy secrets are refused at start. Members should get a member credential "
        "instead (`queueflow.auth.member.credential`).",
        read_by="every worker and admin (members: only if they also run workers)",
    ),
    Setting(
        "auth_member_credential",
        "queueflow.auth.member.credential",
        "",
        doc="A member credential (`qfm1.`..., from `queueflow auth member-credential --app-id "
        "APP` on a machine holding `queueflow.auth.secret`): lets a member process join share "
        "groups, fetch and acknowledge under `queueflow.auth.mode=hmac` without the worker "
        "secret; it can't sign worker messages (fences, tickets, configs, announcements, "
        "admin requests). Refused at start if made for another app id. Never logged.",
        read_by="member",
    ),
    Setting(
        "auth_tickets",
        "queueflow.auth.tickets",
        TicketPolicy.REQUIRED,
        doc="required: leaders serve a ShareFetch or acknowledgement only with the assignment "
        "ticket of the member's latest heartbeat answer (current member, current epoch, "
        "share-partition assigned; UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH / "
        "UNKNOWN_TOPIC_OR_PARTITION otherwise); optional: a request without a ticket is served "
        "unchecked (only during a rolling upgrade from a queueflow without tickets).",
        read_by="leader",
    ),
    Setting(
        "log_format",
        "queueflow.log.format",
        LogFormat.AUTO,
        doc="How queueflow's structlog events are written to stderr: json (one object per "
        "line), console (human-readable), auto (console when stderr is a terminal, else json).",
        read_by="every worker and member (each process its own)",
    ),
)

_BY_ATTR = {s.attr: s for s in SETTINGS}
_BY_NAME = {s.name: s for s in SETTINGS}


def lookup(key: str) -> Setting:
    """The :class:`Setting` with attribute name or KIP-932 name ``key``.

    Raises:
        KeyError: no such setting (a programming error, unlike an unknown name in
            :meth:`ShareGroupSettings.load`, which raises :class:`ConfigurationError`).
    """
    setting = _BY_ATTR.get(key) or _BY_NAME.get(key)
    if setting is None:
        raise KeyError(f"no share-group setting {key!r}")
    return setting


def int_default(key: str) -> int:
    """The default of the integer setting ``key`` (attribute or KIP-932 name).

    Raises:
        KeyError: no such setting. TypeError: the setting is not an integer.
    """
    default = lookup(key).default
    if not isinstance(default, int) or isinstance(default, bool):
        raise TypeError(f"share-group setting {key!r} is not an integer")
    return default


def str_default(key: str) -> str:
    """The default of the text setting ``key`` (attribute or KIP-932 name).

    Raises:
        KeyError: no such setting. TypeError: the setting is not plain text.
    """
    default = lookup(key).default
    if not isinstance(default, str) or isinstance(default, Choice):
        raise TypeError(f"share-group setting {key!r} is not a text setting")
    return default


def bool_default(key: str) -> bool:
    """The default of the boolean setting ``key`` (attribute or KIP-932 name).

    Raises:
        KeyError: no such setting. TypeError: the setting is not a boolean.
    """
    default = lookup(key).default
    if not isinstance(default, bool):
        raise TypeError(f"share-group setting {key!r} is not a boolean")
    return default


_C = typing.TypeVar("_C", bound=Choice)


def choice_default(key: str, kind: type[_C]) -> _C:
    """The default of the choice setting ``key`` (attribute or KIP-932 name), a ``kind``.

    Raises:
        KeyError: no such setting. TypeError: the setting is not a ``kind`` choice.
    """
    default = lookup(key).default
    if not isinstance(default, kind):
        raise TypeError(f"share-group setting {key!r} is not a {kind.__name__}")
    return default


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareGroupSettings:
    """Validated share-group settings (KIP-932 "Configuration"; Kafka ``group.share.*`` configs).

    Build with keywords (``ShareGroupSettings(delivery_count_limit=3)``) or :meth:`load` with
    KIP-932 names (``{"group.share.delivery.count.limit": 3}``). Keyword-only, so that adding a
    setting never shifts positional arguments. The attributes and their defaults are those of
    :data:`SETTINGS` (checked at import by :func:`check_declarations`); durations are in ms.

    Cross-setting checks:

    * ``group.share.min.record.lock.duration.ms`` <= ``group.share.record.lock.duration.ms``
      <= ``group.share.max.record.lock.duration.ms``;
    * ``group.share.heartbeat.interval.ms`` < ``group.share.session.timeout.ms``.

    Raises:
        ConfigurationError: a value is of the wrong type or out of its allowed range, or a
            cross-setting check fails; the message names the setting(s), the value, where it came
            from and the allowed range.
    """

    # Defaults are read from SETTINGS (never written here); the annotations keep the attributes
    # typed for mypy, and check_declarations() fails at import if they disagree with the table.
    record_lock_duration_ms: int = int_default("record_lock_duration_ms")
    min_record_lock_duration_ms: int = int_default("min_record_lock_duration_ms")
    max_record_lock_duration_ms: int = int_default("max_record_lock_duration_ms")
    delivery_count_limit: int = int_default("delivery_count_limit")
    partition_max_record_locks: int = int_default("partition_max_record_locks")
    session_timeout_ms: int = int_default("session_timeout_ms")
    heartbeat_interval_ms: int = int_default("heartbeat_interval_ms")
    min_delivery_count_limit: int = int_default("min_delivery_count_limit")
    max_delivery_count_limit: int = int_default("max_delivery_count_limit")
    min_partition_max_record_locks: int = int_default("min_partition_max_record_locks")
    max_partition_max_record_locks: int = int_default("max_partition_max_record_locks")
    min_session_timeout_ms: int = int_default("min_session_timeout_ms")
    max_session_timeout_ms: int = int_default("max_session_timeout_ms")
    min_heartbeat_interval_ms: int = int_default("min_heartbeat_interval_ms")
    max_heartbeat_interval_ms: int = int_default("max_heartbeat_interval_ms")
    max_size: int = int_default("max_size")
    assignors: str = str_default("assignors")
    assignor_refresh_interval_ms: int = int_default("assignor_refresh_interval_ms")
    member_assignors: str = str_default("member_assignors")
    client_rack: str = str_default("client_rack")
    auto_offset_reset: AutoOffsetReset = choice_default("auto_offset_reset", AutoOffsetReset)
    snapshot_update_records_per_snapshot: int = int_default("snapshot_update_records_per_snapshot")
    max_poll_records: int = int_default("max_poll_records")
    share_acquire_mode: ShareAcquireMode = choice_default("share_acquire_mode", ShareAcquireMode)
    acknowledgement_linger_ms: int = int_default("acknowledgement_linger_ms")
    request_timeout_ms: int = int_default("request_timeout_ms")
    join_timeout_ms: int = int_default("join_timeout_ms")
    broker_wait_ms: int = int_default("broker_wait_ms")
    coordinator_topic_partitions: int = int_default("coordinator_topic_partitions")
    recovery_stall_ms: int = int_default("recovery_stall_ms")
    shutdown_timeout_ms: int = int_default("shutdown_timeout_ms")
    fetch_max_wait_ms: int = int_default("fetch_max_wait_ms")
    check_crcs: bool = bool_default("check_crcs")
    leader_listener: str = str_default("leader_listener")
    leader_listener_security_protocol: ListenerSecurityProtocol = choice_default(
        "leader_listener_security_protocol", ListenerSecurityProtocol
    )
    leader_listener_ssl_keystore_type: KeystoreType = choice_default(
        "leader_listener_ssl_keystore_type", KeystoreType
    )
    leader_listener_ssl_keystore_location: str = str_default(
        "leader_listener_ssl_keystore_location"
    )
    leader_listener_ssl_key_password: str = dataclasses.field(
        default=str_default("leader_listener_ssl_key_password"), repr=False
    )
    leader_listener_ssl_truststore_location: str = str_default(
        "leader_listener_ssl_truststore_location"
    )
    leader_listener_ssl_endpoint_identification_algorithm: str = str_default(
        "leader_listener_ssl_endpoint_identification_algorithm"
    )
    leader_listener_ssl_client_auth: SslClientAuth = choice_default(
        "leader_listener_ssl_client_auth", SslClientAuth
    )
    leader_record_cache_bytes: int = int_default("leader_record_cache_bytes")
    kafka_listener: str = str_default("kafka_listener")
    kafka_listener_sasl_enabled_mechanisms: str = str_default(
        "kafka_listener_sasl_enabled_mechanisms"
    )
    kafka_listener_ssl_keystore_location: str = str_default("kafka_listener_ssl_keystore_location")
    kafka_listener_ssl_key_password: str = dataclasses.field(
        default=str_default("kafka_listener_ssl_key_password"), repr=False
    )
    kafka_listener_ssl_truststore_location: str = str_default(
        "kafka_listener_ssl_truststore_location"
    )
    kafka_listener_ssl_client_auth: SslClientAuth = choice_default(
        "kafka_listener_ssl_client_auth", SslClientAuth
    )
    kafka_listener_leaders: KafkaListenerLeaders = choice_default(
        "kafka_listener_leaders", KafkaListenerLeaders
    )
    leader_advertised_host: str = str_default("leader_advertised_host")
    direct_max_connections: int = int_default("direct_max_connections")
    direct_max_connections_per_ip: int = int_default("direct_max_connections_per_ip")
    direct_unauthenticated_max_frame_bytes: int = int_default(
        "direct_unauthenticated_max_frame_bytes"
    )
    direct_max_frame_bytes: int = int_default("direct_max_frame_bytes")
    direct_unauthenticated_idle_ms: int = int_default("direct_unauthenticated_idle_ms")
    direct_frame_read_timeout_ms: int = int_default("direct_frame_read_timeout_ms")
    direct_connections_max_idle_ms: int = int_default("direct_connections_max_idle_ms")
    direct_write_timeout_ms: int = int_default("direct_write_timeout_ms")
    state_durability: StateDurability = choice_default("state_durability", StateDurability)
    processing_guarantee: ProcessingGuarantee = choice_default(
        "processing_guarantee", ProcessingGuarantee
    )
    transaction_timeout_ms: int = int_default("transaction_timeout_ms")
    renew_acknowledge_enable: bool = bool_default("renew_acknowledge_enable")
    record_lock_max_renewal_ms: int = int_default("record_lock_max_renewal_ms")
    member_max_in_flight_records: int = int_default("member_max_in_flight_records")
    member_max_acquisition_rate: int = int_default("member_max_acquisition_rate")
    member_release_abuse_records: int = int_default("member_release_abuse_records")
    member_release_abuse_ratio_percent: int = int_default("member_release_abuse_ratio_percent")
    member_release_abuse_window_ms: int = int_default("member_release_abuse_window_ms")
    member_join_grace_ms: int = int_default("member_join_grace_ms")
    lock_check_interval_ms: int = int_default("lock_check_interval_ms")
    redelivery_max_delay_ms: int = int_default("redelivery_max_delay_ms")
    delivery_throttle_enable: bool = bool_default("delivery_throttle_enable")
    auth_mode: AuthMode = choice_default("auth_mode", AuthMode)
    auth_secret: str = dataclasses.field(default=str_default("auth_secret"), repr=False)
    auth_member_credential: str = dataclasses.field(
        default=str_default("auth_member_credential"), repr=False
    )
    auth_tickets: TicketPolicy = choice_default("auth_tickets", TicketPolicy)
    log_format: LogFormat = choice_default("log_format", LogFormat)

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> ShareGroupSettings:
        """Resolve every setting from ``overrides`` (attr or KIP name), ``env``, then defaults.

        Args:
            overrides: values by attribute name or KIP-932 name.
            env: the environment to read (defaults to :data:`os.environ`).

        Raises:
            ConfigurationError: an unknown setting name, a value out of range, or a failed
                cross-setting check.
        """
        env = os.environ if env is None else env
        check_environment(env)
        given: dict[str, tuple[Any, str]] = {}
        for key, raw in (overrides or {}).items():
            setting = _BY_ATTR.get(key) or _BY_NAME.get(key)
            if setting is None:
                raise UnknownNameError(
                    f"unknown share-group setting {key!r}"
                    f"{did_you_mean(str(key), [*_BY_NAME, *_BY_ATTR])}; every setting, by "
                    "KIP-932 name or attribute name: docs/configuration.md or "
                    "`python -m queueflow.settings`"
                )
            given[setting.attr] = (raw, "arguments")
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for setting in SETTINGS:
            if setting.attr in given:
                raw, source = given[setting.attr]
            elif setting.env in env:
                raw, source = env[setting.env], f"${setting.env}"
            else:
                raw, source = setting.default, "default"
            values[setting.attr] = setting.parse(raw, source)
            sources[setting.attr] = source
        return cls._build(values, sources)

    @classmethod
    def _build(cls, values: dict[str, Any], sources: dict[str, str]) -> ShareGroupSettings:
        # Cross-checks run here too so that their messages can say where each value came from;
        # __post_init__ repeats them (cheaply) for direct construction.
        _cross_check(values, sources)
        return cls(**values)

    def __post_init__(self) -> None:
        values: dict[str, Any] = {}
        for setting in SETTINGS:  # convert and check values given to the constructor directly
            value = setting.parse(getattr(self, setting.attr), "arguments")
            object.__setattr__(self, setting.attr, value)
            values[setting.attr] = value
        _cross_check(values, {})

    @property
    def control_auth_mode(self) -> AuthMode:
        """The authentication control messages use: :attr:`AuthMode.HMAC` or
        :attr:`AuthMode.NONE`.

        ``queueflow.auth.mode=auto`` means ``hmac`` when ``queueflow.auth.secret`` or
        ``queueflow.auth.member.credential`` is set, else ``none``;
        :func:`queueflow.kafka.config.check_control_auth` refuses the latter on a secured
        cluster.
        """
        if self.auth_mode is AuthMode.AUTO:
            keyed = self.auth_secret or self.auth_member_credential
            return AuthMode.HMAC if keyed else AuthMode.NONE
        return self.auth_mode

    def as_kip_names(self) -> dict[str, int | str]:
        """The settings keyed by their KIP-932 names, as written in configs (for logs, admin
        output and docs): integers stay integers, everything else is its config text."""
        out: dict[str, int | str] = {}
        for s in SETTINGS:
            value = getattr(self, s.attr)
            if s.attr in _SECRETS and value:
                out[s.name] = "***"
            elif isinstance(value, int) and not isinstance(value, bool):
                out[s.name] = value
            else:
                out[s.name] = show_value(value)
        return out


#: The min/max pairs that bound the group configs (KIP-1240; queueflow.engine.group_config).
_GROUP_BOUNDS = (
    ("min_delivery_count_limit", "max_delivery_count_limit"),
    ("min_partition_max_record_locks", "max_partition_max_record_locks"),
    ("min_session_timeout_ms", "max_session_timeout_ms"),
    ("min_heartbeat_interval_ms", "max_heartbeat_interval_ms"),
)


#: Settings shown as ``***`` (logs, admin output).
_SECRETS: Final = (
    "auth_secret",
    "auth_member_credential",
    "leader_listener_ssl_key_password",
    "kafka_listener_ssl_key_password",
)


def _cross_check(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Checks between settings; ``sources`` (attr -> where from) only enriches the messages."""

    def show(attr: str) -> str:
        source = sources.get(attr, "arguments")
        return f"{_BY_ATTR[attr].name}={values[attr]} (from {source})"

    low, lock, high = (
        values["min_record_lock_duration_ms"],
        values["record_lock_duration_ms"],
        values["max_record_lock_duration_ms"],
    )
    if low > high:
        raise ConfigurationError(
            f"{show('min_record_lock_duration_ms')} exceeds "
            f"{show('max_record_lock_duration_ms')}; the minimum must not exceed the maximum"
        )
    if lock > high:
        raise ConfigurationError(
            f"{show('record_lock_duration_ms')} exceeds {show('max_record_lock_duration_ms')}; "
            f"allowed range [{low}..{high}]: raise the maximum or lower the lock duration"
        )
    if lock < low:
        raise ConfigurationError(
            f"{show('record_lock_duration_ms')} is below {show('min_record_lock_duration_ms')}; "
            f"allowed range [{low}..{high}]: lower the minimum or raise the lock duration"
        )
    for low_attr, high_attr in _GROUP_BOUNDS:
        if values[low_attr] > values[high_attr]:
            raise ConfigurationError(
                f"{show(low_attr)} exceeds {show(high_attr)}; the minimum must not exceed the "
                "maximum"
            )
    if values["heartbeat_interval_ms"] >= values["session_timeout_ms"]:
        raise ConfigurationError(
            f"{show('heartbeat_interval_ms')} must be below {show('session_timeout_ms')}"
        )
    if (
        values["auth_mode"] is AuthMode.HMAC
        and not values["auth_secret"]
        and not values["auth_member_credential"]
    ):
        raise ConfigurationError(
            f"{_BY_ATTR['auth_mode'].name}=hmac needs {_BY_ATTR['auth_secret'].name} (or "
            f"${_BY_ATTR['auth_secret'].env}) on every worker of the app, and that or "
            f"{_BY_ATTR['auth_member_credential'].name} on members"
        )
    if values["auth_secret"]:
        problem = secret_problem(values["auth_secret"])
        if problem:
            raise ConfigurationError(problem)
    for attr in ("assignors", "member_assignors"):
        problem = _name_list_problem(values[attr])
        if problem:
            raise ConfigurationError(
                f"{show(attr)}: {problem}; give a comma-separated list of assignor names, "
                "e.g. 'lag,simple'"
            )
    if values["leader_listener"]:
        try:
            listener_address(values["leader_listener"])
        except ValueError as exc:
            raise ConfigurationError(f"{show('leader_listener')}: {exc}") from None
    algorithm = values["leader_listener_ssl_endpoint_identification_algorithm"]
    if algorithm not in ("https", ""):
        raise ConfigurationError(
            f"{show('leader_listener_ssl_endpoint_identification_algorithm')} is not allowed; "
            "use 'https' (check that the leader's certificate names its host) or '' (empty: "
            "don't), as Kafka's ssl.endpoint.identification.algorithm"
        )


def closest_names(name: str, known: typing.Iterable[str]) -> list[str]:
    """The known names closest to ``name``, best first: :func:`difflib.get_close_matches` (at
    most 2, similarity >= 0.6), else those ending like it (``LOCK_DURATION_MS`` ->
    ``..._RECORD_LOCK_DURATION_MS``)."""
    candidates = sorted(set(known))
    close = difflib.get_close_matches(name, candidates, n=2, cutoff=0.6)
    if not close:
        tail = name.upper().strip("_")
        close = [c for c in candidates if tail and c.upper().endswith("_" + tail)][:2]
    return close


def did_you_mean(name: str, known: typing.Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` (or ``'x' or 'y'``) with :func:`closest_names`, else ``""``:
    for error messages."""
    close = closest_names(name, known)
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)" if close else ""


@dataclass(frozen=True, slots=True)
class EnvironmentVariable:
    """A ``QUEUEFLOW_*`` environment variable that is not a setting (each setting's own is
    :attr:`Setting.env`).

    Args:
        name: the variable.
        used_by: what reads it, for docs/configuration.md "Environment variables".
    """

    name: str
    used_by: str


#: Every ``QUEUEFLOW_*`` variable queueflow reads besides the settings' (:attr:`Setting.env`);
#: any other is refused by :func:`check_environment`. Documented in docs/configuration.md
#: "Environment variables" (tests/unit/test_unknown_names.py checks both ways).
ENVIRONMENT: Final = (
    EnvironmentVariable("QUEUEFLOW_ROLE", "App, attach"),
    EnvironmentVariable("QUEUEFLOW_BROKER", "queueflow CLI, the test suite, make demo"),
    EnvironmentVariable("QUEUEFLOW_CACHE_DIR", "local broker"),
    EnvironmentVariable("QUEUEFLOW_HOME", "queueflow broker"),
    EnvironmentVariable("QUEUEFLOW_KAFKA_VERSION", "local broker"),
    EnvironmentVariable("QUEUEFLOW_MAVEN_REPOSITORY", "local broker"),
    EnvironmentVariable("QUEUEFLOW_BROKER_JVM_OPTS", "local broker"),
    EnvironmentVariable("QUEUEFLOW_TOOL_JVM_OPTS", "queueflow broker tool"),
    EnvironmentVariable("QUEUEFLOW_SASL_PASSWORD", "queueflow acls apply"),
    EnvironmentVariable("QUEUEFLOW_APP_ID", "queueflow leader (set for its worker)"),
    EnvironmentVariable("QUEUEFLOW_TOPICS", "queueflow leader (set for its worker)"),
    EnvironmentVariable("QUEUEFLOW_BROKER_URL", "queueflow leader (set for its worker)"),
    EnvironmentVariable("QUEUEFLOW_DASHBOARD_SCREENSHOT", "the dashboard test"),
)


def known_environment() -> frozenset[str]:
    """Every ``QUEUEFLOW_*`` variable queueflow reads: the settings' and :data:`ENVIRONMENT`."""
    return frozenset([*(s.env for s in SETTINGS), *(v.name for v in ENVIRONMENT)])


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Refuse ``QUEUEFLOW_*`` variables queueflow doesn't read (a misspelt setting would
    otherwise be ignored silently).

    Args:
        env: the environment (default :data:`os.environ`).

    Raises:
        UnknownNameError: names every unknown variable with the closest known ones and says to
            rename or unset it.
    """
    env = os.environ if env is None else env
    known = known_environment()
    unknown = sorted(k for k in env if k.startswith("QUEUEFLOW_") and k not in known)
    if not unknown:
        return
    named = []
    bare = [n.removeprefix("QUEUEFLOW_") for n in known]
    for k in unknown:
        close = closest_names(k.removeprefix("QUEUEFLOW_"), bare)
        hint = " or ".join(f"$QUEUEFLOW_{c}" for c in close)
        named.append(f"${k} (did you mean {hint}?)" if close else f"${k}")
    raise UnknownNameError(
        f"unknown environment variable{'s' if len(unknown) > 1 else ''} {', '.join(named)}: "
        "queueflow "
        "reads no such variable; rename or unset it (every QUEUEFLOW_* variable: "
        'docs/configuration.md, "Share-group settings" and "Environment variables")'
    )


def check_keywords(where: str, given: typing.Iterable[str], known: typing.Iterable[str]) -> None:
    """Refuse keyword arguments of ``where`` not in ``known``, with a did-you-mean.

    Raises:
        UnknownNameError: the first unknown keyword, the closest known ones and the signature.
    """
    allowed = sorted(set(known))
    for name in given:
        if name not in allowed:
            raise UnknownNameError(
                f"{where}() got an unknown keyword argument {name!r}"
                f"{did_you_mean(name, allowed)}; it takes {', '.join(allowed)}"
            )


_P = ParamSpec("_P")
_R = TypeVar("_R")


def refuse_unknown_keywords(func: typing.Callable[_P, _R]) -> typing.Callable[_P, _R]:
    """Decorate ``func`` (with no ``**kwargs``) so that an unknown keyword argument raises
    :class:`UnknownNameError` with a did-you-mean (Python's own ``TypeError`` names no
    candidate before 3.13); the known names come from its signature."""
    parameters = inspect.signature(func).parameters
    known = [n for n, p in parameters.items() if p.kind is not p.VAR_KEYWORD and n != "self"]
    where = func.__qualname__.removesuffix(".__init__")

    @functools.wraps(func)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        check_keywords(where, kwargs, known)
        return func(*args, **kwargs)

    return checked


#: Secrets refused whatever their length: the defaults of tutorials and of other tools.
_COMMON_SECRETS: Final = frozenset(
    {
        "changeme",
        "change-me",
        "secret",
        "password",
        "passw0rd",
        "letmein",
        "hunter2",
        "test-secret",
        "default",
        "admin",
        "queueflow",
        "kafka",
        "123456",
        "qwerty",
    }
)
#: The minimum length (characters) of ``queueflow.auth.secret``.
MIN_SECRET_CHARS: Final = 32
#: The minimum estimated entropy (bits) of ``queueflow.auth.secret``.
MIN_SECRET_BITS: Final = 128
_GENERATE = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


def secret_problem(secret: str) -> str:
    """Why ``queueflow.auth.secret`` is too weak (``""``: strong enough).

    Refused: fewer than :data:`MIN_SECRET_CHARS` characters, a common secret (or one repeated),
    a repeat of a shorter string, fewer than 10 distinct characters, or an estimated entropy
    (length times the Shannon entropy of its character frequencies) below
    :data:`MIN_SECRET_BITS` bits. A secret from ``secrets.token_urlsafe(32)`` (43 characters,
    256 bits) always passes.
    """
    how = (
        f"generate one with `{_GENERATE}` and set it on every worker (members get a member "
        "credential: `queueflow auth member-credential --app-id APP`)"
    )
    name = "queueflow.auth.secret"
    if len(secret) < MIN_SECRET_CHARS:
        return f"{name} is {len(secret)} characters; at least {MIN_SECRET_CHARS} are needed: {how}"
    lowered = secret.lower()
    for common in _COMMON_SECRETS:
        if lowered.replace(common, "") == "" or lowered.strip("0123456789!_-. ") in (common,):
            return f"{name} is a common secret ({common!r} or a repeat of it): {how}"
    if secret in (secret + secret)[1:-1]:
        return f"{name} repeats a shorter string: {how}"
    distinct = len(set(secret))
    if distinct < 10:
        return f"{name} has only {distinct} distinct characters (at least 10 needed): {how}"
    counts = [secret.count(c) for c in set(secret)]
    n = len(secret)
    bits = -n * sum(c / n * math.log2(c / n) for c in counts)
    if bits < MIN_SECRET_BITS:
        return (
            f"{name} has an estimated entropy of {bits:.0f} bits (at least {MIN_SECRET_BITS} "
            f"needed): {how}"
        )
    return ""


_ASSIGNOR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _name_list_problem(text: str) -> str:
    """What is wrong with a comma-separated list of assignor names (``""`` if nothing)."""
    if not text.strip():
        return ""
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if not _ASSIGNOR_NAME.fullmatch(n)]
    if bad:
        return f"{bad[0]!r} is not an assignor name (letters, digits, '.', '_', '-')"
    if len(set(names)) != len(names):
        return "an assignor is named twice"
    return ""


def listener_address(text: str) -> tuple[str, int]:
    """``"host:port"`` (``[v6]:port`` for IPv6) → ``(host, port)``.

    Raises:
        ValueError: not ``host:port`` with a port in 0..65535; the message says what is wrong.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not host:port (e.g. 0.0.0.0:0 or 10.0.0.5:9100)")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"the port of {text!r} is not an integer") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"the port of {text!r} is not in 0..65535")
    return host.strip("[]"), number


def check_declarations(cls: type = ShareGroupSettings) -> None:
    """Check that :data:`SETTINGS` is consistent and that ``cls`` declares exactly its settings.

    Runs at import. For each :class:`Setting`, ``cls`` must have a field named :attr:`Setting.attr`
    (in table order), annotated with the type of :attr:`Setting.default` and defaulting to it; the
    table itself must have unique attributes, names and env vars, defaults within their own
    ranges, and bounds or choices that fit the type.

    Raises:
        TypeError: a declaration disagrees; the message names the setting and the difference.
    """
    problems: list[str] = []
    for label, keys in (
        ("attribute", [s.attr for s in SETTINGS]),
        ("name", [s.name for s in SETTINGS]),
        ("env var", [s.env for s in SETTINGS]),
    ):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            problems.append(f"duplicate {label}s in SETTINGS: {', '.join(dupes)}")
    for s in SETTINGS:
        if isinstance(s.default, int) and not isinstance(s.default, bool):
            if s.minimum is not None and s.maximum is not None and s.minimum > s.maximum:
                problems.append(f"{s.name}: minimum {s.minimum} > maximum {s.maximum}")
        elif s.minimum is not None or s.maximum is not None:
            problems.append(f"{s.name}: only an integer setting can have bounds")
        try:
            s.parse(s.default, "default")
        except ConfigurationError as exc:
            problems.append(str(exc))
        if "|" in s.doc or "|" in s.read_by:
            problems.append(f"{s.name}: '|' in doc or read_by breaks the Markdown table")

    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__qualname__} is not a dataclass")
    hints = typing.get_type_hints(cls)
    declared = [f.name for f in dataclasses.fields(cls)]
    expected = [s.attr for s in SETTINGS]
    if declared != expected:
        missing = [a for a in expected if a not in declared]
        extra = [a for a in declared if a not in expected]
        problems.append(
            f"{cls.__qualname__} fields differ from SETTINGS: missing {missing}, extra {extra}"
            + ("" if missing or extra else " (same names, different order)")
        )
    for f in dataclasses.fields(cls):
        if f.name not in _BY_ATTR:
            continue
        s = _BY_ATTR[f.name]
        if hints.get(f.name) is not type(s.default):
            problems.append(
                f"{cls.__qualname__}.{f.name} is annotated {hints.get(f.name)!r}, but {s.name} "
                f"is {type(s.default).__name__}"
            )
        if type(f.default) is not type(s.default) or f.default != s.default:
            problems.append(
                f"{cls.__qualname__}.{f.name} defaults to {f.default!r}, but {s.name} "
                f"defaults to {s.default!r}"
            )
    if problems:
        raise TypeError("share-group settings declarations disagree:\n  " + "\n  ".join(problems))


def markdown_table() -> str:
    """The settings table of ``docs/configuration.md``, generated from :data:`SETTINGS`.

    Returns:
        A Markdown table (header, separator, one row per setting), ending with a newline.
        Regenerate the doc's copy with ``python -m queueflow.settings``.
    """
    rows = [
        "| Setting (KIP-932 / Kafka name) | Environment variable | Default | Allowed | Read by "
        "| Meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        allowed = ", ".join(f"`{c}`" for c in s.choices) if s.choices else f"`{s.allowed()}`"
        rows.append(
            f"| `{s.name}` <br>(`{s.attr}`) | `{s.env}` | `{show_value(s.default)}` | {allowed} "
            f"| {s.read_by} | {s.doc} |"
        )
    return "\n".join(rows) + "\n"


#: The comments around the generated table in ``docs/configuration.md``.
TABLE_START = "<!-- settings-table:start -->"
TABLE_END = "<!-- settings-table:end -->"


def with_markdown_table(text: str) -> str:
    """``text`` (a Markdown document) with the table between the marker comments regenerated.

    Args:
        text: a document with one :data:`TABLE_START` line and a later :data:`TABLE_END` line.

    Returns:
        The document with :func:`markdown_table` between the markers (the rest unchanged).

    Raises:
        ValueError: the markers are missing or out of order.
    """
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"the document needs {TABLE_START} and then {TABLE_END}")
    head = text[: start + len(TABLE_START)]
    return f"{head}\n{markdown_table()}{text[end:]}"


def _main(argv: list[str]) -> int:
    """``python -m queueflow.settings [--write PATH]``: print the table, or update PATH in place."""
    if not argv:
        print(markdown_table(), end="")
        return 0
    if len(argv) == 2 and argv[0] == "--write":
        with open(argv[1], encoding="utf-8") as f:
            text = f.read()
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(with_markdown_table(text))
        return 0
    print("usage: python -m queueflow.settings [--write docs/configuration.md]")
    return 2


check_declarations()


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
