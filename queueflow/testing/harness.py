"""A test harness for share agents: run a handler (or a chain of agents) in memory against the
real engine, coordinator and leaders on a fake clock, with no Kafka and no Faust worker.

In the manner of Kafka Streams' ``TopologyTestDriver`` and Faust's ``agent.test_context()``::

    async with ShareAgentHarness(resize_image) as h:   # the @app.share_agent object
        h.put({"url": "a.png"})                       # encoded as the agent's topic would
        await h.run_until_idle()
        assert h.history(0).outcome_types == [ACCEPT]

:class:`ShareAgentHarness` wraps an :class:`~queueflow.testing.inprocess.InProcessCluster` (the
real :class:`~queueflow.server.coordinator.ShareGroupCoordinator` and
:class:`~queueflow.server.leader.ShareLeader` on in-memory topics, state tables and control
topics) and runs real :class:`~queueflow.ShareAgent` members of the agent's group on it, with
the agent's own handler and options. Time is a :class:`~queueflow.testing.FakeClock`: locks,
sessions and handler deadlines move only with :meth:`ShareAgentHarness.advance`.
``exactly_once`` agents commit their results and acknowledgements in in-memory Kafka
transactions (:mod:`queueflow.testing.transactions`), applied by the leaders' real ack path. See
docs/guide.md "Testing your share agents".

This module does not need pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import structlog

from queueflow.engine.state import RecordState
from queueflow.errors import ConfigurationError
from queueflow.member.agent import Decoder, Handler, ShareAgent, ShareAgentOptions
from queueflow.member.flow import Backoff
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics as internal
from queueflow.settings import ShareGroupSettings
from queueflow.structs import AcknowledgeType, TopicPartition
from queueflow.testing.clock import FakeClock
from queueflow.testing.inprocess import InProcessCluster, StoredRecord

__all__ = [
    "Delivery",
    "HandlerError",
    "HarnessTimeout",
    "IdleReport",
    "Outcome",
    "RecordHistory",
    "RecordRef",
    "ShareAgentHarness",
    "SharePartitionState",
]

#: The harness's share-group settings unless ``settings=`` overrides them (attribute or KIP
#: names): ``share.auto.offset.reset`` is ``earliest`` here (Kafka's default is ``latest``), so
#: records put before the group's first fetch are delivered; a short drain on stop.
HARNESS_SETTINGS: Mapping[str, Any] = {
    "auto_offset_reset": "earliest",
    "heartbeat_interval_ms": 1_000,
    "request_timeout_ms": 5_000,
    "shutdown_timeout_ms": 200,
}

#: Real seconds without any change (records, states, handler calls, outcomes) after which
#: :meth:`ShareAgentHarness.run_until_idle` decides that nothing more happens without
#: advancing the clock: above the agents' real-time cadences (the handler watchdog's 0.1 s,
#: the acknowledgement linger, the harness's fetch back-off).
QUIET_S = 0.25

_TERMINAL = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


class HarnessTimeout(AssertionError):
    """:meth:`ShareAgentHarness.run_until_idle` hit its bound while work kept happening; the
    message names what was still in flight."""


@dataclass(frozen=True, slots=True)
class RecordRef:
    """Where :meth:`ShareAgentHarness.put` wrote a record."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a record: to ``member`` (its label, ``"handler#0"``), with
    ``delivery_count`` (KIP-932, this delivery included)."""

    member: str
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """One acknowledgement a member sent for a record (``type``: ACCEPT, RELEASE, REJECT or
    RENEW; KIP-932 AcknowledgeType). The leader refuses one sent after the record's lock
    expired: :attr:`RecordHistory.state` says what it became."""

    type: AcknowledgeType
    member: str


@dataclass(slots=True)
class RecordHistory:
    """What happened to one record in one share group.

    Attributes:
        topic / partition / offset: the record.
        group: the share group.
        deliveries: every delivery, in order (a lock expiry or a RELEASE is followed by
            another, with a higher delivery count).
        outcomes: every acknowledgement sent for it, in order.
        state: its state now: AVAILABLE, ACQUIRED, ACKNOWLEDGED or ARCHIVED (REJECTed, or
            released or expired at the delivery count limit); ``None`` before its group's
            share-partition saw it.
        delivery_count: deliveries so far.
    """

    topic: str
    partition: int
    offset: int
    group: str
    deliveries: list[Delivery] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    state: RecordState | None = None

    @property
    def delivery_count(self) -> int:
        return len(self.deliveries)

    @property
    def outcome_types(self) -> list[AcknowledgeType]:
        """The types of :attr:`outcomes`, in order (``[RELEASE, ACCEPT]``)."""
        return [o.type for o in self.outcomes]


@dataclass(frozen=True, slots=True)
class SharePartitionState:
    """A share-partition as its leader holds it (KIP-932 "In-flight records").

    Attributes:
        spso / speo: the share-partition start offset and end offset (exclusive).
        in_flight: offset -> (state, delivery count, owning member label or None) for every
            offset in ``spso..speo-1``.
    """

    spso: int
    speo: int
    in_flight: Mapping[int, tuple[RecordState, int, str | None]]


@dataclass(frozen=True, slots=True)
class HandlerError:
    """An error a member logged about its handler (it raised, returned something that is no
    outcome, ran past its deadline, got an undecodable record, ...).

    Attributes:
        event: the log event name (documented in docs/operations.md "Monitoring: log events").
        member: the member's label.
        error: the error text of the line ("" when it has none).
        line: the whole log event (key-values).
    """

    event: str
    member: str
    error: str
    line: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class IdleReport:
    """What :meth:`ShareAgentHarness.run_until_idle` found.

    Attributes:
        done: every record of the agents' topics is Acknowledged or Archived in each group and
            no handler call runs.
        waiting: when not ``done``, what waits for time to move (records in flight, handler
            calls running), one line each.
    """

    done: bool
    waiting: tuple[str, ...] = ()


class _RealTimeBackoff(Backoff):
    """A fetch loop's back-off in real time: on a frozen fake clock the agent's own back-off
    (read on the fake monotonic clock) would never end, and records put after an empty fetch
    would never be fetched. Production back-offs are real time too."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(initial_s=0.002, idle_max_s=0.02, error_max_s=0.05)
        self._clock = clock

    def idle_until(self, key: object) -> float:
        until = super().idle_until(key)
        remaining = until - time.monotonic()
        return self._clock.monotonic() + remaining if remaining > 0 else 0.0

    def observe(self, key: object, now: float, delivered: int, wanted: int) -> None:
        super().observe(key, time.monotonic(), delivered, wanted)


