"""Per-group configs of share groups: names, validation and the effective value
(docs/operations.md "Group configs").

Kafka's group configs (KIP-932 "Group configuration"; ``kafka-configs.sh --entity-type
groups``; KIP-1240 "Additional group configurations for share groups") override the broker-wide
``group.share.*`` settings for one share group. queueflow supports:

=====================================  ========================================================
Group config                           Default (broker-level setting) and bounds
=====================================  ========================================================
``share.auto.offset.reset``            ``share.auto.offset.reset``; ``latest``, ``earliest`` or
                                       ``by_duration:PnDTnHnMn.nS`` (ISO-8601, as Kafka)
``share.record.lock.duration.ms``      ``group.share.record.lock.duration.ms``, within
                                       ``group.share.min/max.record.lock.duration.ms``
``share.delivery.count.limit``         ``group.share.delivery.count.limit``, within
                                       ``group.share.min/max.delivery.count.limit``
``share.partition.max.record.locks``   ``group.share.partition.max.record.locks``, within
                                       ``group.share.min/max.partition.max.record.locks``
``share.session.timeout.ms``           ``group.share.session.timeout.ms``, within
                                       ``group.share.min/max.session.timeout.ms``
``share.heartbeat.interval.ms``        ``group.share.heartbeat.interval.ms``, within
                                       ``group.share.min/max.heartbeat.interval.ms``
``share.ordering``                     ``none`` (no broker-level setting); ``none`` or ``key``
                                       (key-ordered sharing, docs/concepts.md)
``share.isolation.level``              ``read_uncommitted`` (no broker-level setting, as Kafka);
                                       ``read_uncommitted`` or ``read_committed``
``share.renew.acknowledge.enable``     ``share.renew.acknowledge.enable``; ``true`` or
                                       ``false`` (KIP-1222 RENEW allowed)
``share.assignment.interval.ms``       ``1000``, within [0..15000] (Kafka's broker bounds);
                                       accepted, without effect: queueflow assigns at once
``share.redelivery.backoff.ms``        0 (no back-off), within
                                       0..``queueflow.redelivery.max.delay.ms``
``share.redelivery.backoff.multiplier`` 2.0, within 1..1000
``share.redelivery.backoff.max.ms``    60000, within 0..``queueflow.redelivery.max.delay.ms``
``share.delivery.count.mode``          ``acquisitions`` (KIP-932) or ``attempts``
``errors.deadletterqueue.topic.name``  ``""`` (no dead-letter topic; KIP-1191), a topic name
``errors.deadletterqueue.copy.record.  ``false``; ``true`` copies key and value into the DLQ
enable``                               (KIP-1191)
=====================================  ========================================================

A group's effective value of each config comes from, in order: the value set with the admin
(``alter_group_configs``, ``queueflow configs --alter``; durable with the group), the app's
per-group default (``App(group_configs={...})``), then the broker-level setting. Values are kept
as strings, as Kafka keeps configs; :func:`validate_group_configs` normalises them.

Pure and standard-library only: the coordinator validates with it, the App checks its
``group_configs`` with it, and it is property-tested.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from queueflow.engine.redelivery import DELIVERY_COUNT_MODES
from queueflow.errors import ConfigurationError
from queueflow.settings import ShareGroupSettings, lookup

__all__ = [
    "ASSIGNMENT_INTERVAL_MS",
    "AUTO_OFFSET_RESET",
    "DEAD_LETTER_COPY_RECORD",
    "DEAD_LETTER_TOPIC",
    "DELIVERY_COUNT_LIMIT",
    "DELIVERY_COUNT_MODE",
    "GROUP_CONFIG_NAMES",
    "HEARTBEAT_INTERVAL_MS",
    "ISOLATION_LEVEL",
    "ISOLATION_LEVELS",
    "LEADER_CONFIG_NAMES",
    "ORDERING",
    "ORDERING_VALUES",
    "PARTITION_MAX_RECORD_LOCKS",
    "RECORD_LOCK_DURATION_MS",
    "REDELIVERY_BACKOFF_MAX_MS",
    "REDELIVERY_BACKOFF_MS",
    "REDELIVERY_BACKOFF_MULTIPLIER",
    "RENEW_ACKNOWLEDGE_ENABLE",
    "SESSION_TIMEOUT_MS",
    "ConfigEntry",
    "GroupConfig",
    "OffsetReset",
    "describe_group_configs",
    "parse_auto_offset_reset",
    "parse_duration",
    "validate_group_config",
    "validate_group_configs",
]

AUTO_OFFSET_RESET: Final = "share.auto.offset.reset"
RECORD_LOCK_DURATION_MS: Final = "share.record.lock.duration.ms"
DELIVERY_COUNT_LIMIT: Final = "share.delivery.count.limit"
PARTITION_MAX_RECORD_LOCKS: Final = "share.partition.max.record.locks"
SESSION_TIMEOUT_MS: Final = "share.session.timeout.ms"
HEARTBEAT_INTERVAL_MS: Final = "share.heartbeat.interval.ms"
#: Key-ordered sharing (docs/concepts.md "Key-ordered sharing"): ``none`` or ``key``.
ORDERING: Final = "share.ordering"
#: The values of :data:`ORDERING`.
ORDERING_VALUES: Final = ("none", "key")
ISOLATION_LEVEL: Final = "share.isolation.level"
#: The values of ``share.isolation.level`` (Kafka's ``IsolationLevel`` names), default first.
ISOLATION_LEVELS: Final = ("read_uncommitted", "read_committed")
RENEW_ACKNOWLEDGE_ENABLE: Final = "share.renew.acknowledge.enable"
ASSIGNMENT_INTERVAL_MS: Final = "share.assignment.interval.ms"
#: Kafka's bounds of ``share.assignment.interval.ms`` (``group.share.min/max.assignment.
#: interval.ms`` defaults); queueflow has no such broker-level settings.
ASSIGNMENT_INTERVAL_BOUNDS: Final = (0, 15_000)
REDELIVERY_BACKOFF_MS: Final = "share.redelivery.backoff.ms"
REDELIVERY_BACKOFF_MULTIPLIER: Final = "share.redelivery.backoff.multiplier"
REDELIVERY_BACKOFF_MAX_MS: Final = "share.redelivery.backoff.max.ms"
DELIVERY_COUNT_MODE: Final = "share.delivery.count.mode"
#: KIP-1191: the group's dead-letter topic (empty: none); docs/guide.md "Dead-letter topics".
DEAD_LETTER_TOPIC: Final = "errors.deadletterqueue.topic.name"
#: KIP-1191: whether a dead-letter record carries the source record's key and value.
DEAD_LETTER_COPY_RECORD: Final = "errors.deadletterqueue.copy.record.enable"
#: Kafka's legal topic names (``org.apache.kafka.common.internals.Topic``).
_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@dataclass(frozen=True, slots=True)
class _Definition:
    """A group config: the broker-level setting it defaults to (attribute of
    :class:`~queueflow.settings.ShareGroupSettings`) and the settings bounding it; or, for a
    config with no broker-level setting, its literal ``default`` (``default_attr`` then only
    names its :class:`GroupConfig` field) and its allowed ``choices``."""

    name: str
    default_attr: str
    min_attr: str | None = None
    max_attr: str | None = None
    default: str | None = None
    choices: tuple[str, ...] = ()
    #: The parser returning the normal form of a config that is not a bounded int.
    parse: Callable[[str, object, ShareGroupSettings], str] | None = None


def _delay_ms(name: str, value: object, settings: ShareGroupSettings) -> str:
    """A delay in ms, 0..``queueflow.redelivery.max.delay.ms``."""
    top = settings.redelivery_max_delay_ms
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
        number = int(value)
    if number is None or not 0 <= number <= top:
        raise ConfigurationError(
            f"{name}={value!r} is not allowed: give an integer number of ms in [0..{top}] "
            "(queueflow.redelivery.max.delay.ms)"
        )
    return str(number)


def _multiplier(name: str, value: object, settings: ShareGroupSettings) -> str:
    """A float in 1..1000."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or not 1.0 <= number <= 1000.0:
        raise ConfigurationError(f"{name}={value!r} is not allowed: give a number in [1..1000]")
    return repr(number)


