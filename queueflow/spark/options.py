"""Options of the ``queueflow`` Spark source (``spark.readStream.format("queueflow")``) and of
:func:`queueflow.spark.acknowledge`: parsing, validation, and the Kafka client configuration
they describe.

Spark hands a data source its options as strings in a case-insensitive dict (keys lower-cased),
so every option here is parsed from a string, and a wrong one raises
:class:`~queueflow.errors.ConfigurationError` naming the option, the value given and what is
allowed. The parsed :class:`SourceOptions` holds only strings and numbers: it is pickled to the
planner and to executors, and each process builds its own Kafka clients (an ``ssl.SSLContext``
cannot be pickled) with :meth:`SourceOptions.kafka_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.options import KafkaOptions, lower_options, shown_value

__all__ = [
    "SPARK_OPTIONS",
    "ConnectionOptions",
    "SourceOptions",
    "parse_connection_options",
    "parse_source_options",
]

#: Options Spark itself may put in a source's options; accepted and ignored.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

_CONNECTION_KEYS = {"bootstrap.servers", "kafka.bootstrap.servers", "app.id", "group"}
_SOURCE_KEYS = {
    "topic",
    "topics",
    "maxrecordspertrigger",
    "lockdurationms",
    "minpartitions",
    "renewintervalms",
    "polltimeoutms",
}

#: Documented source option names, as users spell them (for error messages).
SOURCE_OPTION_NAMES = (
    "bootstrap.servers (or kafka.bootstrap.servers)",
    "app.id",
    "group",
    "topic / topics",
    "maxRecordsPerTrigger",
    "lockDurationMs",
    "minPartitions",
    "renewIntervalMs",
    "pollTimeoutMs",
    "kafka.<client setting>",
)


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Where the share group lives: the cluster, the queueflow app and the group.

    Attributes:
        kafka: the cluster and its ``kafka.<name>`` client settings
            (:class:`~queueflow.kafka.options.KafkaOptions`).
        app_id: the id of the queueflow app whose leaders and coordinator serve the group.
        group: the share group id.
    """

    kafka: KafkaOptions
    app_id: str
    group: str

    @property
    def bootstrap(self) -> str:
        """``host:port[,host:port]`` of the cluster."""
        return self.kafka.bootstrap

    def kafka_config(self, client_id: str = "queueflow-spark") -> KafkaClientConfig:
        """The aiokafka configuration of these options (a fresh ``ssl_context`` if any); call
        it where the client runs.

        Args:
            client_id: the client id, unless ``kafka.client.id`` was given.
        """
        return self.kafka.client_config(client_id)


@dataclass(frozen=True, slots=True)
class SourceOptions(ConnectionOptions):
    """The parsed options of one ``queueflow`` source (see docs/spark.md, "Options").

    Attributes:
        topics: the subscribed topics (at least one).
        max_records_per_trigger: the most offsets one micro-batch acquires, or None for the
            group's ``max.poll.records``.
        lock_duration_ms: this member's acquisition lock duration (ms), or None for the group's
            ``group.share.record.lock.duration.ms``.
        min_partitions: the least number of Spark tasks per batch, or None for one task per
            share-partition.
        renew_interval_ms: how often (ms) the locks of acquired, unacknowledged records are
            renewed, or None for a third of the lock duration.
        poll_timeout_ms: how long (ms) ``latestOffset`` waits for records.
    """

    topics: tuple[str, ...] = ()
    max_records_per_trigger: int | None = None
    lock_duration_ms: int | None = None
    min_partitions: int | None = None
    renew_interval_ms: int | None = None
    poll_timeout_ms: int = 500


def _required(opts: Mapping[str, str], name: str, what: str) -> str:
    value = opts.get(name.lower(), "").strip()
    if not value:
        raise ConfigurationError(
            f"option {name!r} is missing (given: {opts.get(name.lower())!r}); set it to {what}, "
            f'e.g. .option("{name}", ...)'
        )
    return value


