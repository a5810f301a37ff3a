"""``queueflow.App``: a :class:`faust.App` that hosts share groups.

A worker of a queueflow app has one of three roles (``role=`` or ``$QUEUEFLOW_ROLE``):

``all`` (default)
    share-group coordinator, share-partition leaders and the app's share agents.
``leader``
    coordinator and leaders only.
``member``
    share agents only. The worker runs Faust in producer-only mode: it never joins the leaders'
    Faust consumer group, so starting or stopping it never triggers a rebalance that would pause
    the leaders.

Users with their own :class:`faust.App` use :func:`queueflow.attach` instead of subclassing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import faust
import structlog

from queueflow import metrics
from queueflow.errors import ConfigurationError
from queueflow.kafka.admin import TopicMetadata, ensure_topic, partition_counts
from queueflow.kafka.config import KafkaClientConfig, bootstrap_servers
from queueflow.member.agent import Handler, ShareAgent
from queueflow.protocol import topics
from queueflow.server.coordinator import ShareGroupCoordinator
from queueflow.server.leader import LeaderTicker, LogOffsets, ShareLeader, monotonic_ms
from queueflow.settings import ShareGroupSettings

log = structlog.get_logger("queueflow.faust_app")

ROLES = ("all", "leader", "member")
#: How often the leaders' stall guard runs (s); see :mod:`queueflow.engine.fencing`.
STALL_CHECK_INTERVAL_S = 0.1
#: Faust consumer-group timeouts (s) of the leaders unless set by argument or env var: a
#: SIGKILLed leader's share-partitions move after the session timeout, so Faust's 60 s default
#: would stall them for a minute.
LEADER_GROUP_DEFAULTS = {"broker_session_timeout": 10.0, "broker_heartbeat_interval": 1.0}


class ShareGroups:
    """The share-group machinery attached to one Faust app.

    Args:
        app: the Faust app (its ``id`` names the internal topics).
        role: ``all``, ``leader`` or ``member`` (default ``$QUEUEFLOW_ROLE`` or ``all``).
        settings: a :class:`ShareGroupSettings`, or a mapping of overrides (KIP-932 names or
            attribute names); the rest comes from env vars and defaults.

    Raises:
        ConfigurationError: an unknown role or an invalid setting.
    """

    def __init__(
        self,
        app: faust.App,
        role: str | None = None,
        settings: ShareGroupSettings | Mapping[str, Any] | None = None,
    ) -> None:
        role = role or os.environ.get("QUEUEFLOW_ROLE", "all")
        if role not in ROLES:
            raise ConfigurationError(
                f"queueflow role={role!r} (from role= or $QUEUEFLOW_ROLE) is not one of "
                f"{', '.join(ROLES)}"
            )
        self.app = app
        self.role = role
        self.namespace: str = app.conf.id
        self.settings = (
            settings
            if isinstance(settings, ShareGroupSettings)
            else ShareGroupSettings.load(settings)
        )
        self.agents: list[ShareAgent] = []
        self.leaders: dict[str, ShareLeader] = {}
        self.coordinator: ShareGroupCoordinator | None = None
        self.reply_topic = app.topic(
            topics.reply_topic(self.namespace),
            internal=True,
            partitions=topics.REPLY_PARTITIONS,
            key_serializer="raw",
            value_serializer="raw",
            config=topics.CONTROL_TOPIC_CONFIG,
        )
        app.share_namespace = self.namespace  # type: ignore[attr-defined]
        app.share_settings = self.settings  # type: ignore[attr-defined]
        app.share_leaders = self.leaders  # type: ignore[attr-defined]
        app.reply_topic = self.reply_topic  # type: ignore[attr-defined]
        metrics.expose(app)
        if role == "member":
            app.producer_only = True
            return
        bootstrap = bootstrap_servers(app.conf.broker)
        self._offsets = LogOffsets(bootstrap)
        self._metadata = TopicMetadata(KafkaClientConfig(bootstrap))
        self.coordinator = ShareGroupCoordinator(app, self._metadata)  # type: ignore[arg-type]
        self._ticker = LeaderTicker(app)  # type: ignore[arg-type]
        app.timer(self.settings.lock_check_interval_ms / 1000, name="queueflow-ticker")(
            self._ticker.tick
        )
        app.timer(STALL_CHECK_INTERVAL_S, name="queueflow-stall-guard")(self._watch_stalls)
        app.on_partitions_revoked.connect(self._on_revoked)
        app.on_partitions_assigned.connect(self._on_assigned)

    @property
    def leads(self) -> bool:
        """True when this worker hosts the coordinator and share-partition leaders."""
        return self.role != "member"

    def share_agent(
        self,
        topic: Any,
        *,
        group: str,
        concurrency: int = 1,
        name: str | None = None,
        lock_duration_ms: int | None = None,
    ) -> Callable[[Handler], ShareAgent]:
        """Declare a share agent; see :meth:`App.share_agent`."""

        def decorator(handler: Handler) -> ShareAgent:
            agent = ShareAgent(
                self.app,
                handler,
                topic,
                group,
                concurrency=concurrency,
                name=name,  # type: ignore[arg-type]
                lock_duration_ms=lock_duration_ms,
                loop=None,
                beacon=None,
            )
            self.agents.append(agent)
            if self.leads:
                self.lead(agent.topic_name)
            if self.role != "leader":
                self.app._extra_services.append(agent)  # started after table recovery
            return agent

        return decorator

    def lead(self, topic: str) -> ShareLeader | None:
        """Host the share-partition leaders of ``topic`` on this app's leader workers (done
        automatically for every share agent's topic; call it on leader-only apps that don't
        declare the agents)."""
        if not self.leads:
            return None
        if topic not in self.leaders:
            self.leaders[topic] = ShareLeader(self.app, topic, self._offsets)  # type: ignore[arg-type]
        return self.leaders[topic]

    async def prepare(self) -> None:
        """Before Faust declares topics: check the source topics exist and co-partition the
        request topics and state tables with them; create the reply topic.

        Raises:
            ConfigurationError: a source topic does not exist.
        """
        bootstrap = bootstrap_servers(self.app.conf.broker)
        if self.leaders:
            counts = await partition_counts(KafkaClientConfig(bootstrap), list(self.leaders))
            for name, leader in self.leaders.items():
                leader.set_partition_count(counts[name])
                await leader.fetch_topic.maybe_declare()
        if self.coordinator is not None:
            await self.coordinator.topic.maybe_declare()
        await ensure_topic(
            KafkaClientConfig(bootstrap),
            topics.reply_topic(self.namespace),
            topics.REPLY_PARTITIONS,
            topics.CONTROL_TOPIC_CONFIG,
        )

    async def close(self) -> None:
        """Close the leaders' metadata clients."""
        if self.leads:
            await self._offsets.close()
            await self._metadata.close()

    async def _on_assigned(self, sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        epoch = self.app.consumer_generation_id
        for leader in self.leaders.values():
            name = leader.fetch_topic.get_topic_name()
            leader.assign({tp.partition for tp in assigned if tp.topic == name}, epoch)

    async def _watch_stalls(self) -> None:
        now = monotonic_ms()
        for leader in self.leaders.values():
            await leader.watch_stalls(now)

    async def _on_revoked(self, sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        for leader in self.leaders.values():
            name = leader.fetch_topic.get_topic_name()
            leader.revoke({tp.partition for tp in revoked if tp.topic == name})
        if self.coordinator is not None:
            name = self.coordinator.topic.get_topic_name()
            self.coordinator.revoke({tp.partition for tp in revoked if tp.topic == name})


class App(faust.App):
    """A Faust app with share groups (KIP-932) on any Kafka cluster.

    Args:
        id: the app id; it names the Faust consumer group of the leaders and every internal
            topic.
        role: ``all`` | ``leader`` | ``member`` (default ``$QUEUEFLOW_ROLE`` or ``all``).
        share_settings: share-group settings overrides, by KIP-932 name or attribute name.
        **kwargs: passed to :class:`faust.App` (``broker``, ``datadir``, ...). ``store``
            defaults to ``rocksdb://`` (rocksdict).

    Example::

        app = queueflow.App("thumbnails", broker="kafka://localhost:9092")
        jobs = app.topic("jobs", value_type=Job)

        @app.share_agent(jobs, group="thumbnailers", concurrency=8)
        async def make_thumbnail(record):
            ...
            return queueflow.ACCEPT
    """

    def __init__(
        self,
        id: str,
        *,
        role: str | None = None,
        share_settings: ShareGroupSettings | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("store", "rocksdb://")
        for name, value in LEADER_GROUP_DEFAULTS.items():
            if name.upper() not in os.environ:
                kwargs.setdefault(name, value)
        super().__init__(id, **kwargs)
        self.share_groups = ShareGroups(self, role=role, settings=share_settings)

    def share_agent(
        self,
        topic: Any,
        *,
        group: str,
        concurrency: int = 1,
        name: str | None = None,
        lock_duration_ms: int | None = None,
    ) -> Callable[[Handler], ShareAgent]:
        """Declare a share agent: ``handler(record)`` runs once per delivery of each record.

        Args:
            topic: the source topic (``app.topic(...)`` or a name).
            group: the share group id.
            concurrency: handler tasks per worker process.
            name: agent name (defaults to the handler's qualified name).
            lock_duration_ms: this member's acquisition lock duration in ms (KIP-932 allows a
                consumer its own, up to ``group.share.max.record.lock.duration.ms``).

        Returns:
            A decorator; the decorated name becomes the :class:`ShareAgent`.

        Raises:
            ConfigurationError: concurrency < 1, or a lock duration out of range.
        """
        return self.share_groups.share_agent(
            topic,
            group=group,
            concurrency=concurrency,
            name=name,
            lock_duration_ms=lock_duration_ms,
        )

    async def on_first_start(self) -> None:
        await super().on_first_start()
        await self.share_groups.prepare()

    async def on_stop(self) -> None:
        await self.share_groups.close()
        await super().on_stop()


def attach(
    app: faust.App,
    role: str | None = None,
    settings: ShareGroupSettings | Mapping[str, Any] | None = None,
) -> ShareGroups:
    """Add share groups to an existing :class:`faust.App`.

    Call it before the worker starts and declare agents with ``groups.share_agent(...)``.
    See docs/guide.md "Existing Faust apps".

    Returns:
        The :class:`ShareGroups` whose ``share_agent`` decorator declares agents.
    """
    groups = ShareGroups(app, role=role, settings=settings)
    original = app.on_first_start

    async def on_first_start() -> None:  # before Faust declares and subscribes topics
        await original()
        await groups.prepare()

    app.on_first_start = on_first_start  # type: ignore[method-assign]
    return groups