_DEFINITIONS: Final = {
    d.name: d
    for d in (
        _Definition(AUTO_OFFSET_RESET, "auto_offset_reset"),
        _Definition(
            RECORD_LOCK_DURATION_MS,
            "record_lock_duration_ms",
            "min_record_lock_duration_ms",
            "max_record_lock_duration_ms",
        ),
        _Definition(
            DELIVERY_COUNT_LIMIT,
            "delivery_count_limit",
            "min_delivery_count_limit",
            "max_delivery_count_limit",
        ),
        _Definition(
            PARTITION_MAX_RECORD_LOCKS,
            "partition_max_record_locks",
            "min_partition_max_record_locks",
            "max_partition_max_record_locks",
        ),
        _Definition(
            SESSION_TIMEOUT_MS,
            "session_timeout_ms",
            "min_session_timeout_ms",
            "max_session_timeout_ms",
        ),
        _Definition(
            HEARTBEAT_INTERVAL_MS,
            "heartbeat_interval_ms",
            "min_heartbeat_interval_ms",
            "max_heartbeat_interval_ms",
        ),
        _Definition(ORDERING, "ordering", default="none", choices=ORDERING_VALUES),
        _Definition(
            ISOLATION_LEVEL,
            "isolation_level",
            default=ISOLATION_LEVELS[0],
            choices=ISOLATION_LEVELS,
        ),
        _Definition(RENEW_ACKNOWLEDGE_ENABLE, "renew_acknowledge_enable"),
        _Definition(ASSIGNMENT_INTERVAL_MS, "assignment_interval_ms", default="1000"),
        _Definition(REDELIVERY_BACKOFF_MS, "redelivery_backoff_ms", default="0", parse=_delay_ms),
        _Definition(
            REDELIVERY_BACKOFF_MULTIPLIER,
            "redelivery_backoff_multiplier",
            default="2.0",
            parse=_multiplier,
        ),
        _Definition(
            REDELIVERY_BACKOFF_MAX_MS, "redelivery_backoff_max_ms", default="60000", parse=_delay_ms
        ),
        _Definition(
            DELIVERY_COUNT_MODE,
            "delivery_count_mode",
            default="acquisitions",
            choices=DELIVERY_COUNT_MODES,
        ),
        _Definition(DEAD_LETTER_TOPIC, "dead_letter_topic", default=""),
        _Definition(DEAD_LETTER_COPY_RECORD, "dead_letter_copy_record", default="false"),
    )
}