@dataclass(slots=True)
class _Spec:
    handler: Handler
    topic: str
    group: str
    options: ShareAgentOptions
    decode: Any
    faust_topic: Any  # the agent's Faust topic (serializers), or None
    #: More ShareAgent arguments taken from the agent (its results' encoder, if it has one).
    extra: dict[str, Any] = field(default_factory=dict)
    #: ``processing_guarantee`` as the agent resolves it (``None``: the harness's setting).
    guarantee: str | None = None


def _transactions(agent: ShareAgent) -> tuple[int, int, int]:
    """An exactly_once member's outcomes waiting for a transaction, transactions committed and
    aborted (zeros for an at_least_once one)."""
    txn = agent.transactions
    return (0, 0, 0) if txn is None else (len(txn._pending), txn.committed, txn.aborted)


def _faust_topic(agent: ShareAgent) -> Any:
    """The Faust topic an ``@app.share_agent`` agent decodes with (None: raw bytes)."""
    decode = agent.decode
    if decode is None:
        return None
    try:
        found = inspect.getclosurevars(decode).nonlocals.get("topic")
    except TypeError:
        return None
    return found if hasattr(found, "value_serializer") else None


class ShareAgentHarness:
    """Run share agents in memory against the real engine, coordinator and leaders.

    Use it as ``async with ShareAgentHarness(...) as h:`` (start and stop), put records in,
    :meth:`run_until_idle`, :meth:`advance` the clock and read back what happened.

    Args:
        *agents: the share agents: ``@app.share_agent`` objects (their handler, topic, group,
            options and decoding are used; the app's Kafka is not), or one bare handler
            (``async def handler(record)``) with ``topic=`` and ``group=``. Several agents
            form a chain when one's results go to another's topic (``sink=``).
        topic: the source topic of a bare handler.
        group: the share group of a bare handler (default ``"test-group"``).
        members: members per agent (each a :class:`~queueflow.ShareAgent` with the same
            handler and options), labelled ``"<name>#0"``, ``"<name>#1"``... where ``<name>``
            is the last dotted part of the agent's name (``"handler#0"``).
        partitions: the partition count of every topic not in ``topics``.
        topics: partition counts by topic name, e.g. ``{"orders": 3, "results": 1}``
            (sink and dead-letter topics must be listed to exist, as on Kafka).
        settings: share-group setting overrides (attribute or KIP names) on top of
            :data:`HARNESS_SETTINGS` (``share.auto.offset.reset`` is ``earliest`` here); the
            ``QUEUEFLOW_*`` environment variables are not read, so tests don't depend on them.
            An ``exactly_once`` agent (``processing_guarantee="exactly_once"``, or of an app
            whose ``queueflow.processing.guarantee`` is ``exactly_once``) makes
            ``queueflow.processing.guarantee`` ``exactly_once`` unless given here: the
            in-memory cluster then has Kafka transactions and the ack topics
            (:mod:`queueflow.testing.transactions`), and results show in :meth:`sent` once
            their transaction commits.
        group_config: group configs for every agent's group, e.g.
            ``{"share.delivery.count.limit": 3, "share.record.lock.duration.ms": 5000}``.
        group_configs: group configs by group, as ``App(group_configs=...)``; win over
            ``group_config``.
        clock: the fake clock (default: a new :class:`~queueflow.testing.FakeClock`).
        app_id: the app id of the in-memory cluster.
        decode: replaces each record's ``value`` (and ``key``) by its decoded form before the
            handler sees it, raising if it can't (the record is then REJECTed); default: an
            agent's own decoding (its Faust topic's serializers), raw bytes for a bare handler.
        **options: :class:`~queueflow.member.agent.ShareAgentOptions` fields
            (``concurrency=``, ``batch=``, ``batch_size=``, ``lock_duration_ms=``,
            ``handler_timeout_ms=``, ...) for a bare handler, or overriding the agents' own.

    Raises:
        ConfigurationError: no agent, a bare handler without ``topic=``, ``members`` < 1, an
            invalid option (:class:`~queueflow.member.agent.ShareAgentOptions`), setting or
            group config.
        TypeError: something that is neither a share agent nor an async handler.
    """

    def __init__(
        self,
        *agents: ShareAgent | Handler,
        topic: str | None = None,
        group: str | None = None,
        members: int = 1,
        partitions: int = 1,
        topics: Mapping[str, int] | None = None,
        settings: Mapping[str, Any] | None = None,
        group_config: Mapping[str, Any] | None = None,
        group_configs: Mapping[str, Mapping[str, Any]] | None = None,
        clock: FakeClock | None = None,
        app_id: str = "harness",
        decode: Decoder | None = None,
        **options: Any,
    ) -> None:
        if not agents:
            raise ConfigurationError(
                "ShareAgentHarness needs a share agent (an @app.share_agent object) or a "
                "handler with topic="
            )
        if members < 1:
            raise ConfigurationError(f"members={members}; must be >= 1")
        self.specs = [self._spec(a, topic, group, options) for a in agents]
        if decode is not None:
            for spec in self.specs:
                spec.decode = decode
        counts = dict(topics or {})
        for spec in self.specs:
            counts.setdefault(spec.topic, partitions)
        configs: dict[str, dict[str, Any]] = {}
        for spec in self.specs:
            configs.setdefault(spec.group, dict(group_config or {}))
            if spec.options.ordering == "key":  # as @app.share_agent(..., ordering="key")
                configs[spec.group].setdefault("share.ordering", "key")
        for name, values in (group_configs or {}).items():
            configs.setdefault(name, {}).update(values)
        self.clock = clock or FakeClock()
        base = dict(HARNESS_SETTINGS)
        if any(spec.guarantee == "exactly_once" for spec in self.specs):
            # Its leaders must apply transactional acknowledgements (as the app's setting).
            base["processing_guarantee"] = "exactly_once"
        self.settings = ShareGroupSettings.load({**base, **(settings or {})}, env={})
        for spec in self.specs:
            spec.options.check_lock_duration(self.settings)
        self.members_per_agent = members
        #: The in-memory cluster (its coordinator, leaders, tables and topics).
        self.cluster = InProcessCluster(
            counts,
            app_id=app_id,
            settings=self.settings,
            clock=self.clock,
            group_configs={g: v for g, v in configs.items() if v},
        )
        #: The running members, in start order (:attr:`ShareAgent.name` is the agent's).
        self.members: list[ShareAgent] = []
        #: Captured log events of the harness's run (structlog key-values plus ``log_level``).
        self.logs: list[dict[str, Any]] = []
        self._labels: dict[str, str] = {}  # member id -> label
        self._agent_labels: dict[int, str] = {}  # id(ShareAgent) -> label
        self._history: dict[tuple[str, str, int, int], RecordHistory] = {}
        self._round_robin: dict[str, itertools.cycle[int]] = {}
        self._processors: list[Any] | None = None
        self._put: set[RecordRef] = set()
        self._started = False
        self._tap_bus()

    # -- building --------------------------------------------------------------------------
    @staticmethod
    def _spec(
        agent: ShareAgent | Handler, topic: str | None, group: str | None, options: Any
    ) -> _Spec:
        if isinstance(agent, ShareAgent):
            opts = dataclasses.replace(agent.options, **options) if options else agent.options
            if opts.name is None:
                opts = dataclasses.replace(opts, name=agent.name)
            encoder = getattr(getattr(agent, "publisher", None), "encoder", None)
            # Resolved against the agent's app: an app-wide exactly_once holds in the harness.
            guarantee = getattr(agent, "processing_guarantee", None)
            if guarantee is not None and opts.processing_guarantee is None:
                opts = dataclasses.replace(opts, processing_guarantee=guarantee)
            return _Spec(
                agent.handler,
                topic or agent.topic_name,
                group or agent.group,
                opts,
                agent.decode,
                _faust_topic(agent),
                {"encode": encoder} if encoder is not None else {},
                opts.processing_guarantee,
            )
        if not callable(agent):
            raise TypeError(
                f"ShareAgentHarness takes share agents or async handlers, not {agent!r}"
            )
        if topic is None:
            raise ConfigurationError(
                f"a bare handler ({getattr(agent, '__qualname__', agent)!r}) has no topic: "
                "pass topic='...' (and group='...'), or pass the @app.share_agent object"
            )
        opts = ShareAgentOptions(**options)
        if opts.name is None:
            opts = dataclasses.replace(opts, name=opts.agent_name(agent))
        return _Spec(
            agent, topic, group or "test-group", opts, None, None, {}, opts.processing_guarantee
        )

    def _tap_bus(self) -> None:
        """See every request and answer on the in-memory control topics (deliveries and
        acknowledgements) and what each request did to the share-partitions (final states)."""
        cluster = self.cluster
        bus = cluster.bus
        send = bus.send
        reply_topic = bus.reply_topic

        async def tapped_send(
            topic: str, partition: int, value: bytes, key: bytes | None = None
        ) -> None:
            if topic == reply_topic:
                self._seen_reply(value)
            await send(topic, partition, value, key)

        bus.send = tapped_send  # type: ignore[method-assign]
        # exactly_once: the committed acknowledgements reach the leaders on the ack topics.
        control = [
            (name, control_topic)
            for name in cluster.leaders
            for control_topic in (
                internal.request_topic(cluster.app_id, name),
                internal.ack_topic(cluster.app_id, name),
            )
            if control_topic in bus.handlers
        ]
        for name, control_topic in control:
            handle = bus.handlers[control_topic]

            async def tapped(
                partition: int,
                offset: int,
                value: bytes,
                _handle: Any = handle,
                _topic: str = name,
            ) -> None:
                before = self._window(_topic, partition)
                try:
                    await _handle(partition, offset, value)
                finally:
                    self._seen_request(_topic, partition, value, before)

            bus.handlers[control_topic] = tapped

    def _window(self, topic: str, partition: int) -> dict[str, set[int]]:
        """Per group: the offsets of ``topic[partition]`` in flight and not yet final."""
        out: dict[str, set[int]] = {}
        for (group, p), durable in self.cluster.leaders[topic].partitions.items():
            if p != partition:
                continue
            out[group] = {
                o
                for run in durable.engine.in_flight()
                if run.state not in _TERMINAL
                for o in range(run.first_offset, run.last_offset + 1)
            }
        return out

    def _entry(self, group: str, topic: str, partition: int, offset: int) -> RecordHistory:
        key = (group, topic, partition, offset)
        entry = self._history.get(key)
        if entry is None:
            entry = self._history[key] = RecordHistory(topic, partition, offset, group)
        return entry

    def _label(self, member_id: str) -> str:
        return self._labels.get(member_id, member_id)

    def _group_of(self, member_id: str) -> str | None:
        for agent in self.members:
            if agent.member_id == member_id:
                return agent.group
        return None

    def _seen_reply(self, value: bytes) -> None:
        try:
            message = protocol.decode(value)
        except Exception:
            return
        if not isinstance(message, protocol.ShareFetchResponse) or not message.acquired:
            return
        group = self._group_of(message.member_id)
        if group is None:
            return
        member = self._label(message.member_id)
        for first, last, count in message.acquired:
            for offset in range(first, last + 1):
                entry = self._entry(group, message.topic, message.partition, offset)
                entry.deliveries.append(Delivery(member, count))

    def _seen_request(
        self, topic: str, partition: int, value: bytes, before: dict[str, set[int]]
    ) -> None:
        try:
            message = protocol.decode(value)
        except Exception:
            return
        accepted: set[int] = set()
        if isinstance(message, protocol.ShareFetchRequest) and message.acks:
            member = self._label(message.member_id)
            for first, last, types in message.acks:
                for i, offset in enumerate(range(first, last + 1)):
                    kind = AcknowledgeType(types[i] if len(types) > 1 else types[0])
                    if kind is AcknowledgeType.GAP:
                        continue
                    entry = self._entry(message.group, topic, partition, offset)
                    entry.outcomes.append(Outcome(kind, member))
                    if kind is AcknowledgeType.ACCEPT:
                        accepted.add(offset)
        leader = self.cluster.leaders[topic]
        for group, offsets in before.items():
            durable = leader.partitions.get((group, partition))
            if durable is None:
                continue
            mine = (
                accepted
                if isinstance(message, protocol.ShareFetchRequest) and message.group == group
                else set()
            )
            for offset in offsets:
                state = durable.engine.record(offset).state
                if state in _TERMINAL:  # below the SPSO reads Archived: decide by the ack
                    final = RecordState.ACKNOWLEDGED if offset in mine else RecordState.ARCHIVED
                    self._entry(group, topic, partition, offset).state = final

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the cluster and ``members`` members per agent, and wait until the group's
        share-partitions are assigned.

        Raises:
            ConfigurationError: an agent's topic is unknown to the cluster.
        """
        self._tap_logs()
        await self.cluster.start()
        self._started = True
        for spec in self.specs:
            for n in range(self.members_per_agent):
                agent = ShareAgent(
                    self.cluster.member_context,
                    spec.handler,
                    spec.topic,
                    spec.group,
                    spec.options,
                    decode=spec.decode,
                    client_id=f"{spec.options.name}#{n}",
                    **spec.extra,
                )
                agent.dispatch.backoff = _RealTimeBackoff(self.clock)
                label = f"{agent.name.rsplit('.', 1)[-1]}#{n}"
                self._agent_labels[id(agent)] = label
                await agent.start()
                assert agent.member_id is not None
                self._labels[agent.member_id] = label
                self.members.append(agent)
        await self._heartbeat_all(until_stable=True)

    async def close(self) -> None:
        """Stop the members (graceful drain, ``queueflow.shutdown.timeout.ms``), then the
        cluster; stop capturing logs. Commits held (``cluster.hold_commits()``) are released
        first: a draining exactly_once member commits what it has."""
        self.cluster.release_commits()
        try:
            for agent in self.members:
                await agent.stop()
            if self._started:
                await self.cluster.close()
        finally:
            self._untap_logs()

    async def __aenter__(self) -> ShareAgentHarness:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _tap_logs(self) -> None:
        processors = structlog.get_config()["processors"]
        processors.insert(0, self._log_tap)
        self._processors = processors

    def _untap_logs(self) -> None:
        if self._processors is not None and self._log_tap in self._processors:
            self._processors.remove(self._log_tap)
        self._processors = None

    def _log_tap(self, logger: Any, method: str, event: Any) -> Any:
        if isinstance(event, dict):
            self.logs.append({**event, "log_level": method})
        return event

    async def _heartbeat_all(self, until_stable: bool = False) -> None:
        """Heartbeat every running member now (so that a live member's session never expires
        by :meth:`advance` alone); with ``until_stable``, until no assignment changes."""
        for _ in range(10 if until_stable else 1):
            before = [set(a.session.assignment) if a.session else set() for a in self.members]
            for agent in self.members:
                session = agent.session
                if session is None or agent.stopping:
                    continue
                membership = session._membership  # the harness heartbeats for the member
                await membership.refresh()
            await self.cluster.bus.drain()
            after = [set(a.session.assignment) if a.session else set() for a in self.members]
            if before == after:
                return

    # -- records in ------------------------------------------------------------------------
    def _topic(self, topic: str | None) -> str:
        if topic is None:
            return self.specs[0].topic
        if topic not in self.cluster.topics:
            raise ConfigurationError(
                f"unknown topic {topic!r}; the harness has {sorted(self.cluster.topics)} (pass "
                f"topics={{{topic!r}: <partitions>}} to ShareAgentHarness)"
            )
        return topic

    def _spec_of(self, topic: str) -> _Spec | None:
        return next((s for s in self.specs if s.topic == topic), None)

    def _encode(self, topic: str, value: Any, key: Any) -> tuple[bytes | None, bytes | None]:
        spec = self._spec_of(topic)
        faust_topic = spec.faust_topic if spec is not None else None
        if faust_topic is not None:
            serializers = faust_topic.app.serializers
            if not isinstance(value, bytes) and value is not None:
                value = serializers.dumps_value(
                    faust_topic.value_type, value, serializer=faust_topic.value_serializer
                )
            if key is not None and not isinstance(key, bytes):
                key = serializers.dumps_key(
                    faust_topic.key_type, key, serializer=faust_topic.key_serializer
                )
            return key, value
        for what, raw in (("value", value), ("key", key)):
            if raw is not None and not isinstance(raw, bytes):
                raise TypeError(
                    f"topic {topic!r} carries raw bytes (its agent has no Faust topic with a "
                    f"serializer): put a bytes {what}, not {type(raw).__name__}; or declare "
                    "the agent on app.topic(name, value_type=..., value_serializer=...)"
                )
        return key, value

    def put(
        self,
        value: Any,
        *,
        key: Any = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        partition: int | None = None,
        topic: str | None = None,
    ) -> RecordRef:
        """Append one record to a topic (the first agent's topic by default).

        Args:
            value: bytes as they would be on Kafka, or a value encoded with the agent's topic's
                serializers (``app.topic(..., value_type=..., value_serializer=...)``), so
                the handler sees what it would see in production.
            key: the key, bytes or a value encoded likewise; ``None``: no key.
            headers: ``{"name": b"value"}`` or ``[("name", b"value"), ...]``.
            partition: the partition; ``None``: by the key's hash (Kafka's default
                partitioner, murmur2) when a key is given, else round robin.
            topic: the topic (a harness topic).

        Returns:
            Where the record is (:class:`RecordRef`).

        Raises:
            ConfigurationError: an unknown topic.
            ValueError: a partition the topic doesn't have.
            TypeError: a non-bytes value or key for a raw-bytes topic.
        """
        name = self._topic(topic)
        count = self.cluster.topics[name]
        raw_key, raw_value = self._encode(name, value, key)
        if partition is None:
            if raw_key is not None:
                from aiokafka.partitioner import DefaultPartitioner

                parts = list(range(count))
                partition = int(DefaultPartitioner()(raw_key, parts, parts))
            else:
                cycle = self._round_robin.setdefault(name, itertools.cycle(range(count)))
                partition = next(cycle)
        if not 0 <= partition < count:
            raise ValueError(
                f"topic {name!r} has {count} partition(s) (0..{count - 1}); partition="
                f"{partition} does not exist: pass partitions= or topics={{{name!r}: n}} to "
                "ShareAgentHarness"
            )
        if headers is None:
            pairs: tuple[tuple[str | bytes, bytes], ...] = ()
        elif isinstance(headers, Mapping):
            pairs = tuple(headers.items())
        else:
            pairs = tuple(headers)
        offset = self.cluster.produce(
            name, raw_value, key=raw_key, partition=partition, headers=pairs
        )
        ref = RecordRef(name, partition, offset)
        self._put.add(ref)
        return ref

    def put_many(
        self, values: Iterable[Any], *, topic: str | None = None, partition: int | None = None
    ) -> list[RecordRef]:
        """:meth:`put` each value (no key; round robin over the partitions unless
        ``partition`` is given); returns where each went."""
        return [self.put(v, topic=topic, partition=partition) for v in values]

    # -- running ---------------------------------------------------------------------------
    def _groups(self) -> set[tuple[str, str]]:
        return {(s.group, s.topic) for s in self.specs}

    def _done(self) -> bool:
        for group, topic in self._groups():
            for p in range(self.cluster.topics[topic]):
                end = len(self.cluster.records[TopicPartition(topic, p)])
                if not end:
                    continue
                engine = self.cluster.share_partition(group, topic, p)
                if engine is None or int(engine.start_offset) < end:
                    return False
        return all(
            not a.runner.busy
            and not a.runner.queued
            and (a.session is None or not list(a.session.acks.partitions()))
            for a in self.members
            if not a.stopping  # a crashed member's leftovers are not work
        )

    def _surely_busy(self) -> bool:
        """Work that happens without time moving, whatever the timing: outcomes waiting to
        be sent, queued records with a handler free, a call past its deadline not yet
        cancelled (the watchdog's next round cancels it)."""
        for a in self.members:
            if a.stopping or a.deadlines.all_stuck:
                continue
            if a.session is not None and list(a.session.acks.partitions()):
                return True
            if a.transactions is not None and a.transactions._pending:
                return True  # outcomes lingering for the next transaction
            if a.runner.queued and a.runner.busy < a.concurrency:
                return True
            now = a.ctx.clock.monotonic()
            if any(c.cancelled_at is None and now >= c.deadline for c in a.deadlines.calls):
                return True
        return False

    def _fingerprint(self) -> tuple[Any, ...]:
        parts: list[Any] = [tuple(len(log) for log in self.cluster.records.values())]
        for group, topic in sorted(self._groups()):
            for p in range(self.cluster.topics[topic]):
                engine = self.cluster.share_partition(group, topic, p)
                if engine is not None:
                    parts.append(
                        (
                            int(engine.start_offset),
                            int(engine.end_offset),
                            tuple(
                                (
                                    r.first_offset,
                                    r.last_offset,
                                    r.state,
                                    r.delivery_count,
                                    r.member_id,
                                )
                                for r in engine.in_flight()
                            ),
                        )
                    )
        for a in self.members:
            session = a.session
            parts.append(
                (
                    tuple(sorted(a.stats.as_dict().items())),
                    a.runner.busy,
                    a.runner.queued,
                    tuple(sorted(session.assignment)) if session else (),
                    tuple(sorted(session.acks.partitions())) if session else (),
                    tuple(c.cancelled_at for c in a.deadlines.calls),
                    _transactions(a),
                )
            )
        return tuple(parts)

    def _waiting(self) -> list[str]:
        lines: list[str] = []
        for group, topic in sorted(self._groups()):
            for p in range(self.cluster.topics[topic]):
                end = len(self.cluster.records[TopicPartition(topic, p)])
                engine = self.cluster.share_partition(group, topic, p)
                if engine is None:
                    if end:
                        lines.append(f"{group} {topic}[{p}]: {end} record(s) never fetched")
                    continue
                for r in engine.in_flight():
                    if r.state in _TERMINAL:
                        continue
                    owner = f" by {self._label(r.member_id)}" if r.member_id else ""
                    lines.append(
                        f"{group} {topic}[{p}] offsets {r.first_offset}..{r.last_offset}: "
                        f"{r.state.name}{owner}, delivery count {r.delivery_count}"
                    )
                if int(engine.end_offset) < end:
                    lines.append(
                        f"{group} {topic}[{p}] offsets {int(engine.end_offset)}..{end - 1}: "
                        "not fetched yet"
                    )
        for a in self.members:
            if a.runner.busy or a.runner.queued:
                lines.append(
                    f"member {self._agent_labels.get(id(a), a.name)}: {a.runner.busy} handler "
                    f"call(s) running, {a.runner.queued} record(s) queued"
                )
        return lines

    async def run_until_idle(self, timeout_s: float = 10.0) -> IdleReport:
        """Let the members work, without moving the clock, until every record of the agents'
        topics is Acknowledged or Archived in each group (and no handler call runs), or nothing
        has changed for :data:`QUIET_S` real seconds (what is left waits for time: a hung
        handler, a lock or session to expire; :meth:`advance` moves it).

        Args:
            timeout_s: the bound, in real seconds.

        Returns:
            :class:`IdleReport`: ``done``, or what is still waiting.

        Raises:
            HarnessTimeout: still changing after ``timeout_s`` (a handler that keeps working
                in real time, a RELEASE loop of a member that never reaches the delivery
                limit...); the message names what is in flight.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last: tuple[Any, ...] | None = None
        quiet_since = loop.time()
        while True:
            remaining = deadline - loop.time()
            if remaining > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.cluster.bus.drain(), remaining)
            await asyncio.sleep(0.005)
            if self._done():
                await asyncio.sleep(0.01)  # an outcome in flight would show now
                if self._done():
                    return IdleReport(True)
            now = loop.time()
            fingerprint = self._fingerprint()
            if fingerprint != last:
                last, quiet_since = fingerprint, now
            elif now - quiet_since >= QUIET_S and not self._surely_busy():
                return IdleReport(False, tuple(self._waiting()))
            if now >= deadline:
                waiting = "\n  ".join(self._waiting()) or "(nothing in flight)"
                raise HarnessTimeout(
                    f"run_until_idle(timeout_s={timeout_s}): still busy after {timeout_s} s "
                    f"(real time; the fake clock did not move). In flight:\n  {waiting}"
                )
            await asyncio.sleep(0.01)

    async def advance(
        self, ms: int, *, step_ms: int | None = None, timeout_s: float = 10.0
    ) -> IdleReport:
        """Move the fake clock ``ms`` milliseconds forward, then :meth:`run_until_idle`.

        Each step: the clock moves, every running member heartbeats (a live member's session
        does not expire by waiting alone, as in production; a stopped or crashed one's does),
        the leaders and the coordinator tick (expired acquisition locks go back to Available,
        expired sessions release their records), and the members react (handler calls past
        their deadline are cancelled and their records RELEASEd).

        Args:
            ms: how far, in ms (>= 0).
            step_ms: move in steps of at most this many ms, letting the members react after
                each (``None``: one step). Steps matter when several deadlines fall inside
                ``ms``: a handler timeout of 500 ms inside a 30 s lock is seen at 500 ms only
                with steps of at most 500 ms.
            timeout_s: the bound of each step's :meth:`run_until_idle` (real seconds).

        Returns:
            The last step's :class:`IdleReport`.

        Raises:
            ValueError: ``ms`` < 0 or ``step_ms`` < 1.
            HarnessTimeout: as :meth:`run_until_idle`.
        """
        if ms < 0:
            raise ValueError(f"advance(ms={ms}): the clock doesn't go backwards")
        if step_ms is not None and step_ms < 1:
            raise ValueError(f"advance(step_ms={step_ms}); must be >= 1 (ms)")
        left = ms
        while True:
            step = left if step_ms is None else min(step_ms, left)
            await self._move(step)
            left -= step
            await self._heartbeat_all(until_stable=True)  # assignments after expiries
            report = await self.run_until_idle(timeout_s)
            if left <= 0:
                return report

    async def _move(self, ms: int) -> None:
        """Move the clock ``ms`` forward in beats of at most a heartbeat interval, each with
        the live members' heartbeats and ticks: a coordinator that hears nothing for two
        heartbeat intervals takes the silence for its own outage and forgives every session
        (see ``touch_after_silence`` in queueflow/server/coordinator/membership.py)."""
        beat = max(self.settings.heartbeat_interval_ms, 1)
        while True:
            step = min(beat, ms)
            self.clock.advance(step)
            ms -= step
            await self._heartbeat_all()
            # The ticker ticks the coordinator every few ticks only (its sessions are long).
            for _ in range(self.cluster.ticker.coordinator_every):
                await self.cluster.tick()
            if ms <= 0:
                return

    # -- members ---------------------------------------------------------------------------
    def member(self, label: str) -> ShareAgent:
        """The running member labelled ``label`` (``"handler#0"``).

        Raises:
            KeyError: no such member (the message lists them).
        """
        for agent in self.members:
            if self._agent_labels.get(id(agent)) == label:
                return agent
        raise KeyError(f"no member {label!r}; members: {sorted(self._agent_labels.values())}")

    async def stop_member(self, label: str, *, crash: bool = False) -> None:
        """Stop one member: gracefully (drain, RELEASE what it holds, leave the group), or with
        ``crash=True`` as a killed process (its handler calls are cancelled, nothing is sent,
        it stops heartbeating: its records come back when its session expires or their locks
        do, see :meth:`advance`)."""
        agent = self.member(label)
        if not crash:
            await agent.stop()
            return
        session = agent.session
        agent.lifecycle.move(type(agent.state).STOPPING)
        tasks = list(agent._tasks)  # the harness kills the member's tasks as a SIGKILL would
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if session is not None:
            await session.close(leave=False)
        agent.lifecycle.move(type(agent.state).STOPPED)

    # -- reading back ----------------------------------------------------------------------
    def _group(self, topic: str, group: str | None) -> str:
        if group is not None:
            return group
        spec = self._spec_of(topic)
        if spec is None:
            raise ConfigurationError(
                f"no agent reads topic {topic!r}: pass group='...' to read a share group's view"
            )
        return spec.group

    def history(
        self, offset: int, *, partition: int = 0, topic: str | None = None, group: str | None = None
    ) -> RecordHistory:
        """What happened to the record at ``offset`` of ``topic[partition]`` in ``group``
        (defaults: the first agent's topic and the group of the agent reading it)."""
        name = self._topic(topic)
        group = self._group(name, group)
        entry = self._entry(group, name, partition, offset)
        if entry.state is None:
            engine = self.cluster.share_partition(group, name, partition)
            if engine is not None and offset >= int(engine.start_offset):
                entry_state = engine.record(offset).state
                return dataclasses.replace(entry, state=entry_state)
        return entry

    def records(self, *, topic: str | None = None, group: str | None = None) -> list[RecordHistory]:
        """The history of every record of ``topic`` in ``group``, by partition and offset."""
        name = self._topic(topic)
        return [
            self.history(o, partition=p, topic=name, group=group)
            for p in range(self.cluster.topics[name])
            for o in range(len(self.cluster.records[TopicPartition(name, p)]))
            if self.cluster.records[TopicPartition(name, p)][o].value is not None
        ]

    def archived(
        self, *, topic: str | None = None, group: str | None = None
    ) -> list[RecordHistory]:
        """The records Archived (REJECTed, or at the delivery count limit), in order."""
        return [
            r for r in self.records(topic=topic, group=group) if r.state is RecordState.ARCHIVED
        ]

    def acknowledged(
        self, *, topic: str | None = None, group: str | None = None
    ) -> list[RecordHistory]:
        """The records Acknowledged (ACCEPTed), in order."""
        return [
            r for r in self.records(topic=topic, group=group) if r.state is RecordState.ACKNOWLEDGED
        ]

    def share_partition(
        self, partition: int = 0, *, topic: str | None = None, group: str | None = None
    ) -> SharePartitionState | None:
        """The leader's view of a share-partition (``None`` before the group's first fetch)."""
        name = self._topic(topic)
        engine = self.cluster.share_partition(self._group(name, group), name, partition)
        if engine is None:
            return None
        in_flight = {
            o: (r.state, r.delivery_count, self._label(r.member_id) if r.member_id else None)
            for r in engine.in_flight()
            for o in range(r.first_offset, r.last_offset + 1)
        }
        return SharePartitionState(int(engine.start_offset), int(engine.end_offset), in_flight)

    @property
    def handler_errors(self) -> list[HandlerError]:
        """The error lines the members logged about their handlers, in order."""
        out = []
        for line in self.logs:
            if line.get("log_level") not in ("error", "critical") or "agent" not in line:
                continue
            member = self._labels.get(str(line.get("member_id")), str(line.get("agent")))
            out.append(HandlerError(str(line["event"]), member, str(line.get("error", "")), line))
        return out

    def sent(self, topic: str) -> list[StoredRecord]:
        """The records the agents published to ``topic`` (a ``sink=`` topic or a ``Send`` to),
        in order, as stored (raw key, value and headers).

        Raises:
            ConfigurationError: an unknown topic.
        """
        name = self._topic(topic)
        sink_records = getattr(self.cluster, "sink_records", None)
        if sink_records is not None:
            return cast(list[StoredRecord], sink_records(name))
        # A cluster without in-memory sinks: what is in the topic and was not put here.
        return [
            stored
            for p in range(self.cluster.topics[name])
            for o, stored in enumerate(self.cluster.records[TopicPartition(name, p)])
            if RecordRef(name, p, o) not in self._put
        ]

    def dead_letters(self, topic: str | None = None) -> list[StoredRecord]:
        """The records published to a dead-letter topic (default: the first agent's
        ``dead_letter=`` topic), in order.

        Raises:
            ConfigurationError: no ``topic`` given and no agent has ``dead_letter=``.
        """
        if topic is None:
            found = [getattr(s.options, "dead_letter", None) for s in self.specs]
            names = [t if isinstance(t, str) else str(t.get_topic_name()) for t in found if t]
            if not names:
                raise ConfigurationError(
                    "no agent of the harness has dead_letter=...: pass the dead-letter topic"
                )
            return self.sent(names[0])
        return self.sent(topic)
