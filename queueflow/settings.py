"""Share-group settings, declared once with their KIP-932 names, defaults, ranges and env vars.

Each setting is a :class:`Setting` in :data:`SETTINGS`. A value comes from, in order: the keyword
given to :class:`ShareGroupSettings`, the environment variable (the KIP-932 name upper-cased with
dots turned into underscores and a ``QUEUEFLOW_`` prefix, e.g.
``QUEUEFLOW_GROUP_SHARE_RECORD_LOCK_DURATION_MS``), then the default. Names follow KIP-932 and the
Kafka 4.x broker configs where an equivalent exists; queueflow-only settings start with
``queueflow.``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from queueflow.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Setting:
    """Declaration of one setting.

    Args:
        attr: the Python attribute on :class:`ShareGroupSettings`.
        name: the KIP-932 / Kafka config name (or ``queueflow.*``).
        default: the default value.
        minimum / maximum: inclusive bounds for integers, or ``None``.
        choices: allowed values for strings, or ``None``.
        doc: one line for the configuration reference.
    """

    attr: str
    name: str
    default: int | str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    doc: str = ""

    @property
    def env(self) -> str:
        """The environment variable that overrides the default."""
        return "QUEUEFLOW_" + self.name.replace("queueflow.", "").replace(".", "_").upper()

    def allowed(self) -> str:
        """The allowed range, as shown in errors and docs."""
        if self.choices:
            return " | ".join(self.choices)
        lo = "" if self.minimum is None else str(self.minimum)
        hi = "" if self.maximum is None else str(self.maximum)
        return f"[{lo}..{hi}]"

    def parse(self, raw: Any, source: str) -> int | str:
        """Convert and check ``raw``; raise :class:`ConfigurationError` naming the setting."""
        if isinstance(self.default, int):
            try:
                value: int | str = int(raw)
            except (TypeError, ValueError):
                raise ConfigurationError(
                    f"{self.name}={raw!r} (from {source}) is not an integer; "
                    f"allowed range {self.allowed()}, default {self.default}"
                ) from None
            if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum
            ):
                raise ConfigurationError(
                    f"{self.name}={value} (from {source}) is out of range; "
                    f"allowed range {self.allowed()}, default {self.default}"
                )
            return value
        value = str(raw)
        if self.choices and value not in self.choices:
            raise ConfigurationError(
                f"{self.name}={value!r} (from {source}) is not allowed; "
                f"choose one of {self.allowed()}, default {self.default!r}"
            )
        return value


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "record_lock_duration_ms",
        "group.share.record.lock.duration.ms",
        30000,
        1000,
        3600000,
        doc="Acquisition lock duration (ms) for records a consumer acquires.",
    ),
    Setting(
        "max_record_lock_duration_ms",
        "group.share.max.record.lock.duration.ms",
        60000,
        30000,
        3600000,
        doc="Upper bound (ms) for a consumer's own lock duration.",
    ),
    Setting(
        "delivery_count_limit",
        "group.share.delivery.count.limit",
        5,
        2,
        10,
        doc="Delivery attempts after which a record is Archived.",
    ),
    Setting(
        "partition_max_record_locks",
        "group.share.partition.max.record.locks",
        2000,
        100,
        10000,
        doc="In-flight records per share-partition (SPEO - SPSO).",
    ),
    Setting(
        "session_timeout_ms",
        "group.share.session.timeout.ms",
        45000,
        1000,
        None,
        doc="A member silent for longer than this (ms) is removed; its records are released.",
    ),
    Setting(
        "heartbeat_interval_ms",
        "group.share.heartbeat.interval.ms",
        5000,
        100,
        None,
        doc="How often (ms) members heartbeat to the share-group coordinator.",
    ),
    Setting("max_size", "group.share.max.size", 200, 1, 1000, doc="Members per share group."),
    Setting(
        "auto_offset_reset",
        "share.auto.offset.reset",
        "latest",
        choices=("latest", "earliest"),
        doc="Where a new share-partition's SPSO starts: the log end or the log start.",
    ),
    Setting(
        "snapshot_update_records_per_snapshot",
        "share.coordinator.snapshot.update.records.per.snapshot",
        500,
        0,
        500,
        doc="State deltas written between two full snapshots of a share-partition.",
    ),
    Setting(
        "max_poll_records",
        "max.poll.records",
        500,
        1,
        10000,
        doc="Records a member acquires per ShareFetch.",
    ),
    Setting(
        "acknowledgement_linger_ms",
        "queueflow.acknowledgement.linger.ms",
        20,
        0,
        10000,
        doc="How long (ms) acknowledgements wait to ride along with the next fetch.",
    ),
    Setting(
        "request_timeout_ms",
        "queueflow.request.timeout.ms",
        10000,
        100,
        600000,
        doc="How long (ms) a member waits for a leader or coordinator to answer.",
    ),
    Setting(
        "shutdown_timeout_ms",
        "queueflow.shutdown.timeout.ms",
        30000,
        0,
        3600000,
        doc="On SIGTERM, how long (ms) handlers may run before their records are released.",
    ),
    Setting(
        "lock_check_interval_ms",
        "queueflow.lock.check.interval.ms",
        250,
        10,
        60000,
        doc="How often (ms) leaders check acquisition locks and coordinators check sessions.",
    ),
)

_BY_ATTR = {s.attr: s for s in SETTINGS}


@dataclass(frozen=True, slots=True)
class ShareGroupSettings:
    """Validated share-group settings (KIP-932 "Configuration").

    Build with keywords (``ShareGroupSettings(delivery_count_limit=3)``) or
    :meth:`load` with KIP-932 names (``{"group.share.delivery.count.limit": 3}``);
    anything not given comes from its environment variable, then its default.

    Raises:
        ConfigurationError: a value is of the wrong type or out of its allowed range; the message
            names the setting, the value, where it came from and the allowed range.
    """

    record_lock_duration_ms: int = 30000
    max_record_lock_duration_ms: int = 60000
    delivery_count_limit: int = 5
    partition_max_record_locks: int = 2000
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000
    max_size: int = 200
    auto_offset_reset: str = "latest"
    snapshot_update_records_per_snapshot: int = 500
    max_poll_records: int = 500
    acknowledgement_linger_ms: int = 20
    request_timeout_ms: int = 10000
    shutdown_timeout_ms: int = 30000
    lock_check_interval_ms: int = 250

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> ShareGroupSettings:
        """Resolve every setting from ``overrides`` (attr or KIP name), ``env``, then defaults.

        Args:
            overrides: values by attribute name or KIP-932 name.
            env: the environment to read (defaults to :data:`os.environ`).

        Raises:
            ConfigurationError: an unknown setting name, or a value out of range.
        """
        env = os.environ if env is None else env
        by_name = {s.name: s for s in SETTINGS}
        given: dict[str, tuple[Any, str]] = {}
        for key, raw in (overrides or {}).items():
            setting = _BY_ATTR.get(key) or by_name.get(key)
            if setting is None:
                raise ConfigurationError(
                    f"unknown share-group setting {key!r}; known settings: "
                    + ", ".join(s.name for s in SETTINGS)
                )
            given[setting.attr] = (raw, "arguments")
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            if setting.attr in given:
                raw, source = given[setting.attr]
            elif setting.env in env:
                raw, source = env[setting.env], f"${setting.env}"
            else:
                raw, source = setting.default, "default"
            values[setting.attr] = setting.parse(raw, source)
        return cls(**values)

    def __post_init__(self) -> None:
        for f in fields(self):  # convert and check values given to the constructor directly
            value = _BY_ATTR[f.name].parse(getattr(self, f.name), "arguments")
            object.__setattr__(self, f.name, value)
        if self.record_lock_duration_ms > self.max_record_lock_duration_ms:
            raise ConfigurationError(
                f"group.share.record.lock.duration.ms={self.record_lock_duration_ms} exceeds "
                f"group.share.max.record.lock.duration.ms={self.max_record_lock_duration_ms}; "
                "raise the maximum or lower the lock duration"
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigurationError(
                f"group.share.heartbeat.interval.ms={self.heartbeat_interval_ms} must be below "
                f"group.share.session.timeout.ms={self.session_timeout_ms}"
            )

    def as_kip_names(self) -> dict[str, int | str]:
        """The settings keyed by their KIP-932 names (for logs, admin output and docs)."""
        return {s.name: getattr(self, s.attr) for s in SETTINGS}