#: Every group config queueflow supports, in the order they are described.
GROUP_CONFIG_NAMES: Final = tuple(_DEFINITIONS)
#: The group configs the share-partition leaders apply (carried in assignment tickets).
LEADER_CONFIG_NAMES: Final = (
    AUTO_OFFSET_RESET,
    RECORD_LOCK_DURATION_MS,
    DELIVERY_COUNT_LIMIT,
    PARTITION_MAX_RECORD_LOCKS,
    ORDERING,
    ISOLATION_LEVEL,
    RENEW_ACKNOWLEDGE_ENABLE,
    REDELIVERY_BACKOFF_MS,
    REDELIVERY_BACKOFF_MULTIPLIER,
    REDELIVERY_BACKOFF_MAX_MS,
    DELIVERY_COUNT_MODE,
    DEAD_LETTER_TOPIC,
    DEAD_LETTER_COPY_RECORD,
)

_DURATION: Final = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?"
    r"(T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> int:
    """Parse an ISO-8601 duration as Java's ``Duration.parse`` (which Kafka uses for
    ``by_duration:`` and ``--by-duration``): ``PnDTnHnMn.nS``, e.g. ``PT1H``, ``P1DT2H30M``,
    ``PT0.5S``, ``-PT10M``; returns ms (rounded towards zero below a millisecond).

    Days are 24 hours; there are no years or months. Signs may precede the whole and each
    number; at least one part must be given, and a ``T`` must be followed by one.

    Raises:
        ConfigurationError: anything else.
    """
    m = _DURATION.fullmatch(text.strip())
    if m is None or not any(m.group(i) is not None for i in (2, 4, 5, 6)) or m.group(3) == "T":
        raise ConfigurationError(
            f"cannot parse duration {text!r}: expected an ISO-8601 duration PnDTnHnMn.nS "
            "(e.g. PT1H, P1DT12H, PT30M, PT0.5S)"
        )
    sign, days, _, hours, minutes, seconds, fraction = m.groups()
    total_ns = (
        int(days or 0) * 86_400_000_000_000
        + int(hours or 0) * 3_600_000_000_000
        + int(minutes or 0) * 60_000_000_000
        + int(seconds or 0) * 1_000_000_000
    )
    if fraction:
        nanos = int((fraction + "000000000")[:9])
        total_ns += -nanos if (seconds or "").startswith("-") else nanos
    if sign == "-":
        total_ns = -total_ns
    ms = abs(total_ns) // 1_000_000
    return -ms if total_ns < 0 else ms


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """A parsed ``share.auto.offset.reset``: ``kind`` is ``latest``, ``earliest`` or
    ``by_duration`` (then ``duration_ms`` >= 0: start at the first record at most that old)."""

    kind: str
    duration_ms: int = 0


