"""Per-group configs on the server side: the coordinator's view and the leaders'.

The coordinator owns a group's configs. Those set with the admin are stored with the group
(:attr:`ShareGroup.configs <queueflow.engine.group.ShareGroup.configs>`, group codec); the
app's defaults come from ``App(group_configs=...)`` (:attr:`ServerContext.group_configs`); the
rest from the broker-level settings (:func:`effective`). The coordinator applies the session
timeout and heartbeat interval itself.

The share-partition leaders need the lock duration, delivery count limit, in-flight limit,
``share.auto.offset.reset``, ``share.isolation.level`` and ``share.renew.acknowledge.enable``.
They learn them from the assignment ticket every ShareFetch carries: the coordinator signs the
group's values (those that differ from the broker-level settings) and their version into it
(:func:`ticket_configs`), so no one but the coordinator can set them, and a leader has them
before it initialises or loads a share-partition for the request. :class:`LeaderGroupConfigs`
keeps the highest version seen per group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from queueflow.engine.group import ShareGroup
from queueflow.engine.group_config import (
    LEADER_CONFIG_NAMES,
    ConfigEntry,
    GroupConfig,
    OffsetReset,
    describe_group_configs,
)
from queueflow.engine.partition import SharePartitionConfig
from queueflow.errors import ConfigurationError
from queueflow.protocol.auth import AssignmentTicket
from queueflow.server.context import ServerContext
from queueflow.settings import ProcessingGuarantee, ShareGroupSettings

__all__ = ["LeaderGroupConfigs", "describe", "effective", "engine_config", "ticket_configs"]


def effective(ctx: ServerContext, group: ShareGroup) -> GroupConfig:
    """The group's effective configs: admin-set values over the app's per-group defaults over
    the broker-level settings."""
    return GroupConfig.resolve(
        ctx.settings, ctx.group_configs.get(group.group_id, {}), group.configs
    )


def describe(ctx: ServerContext, group: ShareGroup) -> list[ConfigEntry]:
    """Every group config of ``group`` with its value and source."""
    return describe_group_configs(
        ctx.settings, ctx.group_configs.get(group.group_id, {}), group.configs
    )


def ticket_configs(ctx: ServerContext, group: ShareGroup) -> list[tuple[str, str]]:
    """The leader configs of ``group`` that differ from the broker-level settings, as
    ``(name, value)`` pairs for its assignment tickets (usually none)."""
    config, defaults = effective(ctx, group), GroupConfig.resolve(ctx.settings)
    return [
        (name, config.value_of(name))
        for name in LEADER_CONFIG_NAMES
        if config.value_of(name) != defaults.value_of(name)
    ]


def engine_config(settings: ShareGroupSettings, config: GroupConfig) -> SharePartitionConfig:
    """The engine limits of a share-partition of a group with configs ``config``."""
    return SharePartitionConfig(
        max_in_flight_records=config.partition_max_record_locks,
        delivery_count_limit=config.delivery_count_limit,
        record_lock_duration_ms=config.record_lock_duration_ms,
        max_record_lock_duration_ms=settings.max_record_lock_duration_ms,
        min_record_lock_duration_ms=settings.min_record_lock_duration_ms,
        renew_enabled=config.renew_acknowledge_enable,
        max_renewal_ms=settings.record_lock_max_renewal_ms,
        member_max_in_flight_records=settings.member_max_in_flight_records,
        member_max_acquisition_rate=settings.member_max_acquisition_rate,
        release_abuse_records=settings.member_release_abuse_records,
        release_abuse_ratio_percent=settings.member_release_abuse_ratio_percent,
        release_abuse_window_ms=settings.member_release_abuse_window_ms,
        release_by_lock_end=settings.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE,
        redelivery_backoff_ms=config.redelivery_backoff_ms,
        redelivery_backoff_multiplier=config.redelivery_backoff_multiplier,
        redelivery_backoff_max_ms=config.redelivery_backoff_max_ms,
        max_release_delay_ms=settings.redelivery_max_delay_ms,
        delivery_count_mode=config.delivery_count_mode,
        throttle_delivery=settings.delivery_throttle_enable,
        dead_letter=bool(config.dead_letter_topic),
    )


@dataclass(frozen=True, slots=True)
class _Known:
    version: int
    configs: tuple[tuple[str, str], ...]
    engine: SharePartitionConfig
    #: Every group config's effective value.
    config: GroupConfig


class LeaderGroupConfigs:
    """A leader's view of each group's configs, from the tickets of its requests.

    Args:
        settings: the broker-level settings (the configs a group has not changed).
        app_configs: the app's per-group defaults (``App(group_configs=...)``), used for a
            group until a ticket of it arrives (after a restart, before its members' requests).
    """

    def __init__(
        self,
        settings: ShareGroupSettings,
        app_configs: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.settings = settings
        self._default = self._known(-1, (), {})
        self._groups: dict[str, _Known] = {
            group: self._known(-1, (), values) for group, values in (app_configs or {}).items()
        }
        # (group, topic) -> the first partition added to the topic at runtime.
        self._added: dict[tuple[str, str], int] = {}

    def adopt(self, ticket: AssignmentTicket) -> SharePartitionConfig | None:
        """Take the configs of a verified ticket if its version is at least the one known for
        its group; returns the new engine config when it changed (the caller reconfigures the
        group's loaded share-partitions), else ``None``.

        A ticket whose configs are invalid here (this leader's bounds differ from the
        coordinator's) is ignored: the group keeps what it had.
        """
        for topic, first in ticket.added_partitions:
            self._added[(ticket.group, topic)] = first
        known = self._groups.get(ticket.group, self._default)
        if ticket.config_version < known.version or (
            ticket.config_version == known.version and ticket.configs == known.configs
        ):
            return None
        try:
            fresh = self._known(ticket.config_version, ticket.configs, dict(ticket.configs))
        except (ConfigurationError, ValueError):
            return None
        self._groups[ticket.group] = fresh
        changed = fresh.engine != known.engine or fresh.config.ordering != known.config.ordering
        return fresh.engine if changed else None

    def _known(
        self, version: int, configs: tuple[tuple[str, str], ...], values: Mapping[str, str]
    ) -> _Known:
        config = GroupConfig.resolve(self.settings, values)
        return _Known(version, configs, engine_config(self.settings, config), config)

    def engine(self, group: str) -> SharePartitionConfig:
        """The engine limits of ``group``'s share-partitions."""
        return self._groups.get(group, self._default).engine

    def ordering(self, group: str) -> str:
        """``group``'s ``share.ordering``: ``none`` or ``key`` (docs/concepts.md "Key-ordered
        sharing")."""
        return self._groups.get(group, self._default).config.ordering

    def read_committed(self, group: str) -> bool:
        """``group``'s ``share.isolation.level`` is ``read_committed``: its share-partitions
        acquire nothing at or past the last stable offset (docs/concepts.md
        "read_committed")."""
        return self._groups.get(group, self._default).config.read_committed

    def dead_letter(self, group: str) -> tuple[str, bool, bool]:
        """``group``'s dead-letter topic (``""``: none), whether its records are copied into
        it (``errors.deadletterqueue.*``, KIP-1191), and whether the leader knows the group's
        configs from a ticket (else they are the app's defaults, maybe not the group's)."""
        known = self._groups.get(group, self._default)
        config = known.config
        return config.dead_letter_topic, config.dead_letter_copy_record, known.version >= 0

    def offset_reset(self, group: str, topic: str = "", partition: int = -1) -> OffsetReset:
        """Where ``group``'s new share-partition ``topic[partition]`` starts: ``earliest`` if
        the partition was added to the topic while the group knew it (as Kafka: nothing
        produced to it since is skipped), else the group's ``share.auto.offset.reset``."""
        first = self._added.get((group, topic))
        if first is not None and partition >= first:
            return OffsetReset("earliest")
        return self._groups.get(group, self._default).config.offset_reset