def _int(opts: Mapping[str, str], name: str, minimum: int, maximum: int = 2**31 - 1) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or not minimum <= value <= maximum:
        raise ConfigurationError(
            f"option {name!r}={raw!r} is not allowed; use an integer from {minimum} to {maximum}"
        )
    return value


def _connection(opts: Mapping[str, str]) -> tuple[KafkaOptions, str, str]:
    kafka = KafkaOptions.parse(opts)
    app_id = _required(opts, "app.id", "the id of the queueflow app whose leaders serve the group")
    group = _required(opts, "group", "the share group id")
    return kafka, app_id, group


def _check_unknown(opts: Mapping[str, str], known: set[str]) -> None:
    unknown = sorted(
        k for k in opts if k not in known and k not in SPARK_OPTIONS and not k.startswith("kafka.")
    )
    if unknown:
        shown = ", ".join(f"{k}={shown_value(k, opts[k])}" for k in unknown)
        raise ConfigurationError(
            f"unknown option(s) {shown} for format 'queueflow'; allowed: "
            + ", ".join(SOURCE_OPTION_NAMES)
        )


def parse_connection_options(options: Mapping[str, Any]) -> ConnectionOptions:
    """Parse the options naming a share group (for :func:`queueflow.spark.acknowledge`).

    Args:
        options: ``bootstrap.servers``, ``app.id``, ``group`` and ``kafka.<name>`` client
            settings; the source's other options (``topic``, ``maxRecordsPerTrigger`` ...) are
            accepted and ignored, so the source's options can be passed as they are.

    Raises:
        ConfigurationError: a required option is missing, or one is unknown or invalid; the
            message names it, the value and what is allowed.
    """
    opts = lower_options(options)
    _check_unknown(opts, _CONNECTION_KEYS | _SOURCE_KEYS)
    return ConnectionOptions(*_connection(opts))


def parse_source_options(options: Mapping[str, Any]) -> SourceOptions:
    """Parse and validate the options of a ``queueflow`` source.

    Args:
        options: Spark's options (string values, any key case).

    Raises:
        ConfigurationError: a required option is missing (``bootstrap.servers``, ``app.id``,
            ``group``, ``topic``/``topics``), a value is not allowed, or an option is unknown;
            the message names the option, the value and what is allowed.
    """
    opts = lower_options(options)
    _check_unknown(opts, _CONNECTION_KEYS | _SOURCE_KEYS)
    kafka, app_id, group = _connection(opts)
    if "topic" in opts and "topics" in opts:
        raise ConfigurationError(
            f"options 'topic'={opts['topic']!r} and 'topics'={opts['topics']!r} are both set; "
            "give one ('topics' takes a comma-separated list)"
        )
    raw_topics = opts.get("topics", opts.get("topic", ""))
    topics = tuple(dict.fromkeys(t.strip() for t in raw_topics.split(",") if t.strip()))
    if not topics:
        raise ConfigurationError(
            f"option 'topic' (or 'topics') is missing or empty (given: {raw_topics or None!r}); "
            "set it to the topic to consume, or a comma-separated list of topics"
        )
    lock = _int(opts, "lockDurationMs", 1000, 3_600_000)
    renew = _int(opts, "renewIntervalMs", 100, 3_600_000)
    if lock is not None and renew is not None and renew >= lock:
        raise ConfigurationError(
            f"option 'renewIntervalMs'={renew} must be below 'lockDurationMs'={lock}, or the "
            "locks expire before they are renewed; e.g. a third of it"
        )
    poll = _int(opts, "pollTimeoutMs", 0, 600_000)
    return SourceOptions(
        kafka,
        app_id,
        group,
        topics=topics,
        max_records_per_trigger=_int(opts, "maxRecordsPerTrigger", 1),
        lock_duration_ms=lock,
        min_partitions=_int(opts, "minPartitions", 1, 100_000),
        renew_interval_ms=renew,
        poll_timeout_ms=500 if poll is None else poll,
    )