_BY_DURATION: Final = "by_duration:"


def parse_auto_offset_reset(value: str) -> OffsetReset:
    """Parse ``latest``, ``earliest`` or ``by_duration:PnDTnHnMn.nS`` (case as Kafka: exact).

    Raises:
        ConfigurationError: anything else, or a negative duration; the message names
            ``share.auto.offset.reset``, the value and what is allowed.
    """
    if value in ("latest", "earliest"):
        return OffsetReset(value)
    if value.startswith(_BY_DURATION):
        try:
            ms = parse_duration(value[len(_BY_DURATION) :])
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"{AUTO_OFFSET_RESET}={value!r} is not allowed: {exc}"
            ) from None
        if ms < 0:
            raise ConfigurationError(
                f"{AUTO_OFFSET_RESET}={value!r} is not allowed: the duration must not be negative"
            )
        return OffsetReset("by_duration", ms)
    raise ConfigurationError(
        f"{AUTO_OFFSET_RESET}={value!r} is not allowed: choose latest, earliest or "
        "by_duration:PnDTnHnMn.nS (an ISO-8601 duration, e.g. by_duration:PT1H)"
    )


def _unknown(name: str) -> ConfigurationError:
    return ConfigurationError(
        f"unknown group config {name!r}; the group configs are: {', '.join(GROUP_CONFIG_NAMES)}"
    )


def _bounds(definition: _Definition, settings: ShareGroupSettings) -> tuple[int, int]:
    assert definition.min_attr is not None and definition.max_attr is not None
    return getattr(settings, definition.min_attr), getattr(settings, definition.max_attr)


def validate_group_config(name: str, value: object, settings: ShareGroupSettings) -> str:
    """Check one group config against the broker-level bounds of ``settings``.

    Args:
        name: a name of :data:`GROUP_CONFIG_NAMES`.
        value: an ``int`` or a string (``"3"``, ``"by_duration:PT1H"``); ``bool`` is refused
            except for ``share.renew.acknowledge.enable`` (``true``/``false``, any case).
        settings: the broker-level settings whose ``group.share.min/max.*`` bound the value.

    Returns:
        The value's normal form as a string (``"3"``, ``"earliest"``).

    Raises:
        ConfigurationError: an unknown name (the message lists the known ones), a value that is
            not an integer, or out of range; the message names the config, the value and the
            allowed range with the settings that set it, e.g.
            ``share.delivery.count.limit=1 is out of range: allowed [2..10]
            (group.share.min.delivery.count.limit..group.share.max.delivery.count.limit)``.
    """
    definition = _DEFINITIONS.get(name)
    if definition is None:
        raise _unknown(name)
    if definition.parse is not None:
        return definition.parse(name, value, settings)
    if name == DEAD_LETTER_TOPIC:
        return _dead_letter_topic(value)
    if name in (RENEW_ACKNOWLEDGE_ENABLE, DEAD_LETTER_COPY_RECORD):
        return _boolean(name, value)
    if name == ASSIGNMENT_INTERVAL_MS:
        low, high = ASSIGNMENT_INTERVAL_BOUNDS
        return _integer(name, value, low, high, "(Kafka's default bounds)")
    if definition.choices:
        text = value.strip().lower() if isinstance(value, str) else repr(value)
        if text not in definition.choices:
            raise ConfigurationError(
                f"{name}={value!r} is not allowed: choose one of {', '.join(definition.choices)}"
            )
        return text
    if definition.min_attr is None:
        text = str(value).strip() if isinstance(value, str) else repr(value)
        parse_auto_offset_reset(text)
        return text
    low, high = _bounds(definition, settings)
    assert definition.max_attr is not None
    where = f"({lookup(definition.min_attr).name}..{lookup(definition.max_attr).name})"
    return _integer(name, value, low, high, where)


def _boolean(name: str, value: object) -> str:
    """``true`` or ``false`` (any case, as Kafka's BOOLEAN configs), or a ``bool``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in ("true", "false"):
        raise ConfigurationError(f"{name}={value!r} is not allowed: use true or false")
    return text


def _integer(name: str, value: object, low: int, high: int, where: str) -> str:
    """``value`` as an integer in ``low..high`` (``where`` names the bounds' settings)."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
        number = int(value)
    if number is None:
        raise ConfigurationError(
            f"{name}={value!r} is not an integer; allowed range [{low}..{high}] {where}"
        )
    if not low <= number <= high:
        raise ConfigurationError(
            f"{name}={number} is out of range: allowed [{low}..{high}] {where}"
        )
    return str(number)


def _dead_letter_topic(value: object) -> str:
    """``errors.deadletterqueue.topic.name`` checked: empty (no DLQ) or a legal topic name."""
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{DEAD_LETTER_TOPIC}={value!r} is not a topic name; give a topic name, or an "
            "empty string for no dead-letter topic"
        )
    text = value.strip()
    if text and (not _TOPIC_NAME.fullmatch(text) or text in (".", "..")):
        raise ConfigurationError(
            f"{DEAD_LETTER_TOPIC}={value!r} is not a legal Kafka topic name: use 1 to 249 "
            "characters among a-z, A-Z, 0-9, '.', '_' and '-' (or an empty string for none)"
        )
    return text


def validate_group_configs(
    values: Mapping[str, object],
    settings: ShareGroupSettings,
    *,
    base: Mapping[str, str] | None = None,
    delete: Iterable[str] = (),
    defaults: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Check a set of group configs, alone and together with the group's others.

    Args:
        values: the configs to set, by name (see :func:`validate_group_config`).
        settings: the broker-level settings (defaults and bounds).
        base: the group's configs so far (from lower layers or already set), which ``values``
            override; they take part in the cross-check.
        delete: names to remove from ``base`` first (``--delete-config``); each must be a known
            group config.
        defaults: validated configs below ``base`` (the app's per-group defaults): not
            returned, but part of the cross-check.

    Returns:
        ``base`` minus ``delete``, updated with the normalised ``values``.

    Raises:
        ConfigurationError: as :func:`validate_group_config`; a name both set and deleted; or
            an effective ``share.heartbeat.interval.ms`` not below the effective
            ``share.session.timeout.ms`` (the message names both values).
    """
    out = dict(base or {})
    for name in delete:
        if name not in _DEFINITIONS:
            raise _unknown(name)
        if name in values:
            raise ConfigurationError(f"group config {name!r} is both set and deleted; pick one")
        out.pop(name, None)
    for name, value in values.items():
        out[name] = validate_group_config(name, value, settings)
    effective = GroupConfig.resolve(settings, defaults or {}, out)
    if effective.heartbeat_interval_ms >= effective.session_timeout_ms:
        raise ConfigurationError(
            f"{HEARTBEAT_INTERVAL_MS}={effective.heartbeat_interval_ms} must be below "
            f"{SESSION_TIMEOUT_MS}={effective.session_timeout_ms} (a member heartbeats several "
            "times per session timeout)"
        )
    return out


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The effective configs of one share group (durations in ms).

    Attributes:
        auto_offset_reset: ``share.auto.offset.reset`` (see :func:`parse_auto_offset_reset`).
        record_lock_duration_ms / delivery_count_limit / partition_max_record_locks /
            session_timeout_ms / heartbeat_interval_ms: the other group configs.
        ordering: ``share.ordering``: ``none`` or ``key`` (docs/concepts.md "Key-ordered
            sharing").
        isolation_level: ``share.isolation.level``: ``read_uncommitted`` (default) or
            ``read_committed`` (nothing past the last stable offset is acquired, aborted
            records are never handed to a handler; docs/concepts.md "read_committed").
        renew_acknowledge_enable: ``share.renew.acknowledge.enable`` (KIP-1222).
        assignment_interval_ms: ``share.assignment.interval.ms`` (accepted, no effect).
        dead_letter_topic: ``errors.deadletterqueue.topic.name`` (``""``: no DLQ).
        dead_letter_copy_record: ``errors.deadletterqueue.copy.record.enable``.
    """

    auto_offset_reset: str
    record_lock_duration_ms: int
    delivery_count_limit: int
    partition_max_record_locks: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    ordering: str = "none"
    isolation_level: str = ISOLATION_LEVELS[0]
    renew_acknowledge_enable: bool = True
    assignment_interval_ms: int = 1000
    redelivery_backoff_ms: int = 0
    redelivery_backoff_multiplier: float = 2.0
    redelivery_backoff_max_ms: int = 60000
    delivery_count_mode: str = "acquisitions"
    dead_letter_topic: str = ""
    dead_letter_copy_record: bool = False

    @classmethod
    def resolve(cls, settings: ShareGroupSettings, *layers: Mapping[str, str]) -> GroupConfig:
        """The broker-level ``settings`` overridden by each of ``layers`` in turn (later ones
        win): e.g. ``resolve(settings, app_defaults, dynamic)``. The layers must hold validated
        values (:func:`validate_group_configs`); an unknown name is ignored."""
        merged: dict[str, str] = {}
        for layer in layers:
            merged.update(layer)

        def value(name: str) -> str:
            got = merged.get(name)
            return _default(_DEFINITIONS[name], settings) if got is None else got

        return cls(
            auto_offset_reset=value(AUTO_OFFSET_RESET),
            record_lock_duration_ms=int(value(RECORD_LOCK_DURATION_MS)),
            delivery_count_limit=int(value(DELIVERY_COUNT_LIMIT)),
            partition_max_record_locks=int(value(PARTITION_MAX_RECORD_LOCKS)),
            session_timeout_ms=int(value(SESSION_TIMEOUT_MS)),
            heartbeat_interval_ms=int(value(HEARTBEAT_INTERVAL_MS)),
            ordering=value(ORDERING),
            isolation_level=value(ISOLATION_LEVEL),
            renew_acknowledge_enable=value(RENEW_ACKNOWLEDGE_ENABLE).lower() == "true",
            assignment_interval_ms=int(value(ASSIGNMENT_INTERVAL_MS)),
            redelivery_backoff_ms=int(value(REDELIVERY_BACKOFF_MS)),
            redelivery_backoff_multiplier=float(value(REDELIVERY_BACKOFF_MULTIPLIER)),
            redelivery_backoff_max_ms=int(value(REDELIVERY_BACKOFF_MAX_MS)),
            delivery_count_mode=value(DELIVERY_COUNT_MODE),
            dead_letter_topic=value(DEAD_LETTER_TOPIC),
            dead_letter_copy_record=value(DEAD_LETTER_COPY_RECORD) == "true",
        )

    def value_of(self, name: str) -> str:
        """The value of group config ``name`` as text (its field is named after the
        broker-level setting it defaults to).

        Raises:
            KeyError: ``name`` is not a group config.
        """
        return _text(getattr(self, _DEFINITIONS[name].default_attr))

    @property
    def read_committed(self) -> bool:
        """``share.isolation.level`` is ``read_committed``."""
        return self.isolation_level == "read_committed"

    @property
    def offset_reset(self) -> OffsetReset:
        """``auto_offset_reset`` parsed."""
        return parse_auto_offset_reset(self.auto_offset_reset)


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One group config as described (Kafka's ``ConfigEntry``): its ``name``, effective
    ``value`` and ``source``: ``DYNAMIC_GROUP_CONFIG`` (set with the admin),
    ``APP_GROUP_CONFIG`` (the app's ``group_configs``) or ``DEFAULT_CONFIG`` (the broker-level
    setting, named by ``synonym``)."""

    name: str
    value: str
    source: str
    synonym: str


def describe_group_configs(
    settings: ShareGroupSettings, app: Mapping[str, str], dynamic: Mapping[str, str]
) -> list[ConfigEntry]:
    """Every group config of a group with its effective value and where it comes from.

    Args:
        settings: the broker-level settings.
        app: the app's defaults for the group (``App(group_configs=...)``).
        dynamic: the values set with the admin (durable with the group).
    """
    out = []
    for name, definition in _DEFINITIONS.items():
        literal = definition.default
        synonym = name if literal is not None else lookup(definition.default_attr).name
        if name in dynamic:
            out.append(ConfigEntry(name, dynamic[name], "DYNAMIC_GROUP_CONFIG", synonym))
        elif name in app:
            out.append(ConfigEntry(name, app[name], "APP_GROUP_CONFIG", synonym))
        else:
            default = _default(definition, settings)
            out.append(ConfigEntry(name, default, "DEFAULT_CONFIG", synonym))
    return out


def _text(value: object) -> str:
    """A config value as Kafka writes it (``true``/``false`` for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _default(definition: _Definition, settings: ShareGroupSettings) -> str:
    """The value of a config no one set: its broker-level setting's, or its literal one."""
    if definition.default is not None:
        return definition.default
    return _text(getattr(settings, definition.default_attr))
