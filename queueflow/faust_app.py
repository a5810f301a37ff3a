"""``queueflow.App``: a :class:`faust.App` that hosts share groups. The module that builds on
Faust: it builds the server and member contexts from the Faust app and wires the share-group
coordinator and the share-partition leaders to Faust agents, tables and timers. The Faust and
aiokafka internals it needs go through :mod:`queueflow._compat`.

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

import asyncio
import collections
import contextlib
import functools
import inspect
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import faust
import faust.streams
import mode
import prometheus_client
import structlog

from queueflow import _compat, dashboard
from queueflow import logging as qf_logging
from queueflow.admin import ShareGroupAdmin
from queueflow.engine.fencing import (
    MembershipLease,
    RecoveryWatch,
    ack_advances_recovery,
    lease_allows,
    snapshot_replaces,
    store_rebuild_needed,
    write_ownership,
)
from queueflow.engine.group_config import DEAD_LETTER_TOPIC, ORDERING, validate_group_configs
from queueflow.errors import ConfigurationError, CorruptStateError, UnknownNameWarning
from queueflow.kafka.admin import (
    TopicMetadata,
    ensure_partitions,
    ensure_topic,
    partition_counts,
    retry_unready,
    topic_partition_counts,
)
from queueflow.kafka.batch_fetch import KafkaBatchFetcher
from queueflow.kafka.config import KafkaClientConfig, check_control_auth
from queueflow.kafka.key_reader import KafkaKeySource
from queueflow.kafka.log_reader import LogRangeReader
from queueflow.kafka.security import credentials_to_kwargs
from queueflow.kafka.startup import wait_for_broker
from queueflow.kafka.tls import leader_ssl_context
from queueflow.kafka.transactions import check_ack_topics_readable, check_transactions
from queueflow.member.agent import Decoder, Handler, ShareAgent, ShareAgentOptions
from queueflow.member.agent.outputs import Outbound
from queueflow.member.context import MemberContext
from queueflow.member.membership import Membership
from queueflow.member.session import AcknowledgementCallback, ShareFetchSession
from queueflow.metrics import CONTENT_TYPE, Metrics, render_all
from queueflow.protocol import topics
from queueflow.protocol.roles import ControlAuth
from queueflow.protocol.state_codec import decode_snapshot
from queueflow.server.auth_health import AuthHealth
from queueflow.server.connections import DirectLimits
from queueflow.server.context import RequestHandler, ServerContext
from queueflow.server.coordinator import ShareGroupCoordinator
from queueflow.server.endpoint import LeaderEndpoint
from queueflow.server.junk import JunkGate
from queueflow.server.leader import ShareLeader
from queueflow.server.leader.acks_reader import AckReader
from queueflow.server.leader.dead_letters import DeadLetterWriter, KafkaDeadLetterIO
from queueflow.server.leader.lease import LeaseGate
from queueflow.server.log_offsets import LogOffsets
from queueflow.server.ticker import LeaderTicker
from queueflow.server.transport import monotonic_ms
from queueflow.settings import (
    KafkaListenerLeaders,
    ProcessingGuarantee,
    ShareGroupSettings,
    did_you_mean,
    refuse_unknown_keywords,
)
from queueflow.structs import ShareRecord, TopicPartition

__all__ = ["LEADER_GROUP_DEFAULTS", "ROLES", "App", "ShareGroups", "attach"]

log = structlog.get_logger("queueflow.faust_app")

ROLES = ("all", "leader", "member")
#: How often the leaders' stall guard runs (s); see :mod:`queueflow.engine.fencing`.
STALL_CHECK_INTERVAL_S = 0.1
#: How often (s) the fences task runs while nothing moves (every own partition live, no
#: rebalance, assignment or stall for :data:`FENCES_SETTLE_S`): then it only repeats the direct
#: endpoint's announcements (every 2 s), and an idle leader need not wake 10 times a second.
#: While something moves it runs every :data:`STALL_CHECK_INTERVAL_S`, and an assignment wakes
#: it at once.
FENCES_IDLE_INTERVAL_S = 1.0
#: Seconds after an assignment, a revocation or a stall during which the fences task keeps
#: the stall guard's pace (fences are resent every second until read back).
FENCES_SETTLE_S = 5.0
#: Faust's table recovery is started over after this long (ms) without restoring a record,
#: again after each further period, until ``queueflow.leader.recovery.stall.ms`` stops the
#: worker (its half, if shorter). A healthy recovery restores records within a fetch wait;
#: a restart resumes from the records restored so far, so an early one costs a few requests.
RECOVERY_RESTART_MS = 10_000
#: Faust consumer-group timeouts (s) of the leaders unless set by argument or env var: a
#: SIGKILLed leader's share-partitions move after the session timeout, so Faust's 60 s default
#: would stall them for a minute.
LEADER_GROUP_DEFAULTS = {"broker_session_timeout": 10.0, "broker_heartbeat_interval": 1.0}

#: Old names faust.App still takes for its settings (``faust.App._prepare_compat_settings``).
_FAUST_COMPAT_OPTIONS = frozenset(
    {
        "client_id",
        "commit_interval",
        "create_reply_topic",
        "num_standby_replicas",
        "default_partitions",
        "replication_factor",
    }
)


def warn_unknown_faust_options(app_cls: type[faust.App], app_id: str, options: Any) -> None:
    """Warn (:class:`~queueflow.errors.UnknownNameWarning`) about keyword arguments of a
    :class:`App` that neither queueflow nor Faust knows: Faust keeps whatever it is given (a
    subclass's ``Settings`` may read more), so they are not refused, but a typo such as
    ``settings=`` for ``share_settings=`` would otherwise have no effect and say nothing."""
    faust_names = {
        *app_cls.Settings.SETTINGS,
        *_FAUST_COMPAT_OPTIONS,
        *(n for n in inspect.signature(faust.App.__init__).parameters if n != "options"),
        "env",  # read by faust.Settings (its environment mapping), not a setting
    }
    ours = [n for n in inspect.signature(App.__init__).parameters if n not in ("kwargs", "self")]
    for name in options:
        if name in faust_names:
            continue
        hint = did_you_mean(name, [*ours, *faust_names])
        warnings.warn(
            UnknownNameWarning(
                f"queueflow.App({app_id!r}): unknown keyword argument {name!r}{hint}; it is "
                "passed to faust.App, which has no such setting, so it has no effect (queueflow "
                "takes role=, share_settings=, group_configs=; Faust's settings: "
                "https://faust-streaming.github.io/faust/userguide/settings.html)"
            ),
            stacklevel=3,
        )


#: How often (s) leader workers check their source topics' partition counts.
PARTITION_CHECK_INTERVAL_S = 5.0


class FaustRuntime:
    """:class:`~queueflow.server.context.ServerRuntime` of a Faust worker."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        conf = app.conf
        self.lease = MembershipLease(
            int(conf.broker_session_timeout * 1000), int(conf.broker_heartbeat_interval * 1000)
        )
        self._watched: object | None = None

    @property
    def generation(self) -> int:
        """Faust's consumer-group generation."""
        return int(self.app.consumer_generation_id)

    @property
    def rebalancing(self) -> bool:
        """True while Faust rebalances."""
        return bool(self.app.rebalancing)

    @property
    def streams_active(self) -> bool:
        """True when Faust's streams deliver (not rebalancing, flow control active)."""
        return not self.app.rebalancing and self.app.flow_control.is_active()

    def assigned(self) -> set[TopicPartition]:
        """The partitions Faust assigned this worker as active."""
        return {
            TopicPartition(tp.topic, tp.partition) for tp in self.app.assignor.assigned_actives()
        }

    def lease_remaining_ms(self) -> int:
        """How long (ms) this worker's membership is proven by an OK heartbeat to last."""
        return self.lease.remaining_ms(self.generation, int(time.monotonic() * 1000))

    def ownership(self) -> int | None:
        """The generation while the membership lease holds, else None
        (:func:`~queueflow.engine.fencing.write_ownership`)."""
        return write_ownership(self.generation, self.lease_remaining_ms())

    def watch_heartbeats(self) -> None:
        """Record every OK heartbeat of the aiokafka consumer's group coordinator in
        :attr:`lease` (idempotent; call it once the consumer exists, e.g. on assignment).

        The heartbeats run in Faust's consumer thread: the lease keeps one tuple, replaced
        atomically (see :func:`queueflow._compat.on_heartbeat_ok`).
        """
        coordinator = _compat.group_coordinator(self.app)
        if coordinator is self._watched:
            return
        self._watched = coordinator
        _compat.on_heartbeat_ok(coordinator, self.lease.heartbeat_ok)


class FaustSender:
    """:class:`~queueflow.server.context.ControlSender` through the worker's aiokafka producer:
    no Faust channel, codec or producer buffer on the way (they cost more than the leader's own
    work)."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    async def send(
        self, topic: str, partition: int, value: bytes, key: bytes | None = None
    ) -> None:
        """Produce ``value`` to ``topic[partition]``."""
        try:
            await self.app.producer.send(topic, key, value, partition, None, None)
        except AssertionError:
            # aiokafka's "Unrecognized partition": a partition added at runtime that the
            # producer's metadata doesn't know yet; refresh it and try once more.
            await _compat.refresh_producer_metadata(self.app)
            await self.app.producer.send(topic, key, value, partition, None, None)


def raw_table(
    app: faust.App, name: str, partitions: int | None = None, *, snapshots: bool = False
) -> Any:
    """A Faust table with bytes keys and values (queueflow encodes its own records): a
    :class:`ChangelogTable` (``snapshots``: it holds share-partition state, whose late
    snapshots it keeps out)."""
    table: Any = app.tables.add(
        ChangelogTable(
            app,
            name=name,
            beacon=app.tables.beacon,
            partitions=partitions,
            extra_topic_configs=topics.STATE_CHANGELOG_CONFIG,
            snapshots=snapshots,
        )
    )
    # Faust derives serializers from key_type/value_type (json). The changelog topic decodes
    # during recovery, so it needs raw serializers too.
    for obj in (table, table.changelog_topic):
        obj.key_serializer = "raw"
        obj.value_serializer = "raw"
    return table


class ChangelogTable(faust.Table[bytes, bytes]):
    """A Faust table whose local store a share-partition is loaded from only once it holds
    the whole changelog partition (docs/architecture.md "Standby stores and late snapshots").

    * **Takeover rebuilds.** A changelog partition this worker becomes the active owner of
      without having owned it in every generation since its previous assignment
      (:func:`~queueflow.engine.fencing.store_rebuild_needed`: a standby's store, or its own
      from before a missed generation) is emptied and recovered from the changelog's start:
      a standby store can lack records Faust counted as applied. ``state_store_rebuilt`` is
      logged.
    * **Late snapshots** (``snapshots``): a share-partition snapshot read from the changelog
      does not replace one of a higher state epoch (a cut leader's snapshot acknowledged after
      its successor's, :func:`~queueflow.engine.fencing.snapshot_replaces`);
      ``state_late_snapshot_ignored`` is logged.
    """

    def __init__(self, *args: Any, snapshots: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._snapshots = snapshots
        #: Changelog partitions active here at the last rebalance, and its generation.
        self._owned: set[int] = set()
        self._owned_generation: int | None = None
        #: Partitions emptied for a rebuild whose recovery has not completed yet.
        self._rebuilding: set[int] = set()

    async def on_rebalance(
        self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
    ) -> None:
        """Faust's rebalance hook (before its recovery reads the persisted offsets): empty the
        stores of the partitions taken over (see the class docstring)."""
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        active = _compat.active_changelog_partitions(self)
        for partition in sorted(active):
            if store_rebuild_needed(
                partition in self._owned, self._owned_generation, generation_id
            ):
                dropped = _compat.clear_store_partition(self, partition)
                self._rebuilding.add(partition)
                log.info(
                    "state_store_rebuilt",
                    table=self.name,
                    partition=partition,
                    keys_dropped=dropped,
                    generation=generation_id,
                    previous_generation=self._owned_generation,
                )
        self._owned, self._owned_generation = active, generation_id

    def persisted_offset(self, tp: Any) -> int | None:
        """Where Faust's recovery of ``tp`` starts: nowhere (the changelog's start) while the
        partition is being rebuilt, even if a flushed standby batch set an offset since."""
        if tp.partition in self._rebuilding:
            return None
        offset: int | None = super().persisted_offset(tp)
        return offset

    async def on_recovery_completed(self, active_tps: Any, standby_tps: Any) -> None:
        """Faust's end of table recovery: the rebuilt partitions are whole again."""
        self._rebuilding.difference_update(tp.partition for tp in active_tps)
        await super().on_recovery_completed(active_tps, standby_tps)

    def apply_changelog_batch(self, batch: Any) -> None:
        """Apply changelog records to the store (Faust's recovery and standby), keeping late
        snapshots out (``snapshots``)."""
        if self._snapshots:
            batch = self._without_late_snapshots(list(batch))
        super().apply_changelog_batch(batch)

    def _without_late_snapshots(self, batch: list[Any]) -> list[Any]:
        held: dict[tuple[int, bytes], tuple[int, int] | None] = {}
        kept = []
        for event in batch:
            message = event.message
            key = message.key
            if not (isinstance(key, bytes) and key.startswith(b"S/")):
                kept.append(event)
                continue
            slot = (message.partition, key)
            if slot not in held:
                held[slot] = _snapshot_epochs(
                    _compat.store_partition_get(self, message.partition, key)
                )
            incoming = None if message.value is None else _snapshot_epochs(message.value)
            if message.value is not None and not snapshot_replaces(held[slot], incoming):
                log.warning(
                    "state_late_snapshot_ignored",
                    topic=message.topic,
                    partition=message.partition,
                    offset=message.offset,
                    key=key.decode(errors="replace"),
                    snapshot=incoming,
                    kept=held[slot],
                    reason="a snapshot of a lower state epoch reached the changelog after its "
                    "successor's (a cut leader's write acknowledged late); the successor's "
                    "state is kept",
                )
                continue
            held[slot] = incoming
            kept.append(event)
        return kept


def _snapshot_epochs(raw: bytes | None) -> tuple[int, int] | None:
    """``(state epoch, snapshot epoch)`` of an encoded snapshot; None if absent or unreadable
    (a corrupt one is reported when a share-partition is loaded from it)."""
    if raw is None:
        return None
    try:
        snapshot = decode_snapshot(raw, where="changelog")
    except CorruptStateError:
        return None
    return snapshot.state_epoch, snapshot.snapshot_epoch


class _EventMessage:
    __slots__ = ("partition", "topic")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition


class _PartitionEvent:
    """Stands in for a stream event of one partition: Faust's tables and RocksDB store read
    only ``current_event().message.topic`` and ``.partition`` to pick the partition's store."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, topic: str, partition: int) -> None:
        self.message = _EventMessage(topic, partition)


@contextlib.contextmanager
def partition_scope(request_topic: str, partition: int) -> Iterator[object]:
    """The :data:`~queueflow.server.context.StateScope` of Faust workers: within it, table
    reads and writes go to ``partition``'s store, as inside a stream event of
    ``request_topic[partition]`` (Faust finds the partition through its current-event context
    variable, which this sets for the current task only)."""
    with _compat.current_event_scope(_PartitionEvent(request_topic, partition)) as event:
        yield event


#: A state write waiting to be sent: table, partition, key, value (None: delete), its future,
#: and the ownership it was made under (:func:`~queueflow.engine.fencing.write_ownership`).
_Outgoing = tuple[Any, int, bytes, bytes | None, asyncio.Future[None], int | None]


class ChangelogWriter:
    """Writes the leaders' share-partition state: the local RocksDB store at once, and the
    changelog through one ordered outbox on the worker's producer.

    Faust's own table writes are buffered by Faust and, outside a stream event, refused. The
    leaders write from stream events (the request topics) and from the direct path, so both go
    through this writer: one queue, sent in order, so a share-partition's snapshots and deltas
    reach the changelog in the order they were made. :meth:`flush` waits for the broker's
    acknowledgement of everything written so far (``queueflow.leader.state.durability=acked``).

    An acknowledgement advances the store's persisted offset (where table recovery starts) only
    if it arrives under the ownership the write was made under
    (:func:`~queueflow.engine.fencing.ack_advances_recovery`; ``ownership``: e.g.
    :meth:`FaustRuntime.ownership`, None: always): a write held up by a network partition and
    acknowledged after a successor's must not make this worker's next recovery skip them.
    """

    def __init__(self, app: faust.App, ownership: Callable[[], int | None] | None = None) -> None:
        self.app = app
        self._ownership = ownership
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._unacked: collections.deque[asyncio.Future[None]] = collections.deque()
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

    def write(self, table: Any, key: bytes, value: bytes | None) -> None:
        """Write ``key`` (``value`` None: delete) to ``table``'s current partition (the stream
        event's, or :func:`partition_scope`'s)."""
        event = faust.streams.current_event()
        if event is None:
            raise RuntimeError(
                "queueflow state written outside a stream event or partition_scope(); "
                "this is a bug in queueflow"
            )
        partition = event.message.partition
        store = _compat.table_store(table)
        if value is None:
            with contextlib.suppress(KeyError):
                del store[key]
        else:
            store[key] = value
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        owner = self._owner()
        self._outbox.append((table, partition, key, value, done, owner))
        self._unacked.append(done)
        while self._unacked and self._unacked[0].done():
            self._unacked.popleft()
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send())

    async def _send(self) -> None:
        producer = self.app.producer
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._outbox:
                table, partition, key, value, done, owner = self._outbox.popleft()
                topic = table.changelog_topic.get_topic_name()
                try:
                    sent = cast(
                        "asyncio.Future[Any]",
                        await producer.send(topic, key, value, partition, None, None),
                    )
                except Exception as exc:
                    log.error("state_changelog_write_failed", topic=topic, error=repr(exc))
                    done.set_exception(exc)
                    done.exception()  # retrieved: flush() re-raises for the waiters
                    continue
                sent.add_done_callback(functools.partial(self._acked, table, owner, done=done))

    def _owner(self) -> int | None:
        return 0 if self._ownership is None else self._ownership()

    def _acked(
        self, table: Any, owner: int | None, fut: asyncio.Future[Any], *, done: asyncio.Future[None]
    ) -> None:
        if done.done():
            return
        if fut.cancelled() or fut.exception() is not None:
            error = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            log.error("state_changelog_write_failed", error=repr(error))
            done.set_exception(error or RuntimeError("changelog write failed"))
            done.exception()
            return
        metadata = fut.result()
        acked_under = self._owner()
        if ack_advances_recovery(owner, acked_under):
            # As Faust's own changelog callback does: recovery can start after this offset.
            _compat.set_persisted_offset(table, metadata.topic_partition, metadata.offset)
        elif owner is not None:  # not for writes made before the lease was proven
            log.info(
                "state_changelog_offset_held",
                topic=metadata.topic_partition.topic,
                partition=metadata.topic_partition.partition,
                offset=metadata.offset,
                written_generation=owner,
                acked_generation=acked_under,
            )
        done.set_result(None)

    async def flush(self) -> None:
        """Wait until the broker acknowledged every state write made so far.

        Raises:
            Exception: the producer's error when a write failed (the answers that depend on
                it must not go out as if it were durable).
        """
        waiting = list(self._unacked)
        if waiting:
            await asyncio.gather(*waiting)


class LeaderStateTable:
    """The :class:`~queueflow.server.durable.StateTable` of one leader: a Faust table read
    directly and written through the app's :class:`ChangelogWriter`."""

    def __init__(self, table: Any, writer: ChangelogWriter) -> None:
        self.table = table
        self.writer = writer

    def get(self, key: bytes, default: None = None) -> bytes | None:
        """The value of ``key`` in the current partition's store, or None."""
        value: bytes | None = _compat.table_store(self.table).get(key)
        return value

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.writer.write(self.table, key, value)

    def __delitem__(self, key: bytes) -> None:
        self.writer.write(self.table, key, None)


def control_topic(app: faust.App, name: str, partitions: int | None = None) -> Any:
    """A Faust topic of raw control messages (requests, ticks, fences)."""
    return app.topic(
        name,
        internal=True,
        partitions=partitions,
        key_serializer="raw",
        value_serializer="raw",
        config=topics.CONTROL_TOPIC_CONFIG,
    )


def serve(app: faust.App, topic: Any, name: str, handle: RequestHandler) -> Any:
    """A Faust agent that passes each record of ``topic`` to ``handle(partition, offset,
    value)``, in order, inside its stream event (so table writes are allowed)."""

    async def run(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            await handle(message.partition, message.offset, event.value)

    return app.agent(topic, name=name)(run)


def faust_decoder(app: faust.App, topic: Any) -> Decoder | None:
    """Decodes records with ``topic``'s key/value types and serializers; None for a topic name or
    a topic whose records stay raw bytes."""
    if isinstance(topic, str):
        return None
    if (
        topic.value_type is None
        and topic.value_serializer == "raw"
        and topic.key_type is None
        and topic.key_serializer in ("raw", None)
    ):
        return None
    serializers = app.serializers

    def decode(record: ShareRecord) -> None:
        record.value = serializers.loads_value(
            topic.value_type, record.raw_value, serializer=topic.value_serializer
        )
        if record.key is not None:
            # An undecodable key leaves the raw key: the value decides whether it's handled.
            with contextlib.suppress(Exception):
                record.key = serializers.loads_key(
                    topic.key_type, record.key, serializer=topic.key_serializer
                )

    return decode


class FaustEncoder:
    """Encodes share-agent results for their destinations with Faust's serializers (a
    :class:`~queueflow.member.agent.publishing.Encoder`): a Faust topic or agent with that
    channel's own key/value types and serializers, a topic name with the app's defaults
    (``key_serializer``, ``value_serializer``); ``bytes`` pass through."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    @staticmethod
    def _channel(to: Any) -> Any:
        channel = getattr(to, "channel", None)  # a Faust agent: its topic
        return to if channel is None or isinstance(to, str) else channel

    def topic_name(self, to: Any) -> str:
        """See :meth:`Encoder.topic_name`.

        Raises:
            TypeError: ``to`` is neither a topic name nor a Faust topic or agent.
        """
        if isinstance(to, str):
            return to
        name = getattr(self._channel(to), "get_topic_name", None)
        if name is None:
            raise TypeError(
                f"a destination is a topic name, a Faust topic or a Faust agent; got "
                f"{type(to).__name__}"
            )
        return str(name())

    def encode(self, out: Outbound) -> tuple[bytes | None, bytes | None]:
        """See :meth:`Encoder.encode`."""
        if out.raw:
            return out.key, out.value
        serializers = self.app.serializers
        if isinstance(out.to, str):
            key_type = value_type = key_serializer = value_serializer = None
        else:
            channel = self._channel(out.to)
            key_type, value_type = channel.key_type, channel.value_type
            key_serializer, value_serializer = channel.key_serializer, channel.value_serializer
        key = (
            None
            if out.key is None
            else serializers.dumps_key(key_type, out.key, serializer=key_serializer)
        )
        value = (
            None
            if out.value is None
            else serializers.dumps_value(value_type, out.value, serializer=value_serializer)
        )
        return key, value


class ShareAgentService(mode.Service):
    """Starts and stops a :class:`ShareAgent` with the Faust worker (after table recovery)."""

    def __init__(self, agent: ShareAgent, **kwargs: Any) -> None:
        self.agent = agent
        super().__init__(**kwargs)

    @property
    def label(self) -> str:
        return f"ShareAgent: {self.agent.name}"

    async def on_start(self) -> None:
        if self.agent.stopping:
            # A SIGTERM while the worker was still starting (joining its Faust group, say):
            # Faust stopped the agents before it started this service. Nothing was joined, so
            # there is nothing to leave; starting now would crash the shutdown (exit 1).
            return
        await self.agent.start()

    async def on_stop(self) -> None:
        await self.agent.stop()


def _warn_dead_letter_twice(group: str, dead_letter: Any, configs: Mapping[str, str]) -> None:
    """Warn when a share agent's ``dead_letter=`` topic is also its group's dead-letter topic
    (``errors.deadletterqueue.topic.name``): each REJECT of it would land there twice, once
    published by the agent and once written by the leader (docs/guide.md "Dead-letter
    topics")."""
    if dead_letter is None:
        return
    name = dead_letter if isinstance(dead_letter, str) else None
    get_name = getattr(dead_letter, "get_topic_name", None)
    if name is None and callable(get_name):
        name = get_name()
    group_topic = configs.get(DEAD_LETTER_TOPIC, "")
    if name and name == group_topic:
        log.warning(
            "dead_letter_topic_twice",
            group=group,
            topic=name,
            detail=f"the agent's dead_letter= topic is also the group's {DEAD_LETTER_TOPIC}: a "
            "REJECTed record would be in it twice; drop dead_letter= (the group's DLQ gets "
            "every archived record) or use another topic",
        )


def app_group_configs(
    group_configs: Mapping[str, Mapping[str, Any]] | None, settings: ShareGroupSettings
) -> dict[str, dict[str, str]]:
    """Validate an app's per-group configs (``App(group_configs=...)``).

    Raises:
        ConfigurationError: an unknown config or a value out of the broker-level bounds; the
            message names the group, the config, the value and the allowed range.
    """
    out: dict[str, dict[str, str]] = {}
    for group, values in (group_configs or {}).items():
        try:
            out[str(group)] = validate_group_configs(values, settings)
        except ConfigurationError as exc:
            raise ConfigurationError(f"group_configs of share group {group!r}: {exc}") from None
    return out


class ShareGroups:
    """The share-group machinery attached to one Faust app.

    Args:
        app: the Faust app (its ``id`` names the internal topics).
        role: ``all``, ``leader`` or ``member`` (default ``$QUEUEFLOW_ROLE`` or ``all``).
        settings: a :class:`ShareGroupSettings`, or a mapping of overrides (KIP-932 names or
            attribute names); the rest comes from env vars and defaults.
        group_configs: per-group defaults of group configs, ``{"group": {"share.*": value}}``
            (:mod:`queueflow.engine.group_config`); values set with the admin
            (``queueflow configs --alter``) win over them.

    Raises:
        ConfigurationError: an unknown role or an invalid setting.
    """

    def __init__(
        self,
        app: faust.App,
        role: str | None = None,
        settings: ShareGroupSettings | Mapping[str, Any] | None = None,
        group_configs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        role = role or os.environ.get("QUEUEFLOW_ROLE", "all")
        if role not in ROLES:
            raise ConfigurationError(
                f"queueflow role={role!r} (from role= or $QUEUEFLOW_ROLE) is not one of "
                f"{', '.join(ROLES)}"
            )
        self.settings = (
            settings
            if isinstance(settings, ShareGroupSettings)
            else ShareGroupSettings.load(settings)
        )
        self.app = app
        self.role = role
        self.app_id: str = app.conf.id
        self.group_configs = app_group_configs(group_configs, self.settings)
        self.metrics = Metrics()
        self.kafka = KafkaClientConfig.from_broker(
            app.conf.broker,
            client_id=self.app_id,
            replication_factor=int(app.conf.topic_replication_factor),
            extra=credentials_to_kwargs(app.conf.broker_credentials, app.conf.ssl_context),
        )
        # Checked now (a misconfiguration raises here); the warning is logged at start, once the
        # worker's logging is set up.
        self._unauthenticated = check_control_auth(self.settings, self.kafka) == "none"
        # The host's logging is left alone; a Faust worker gets queueflow's set-up: at once when
        # the process is the faust command (it imports the app module, then runs the worker),
        # so that the objects built now log through it, else on Faust's on_worker_init
        # (app.main() sends it after the module that built the app has run).
        if run_by_faust_command():
            qf_logging.configure(self.settings.log_format)
        app.on_worker_init.connect(cast(Any, self._on_worker_init))  # takes **kwargs
        self.member_context = MemberContext.for_kafka(
            self.kafka, self.app_id, self.settings, self.metrics
        )
        self.agents: list[ShareAgent] = []
        self.leaders: dict[str, ShareLeader] = {}
        self._request_topics: dict[str, Any] = {}
        self._tables: dict[str, Any] = {}
        #: Request and coordinator topic name -> its server's junk gate: junk is dropped from
        #: each fetched batch before Faust makes stream events of it (see _drop_junk).
        self._junk_gates: dict[str, JunkGate] = {}
        self.coordinator: ShareGroupCoordinator | None = None
        #: The leaders' direct endpoint (``queueflow.leader.listener``); None on members.
        self.endpoint: LeaderEndpoint | None = None
        #: The Kafka-protocol listener (``queueflow.kafka.listener``), once started.
        self.kafka_listener: Any = None
        self._changelog: ChangelogWriter | None = None  # needs the running loop: see lead()
        #: exactly_once: each leader's reader of its ack topic (started in prepare()).
        self._ack_readers: dict[str, AckReader] = {}
        #: Each leader's DLQ writer (errors.deadletterqueue.topic.name; started in prepare()).
        self._dead_letter_writers: dict[str, DeadLetterWriter] = {}
        self._expose_metrics()
        self._expose_dashboard()
        if role == "member":
            app.producer_only = True
            return
        conf = app.conf
        self._offsets = LogOffsets(self.kafka)
        self._metadata = TopicMetadata(self.kafka)
        self._batches = KafkaBatchFetcher(self.kafka)
        self._runtime = FaustRuntime(app)
        self._recovery_watch = RecoveryWatch(self.settings.recovery_stall_ms)
        # Recovery is started over every RECOVERY_RESTART_MS without progress (_watch_recovery).
        self._recovery_restart_watch = RecoveryWatch(
            min(RECOVERY_RESTART_MS, self.settings.recovery_stall_ms // 2)
        )
        self._recovery_restarts = 0
        self._stopping_stalled = False
        # The fences task's pace (_fences_interval_s): fast until this monotonic ms, woken by
        # an assignment; the stall guard's last run (a long gap is a stall).
        self._fences_settled_ms = 0
        self._fences_wake = asyncio.Event()
        self._guarded_ms: int | None = None
        self.server_context = ServerContext(
            app_id=self.app_id,
            settings=self.settings,
            sender=FaustSender(app),
            runtime=self._runtime,
            log_offsets=self._offsets,
            topic_metadata=self._metadata,
            stall_limit_ms=int(
                (conf.broker_session_timeout + conf.broker_heartbeat_interval) * 1000
            ),
            metrics=self.metrics,
            state_scope=partition_scope,
            flush_state=self._flush_state,
            request_log=LogRangeReader(self.kafka),
            group_configs=self.group_configs,
            key_source=KafkaKeySource(self.kafka),
            batch_source=self._batches,
            direct_ssl=leader_ssl_context(self.settings, self.kafka),
            auth_health=AuthHealth(
                f"{self.app_id}/",
                has_peers=self._has_peers,
                on_mismatch=self._auth_key_mismatch,
            ),
        )
        self.endpoint = (
            LeaderEndpoint(self.server_context, self.leaders)
            if self.settings.leader_listener
            else None
        )
        #: leader_lease_lapsed / _regained, from the stall guard's timer (only with a direct path)
        self._lease_watch = LeaseGate(self.server_context) if self.endpoint is not None else None
        # Partition counts as configured; prepare() reads those of existing topics (which win).
        count = self.settings.coordinator_topic_partitions
        self._coordinator_topic = control_topic(app, topics.coordinator_topic(self.app_id), count)
        self._groups_table = raw_table(app, topics.GROUPS_TABLE, partitions=count)
        self.coordinator = coordinator = ShareGroupCoordinator(
            self.server_context, self._groups_table
        )
        serve(app, self._coordinator_topic, "share-group-coordinator", coordinator.handle)
        self._junk_gates[topics.coordinator_topic(self.app_id)] = coordinator.junk
        self._ticker = LeaderTicker(  # groups with admin requests pending expire those on ticks
            self.server_context, self.leaders, lambda: {*coordinator.groups, *coordinator.pending}
        )
        # Not a Faust timer: idle, it sleeps until a lock is taken or the coordinator is due.
        app.task(self._ticker.run)
        app.timer(STALL_CHECK_INTERVAL_S, name="queueflow-stall-guard")(self._watch_stalls)
        # Fences and announcements are sends: on a timer of their own, so that one blocked
        # across a freeze (or a slow broker) never holds the stall guard back.
        # Not a Faust timer: its pace follows what is going on (_fences_interval_s).
        app.task(self._fences_loop)
        app.timer(PARTITION_CHECK_INTERVAL_S, name="queueflow-partition-watch")(
            self._watch_partitions
        )
        # Faust's signal type wants a ``signal=`` keyword; the receivers take **kwargs.
        app.on_partitions_revoked.connect(cast(Any, self._on_revoked))
        app.on_partitions_assigned.connect(cast(Any, self._on_assigned))

    def _on_worker_init(self, sender: Any, **kwargs: Any) -> None:
        """Faust's ``on_worker_init`` receiver: set up logging (:func:`queueflow.logging.configure`)
        with ``queueflow.log.format``. Sent only in a process run by the ``faust`` command (or
        ``app.main()``), before the worker starts; an app merely built leaves logging as it was."""
        qf_logging.configure(self.settings.log_format)

    @property
    def leads(self) -> bool:
        """True when this worker hosts the coordinator and share-partition leaders."""
        return self.role != "member"

    def _expose_metrics(self) -> None:
        """Serve this app's metrics, with prometheus_client's default registry, at
        ``/metrics``; if the app already has a ``/metrics`` page, feed this app's registry to the
        default registry it most likely serves instead."""
        registry = self.metrics.registry
        if "/metrics" in self.app.web.views:
            prometheus_client.REGISTRY.register(_RegistryCollector(registry))
            return
        app = self.app

        @app.page("/metrics")
        async def metrics_page(web: Any, request: Any) -> Any:
            await self.refresh_log_ends()
            body = render_all(prometheus_client.REGISTRY, registry)
            return app.web.bytes(body, content_type=CONTENT_TYPE.split(";")[0])

    def _expose_dashboard(self) -> None:
        """Serve the share-group dashboard at ``/queueflow/`` and its JSON at
        ``/queueflow/api/groups`` (:mod:`queueflow.dashboard`), unless the app has such pages."""
        app = self.app
        if dashboard.PAGE_PATH in app.web.views or dashboard.API_PATH in app.web.views:
            return
        admin = ShareGroupAdmin(self.app_id, self.kafka, settings=self.settings)
        #: The dashboard's data (read from the changelogs at most once a second).
        self.dashboard = dashboard.DashboardData(admin)
        data = self.dashboard

        @app.page(dashboard.PAGE_PATH)
        async def dashboard_page(web: Any, request: Any) -> Any:
            return web.html(dashboard.page_html())

        @app.page(dashboard.API_PATH)
        async def dashboard_api(web: Any, request: Any) -> Any:
            return web.json(await data.get())

    async def refresh_log_ends(self, timeout_s: float = 1.0) -> None:
        """Refresh the log end offsets of the share-partitions this worker leads (for the lag
        gauges, before a scrape), waiting at most ``timeout_s``; on failure (broker down) the
        last known values stay, and the page is served anyway."""
        for leader in list(self.leaders.values()):
            try:
                await asyncio.wait_for(leader.refresh_log_ends(), timeout_s)
            except Exception as exc:  # a slow or absent broker must not fail the scrape
                log.debug("log_end_refresh_failed", topic=leader.topic, error=repr(exc))

    @refuse_unknown_keywords
    def share_agent(
        self,
        topic: Any,
        *,
        group: str,
        concurrency: int = 1,
        name: str | None = None,
        lock_duration_ms: int | None = None,
        batch: bool = False,
        batch_size: int | None = None,
        handler_timeout_ms: int | None = None,
        sink: Sequence[Any] = (),
        dead_letter: Any = None,
        processing_guarantee: str | None = None,
        ordering: str = "none",
        lazy_records: bool = False,
    ) -> Callable[[Handler], ShareAgent]:
        """Declare a share agent; see :meth:`App.share_agent` (same arguments, same errors).
        The arguments after ``group`` are the fields of :class:`ShareAgentOptions`, checked
        there when the decorator is applied. ``ordering="key"`` makes ``share.ordering=key``
        the app's default group config for ``group`` (:meth:`_order_by_key`)."""

        def decorator(handler: Handler) -> ShareAgent:
            topic_name = topic if isinstance(topic, str) else topic.get_topic_name()
            options = ShareAgentOptions(
                concurrency=concurrency,
                name=name,
                lock_duration_ms=lock_duration_ms,
                batch=batch,
                batch_size=batch_size,
                handler_timeout_ms=handler_timeout_ms,
                sink=sink,
                dead_letter=dead_letter,
                processing_guarantee=processing_guarantee,
                ordering=ordering,
                lazy_records=lazy_records,
            )
            if options.ordering == "key":
                self._order_by_key(group)
            agent = ShareAgent(
                self.member_context,
                handler,
                topic_name,
                group,
                options,
                decode=faust_decoder(self.app, topic),
                encode=FaustEncoder(self.app),
                client_id=f"{self.app_id}:{options.agent_name(handler)}",
            )
            self.agents.append(agent)
            _warn_dead_letter_twice(group, dead_letter, self.group_configs.get(group, {}))
            if self.leads:
                self.lead(topic_name)
            if self.role != "leader":  # started after table recovery
                _compat.add_service(self.app, ShareAgentService(agent))
            return agent

        return decorator

    def _order_by_key(self, group: str) -> None:
        """Make ``share.ordering=key`` the app's default for ``group`` (as
        ``App(group_configs={group: {"share.ordering": "key"}})``; a value set with the admin
        still wins). The coordinator and the leaders read the same mapping.

        Raises:
            ConfigurationError: the app's ``group_configs`` say ``share.ordering=none`` for it.
        """
        configs = self.group_configs.setdefault(group, {})
        if configs.get(ORDERING, "key") != "key":
            raise ConfigurationError(
                f"share agent of group {group!r} with ordering='key', but the app's "
                f"group_configs set {ORDERING}={configs[ORDERING]!r} for it: drop one"
            )
        configs[ORDERING] = "key"

    def lead(self, topic: str) -> ShareLeader | None:
        """Host the share-partition leaders of ``topic`` on this app's leader workers (done
        automatically for every share agent's topic; call it on leader-only apps that don't
        declare the agents)."""
        if not self.leads:
            return None
        if topic not in self.leaders:
            request_topic = control_topic(self.app, topics.request_topic(self.app_id, topic))
            table = raw_table(self.app, topics.state_table(topic), snapshots=True)
            leader = ShareLeader(
                self.server_context, topic, LeaderStateTable(table, self._changelog_writer)
            )
            serve(self.app, request_topic, f"share-leader-{topic}", leader.handle)
            self._junk_gates[leader.request_topic] = leader.junk
            self.leaders[topic] = leader
            self._request_topics[topic] = request_topic
            self._tables[topic] = table
            if self.exactly_once:
                self._ack_readers[topic] = AckReader(leader, self.kafka, self._offsets)
            io = KafkaDeadLetterIO(self.kafka)
            self._dead_letter_writers[topic] = DeadLetterWriter(leader, io)
        return self.leaders[topic]

    async def prepare(self) -> None:
        """Before Faust declares topics: check the source topics exist and co-partition the
        request topics and state tables with them; create the reply topic.

        Raises:
            BrokerError: no broker answered within ``queueflow.broker.wait.ms``.
            ConfigurationError: a source topic does not exist.
        """
        if self._unauthenticated:
            log.warning(
                "control_messages_unauthenticated",
                app=self.app_id,
                detail="queueflow.auth.mode resolves to none: control messages are not signed; "
                "set queueflow.auth.secret on every worker to authenticate them",
            )
        await wait_for_broker(self.kafka, self.settings.broker_wait_ms)
        if self.leaders:
            counts = await partition_counts(self.kafka, list(self.leaders))
            for name in self.leaders:
                request_topic, table = self._request_topics[name], self._tables[name]
                request_topic.partitions = counts[name]
                table.partitions = counts[name]
                table.changelog_topic.partitions = counts[name]
                await retry_unready(request_topic.maybe_declare)
                # Now, not at Faust's table start: see _declare_changelog.
                await self._declare_changelog(table)
        if self.coordinator is not None:
            await self._prepare_coordinator_topic()
        if self.leaders or self.coordinator is not None:  # a member-only worker creates nothing
            await ensure_topic(
                self.kafka,
                topics.reply_topic(self.app_id),
                topics.REPLY_PARTITIONS,
                topics.CONTROL_TOPIC_CONFIG,
            )
        if self.exactly_once:
            await self._prepare_exactly_once()
        for writer in self._dead_letter_writers.values():
            writer.start()
        if self.endpoint is not None and self.leaders:
            await self.endpoint.start()
        await self._start_kafka_listener()

    async def _prepare_coordinator_topic(self) -> None:
        """Size the coordinator topic and the group table (co-partitioned) as the existing
        topics are, else as ``queueflow.coordinator.topic.num.partitions``, and create the
        coordinator topic (:func:`~queueflow.protocol.topics.resolve_coordinator_partitions`;
        docs/architecture.md "Coordinator sharding").

        Raises:
            ConfigurationError: the existing coordinator topic and group changelog differ.
        """
        name = topics.coordinator_topic(self.app_id)
        changelog = topics.groups_changelog(self.app_id)
        existing = await topic_partition_counts(self.kafka, [name, changelog])
        configured = self.settings.coordinator_topic_partitions
        count = topics.resolve_coordinator_partitions(
            self.app_id, configured, existing.get(name), existing.get(changelog)
        )
        if count != configured:
            log.warning(
                "coordinator_partitions_mismatch",
                topic=name,
                partitions=count,
                configured=configured,
                detail="the coordinator topic keeps the partition count it was created with "
                "(as Kafka's offsets.topic.num.partitions): its groups' state is hashed by it. "
                f"This app runs with {count}; queueflow.coordinator.topic.num.partitions="
                f"{configured} applies to a new app id only",
            )
        self._coordinator_topic.partitions = count
        self._groups_table.partitions = count
        self._groups_table.changelog_topic.partitions = count
        self.server_context.coordinator_partitions = count
        log.info("coordinator_partitions", topic=name, partitions=count)
        await retry_unready(self._coordinator_topic.maybe_declare)
        await self._declare_changelog(self._groups_table)

    @staticmethod
    async def _declare_changelog(table: Any) -> None:
        """Create a state table's changelog topic before Faust's consumer first reads the
        cluster's metadata. Faust creates it when the table starts, after the consumer has
        subscribed: a worker whose first metadata came in between did not see the topic for
        minutes (aiokafka refreshes it every ``metadata_max_age_ms``), and as the group's
        leader its assignor left the changelog's partitions unassigned ("Ignoring missing
        topic"), so a worker led a share-partition without recovering its state (seen in
        ``make partition-test``)."""
        await retry_unready(table.changelog_topic.maybe_declare)

    async def _start_kafka_listener(self) -> None:
        """Start the Kafka-protocol listener (``queueflow.kafka.listener``;
        docs/kafka-listener.md) on a worker that leads share-partitions."""
        s = self.settings
        if not s.kafka_listener or not self.leaders or self.kafka_listener is not None:
            return
        try:  # the listener extra: pip install 'queueflow[listener]'
            from queueflow.listener import KafkaListener
            from queueflow.listener.auth import listener_security
            from queueflow.listener.delegated import DelegatedMembership
            from queueflow.listener.members import SessionFactory
        except ImportError as exc:
            raise ConfigurationError(
                f"queueflow.kafka.listener={s.kafka_listener!r} needs kio: "
                f"pip install 'queueflow[listener]' ({exc})"
            ) from None
        ctx = self.member_context
        per_partition = s.kafka_listener_leaders is KafkaListenerLeaders.PARTITION
        # The listener's members heartbeat and ask for tickets as this worker: it authenticated
        # their clients, and a client may join again through another worker's listener with the
        # same member id (a member key would bind the id to the first listener's session).
        worker_auth = ControlAuth.from_settings(s, self.app_id, "kafka-listener")

        async def served() -> dict[str, int]:
            return dict(await partition_counts(self.kafka, list(self.leaders)))

        def sessions(membership: Callable[..., Membership]) -> SessionFactory:
            """Sessions of Kafka-protocol members whose membership ``membership`` builds."""

            def session(
                group: str,
                topic_names: list[str],
                client_id: str,
                on_ack: AcknowledgementCallback,
                *,
                member_id: str,
            ) -> ShareFetchSession:
                return ShareFetchSession(
                    ctx,
                    group,
                    topic_names,
                    client_id,
                    on_acknowledged=on_ack,
                    member_id=member_id,
                    membership=membership,
                )

            return session

        # A member heartbeating here: sealed as the worker, so it can rejoin elsewhere.
        session = sessions(functools.partial(Membership, sealer=worker_auth))

        def delegate(
            group: str,
            topic_names: list[str],
            client_id: str,
            on_ack: AcknowledgementCallback,
            *,
            member_id: str,
        ) -> ShareFetchSession:
            # A member heartbeating to another listener, acted for with its ticket.
            assert self.kafka_listener is not None
            membership = functools.partial(
                DelegatedMembership,
                worker_auth=worker_auth,
                requester_name=self.kafka_listener.advertised_address,
            )
            return sessions(membership)(group, topic_names, client_id, on_ack, member_id=member_id)

        self.kafka_listener = KafkaListener(
            s.kafka_listener,
            s.leader_advertised_host or "127.0.0.1",
            self.app_id,
            served,
            session,
            ShareGroupAdmin(self.app_id, self.kafka, settings=s),
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            session_timeout_ms=s.session_timeout_ms,
            limits=DirectLimits.from_settings(s),
            max_connections=s.direct_max_connections,
            monotonic=ctx.clock.monotonic,
            security=listener_security(s, self.kafka),
            leaders=self._kafka_leaders if per_partition else None,
            delegate=delegate if per_partition else None,
            coordinators=self._kafka_coordinator,
        )
        await self.kafka_listener.start()
        if self.endpoint is not None:  # announced with the leaders' direct endpoint
            self.endpoint.advertise_kafka_listener(self.kafka_listener.advertised_address)
            if self.coordinator is not None:
                self.endpoint.coordinator_partitions = self.coordinator.live_partitions

    def _kafka_coordinator(self, group: str) -> str | None:
        """``host:port`` of the Kafka-protocol listener of the worker serving ``group``'s
        coordinator partition: this one's when it does, else as announced (None: unknown)."""
        coordinator, listener = self.coordinator, self.kafka_listener
        if coordinator is None or listener is None:
            return None
        partition = self.server_context.coordinator_partition(group)
        if partition in dict(coordinator.live_partitions()):
            return str(listener.advertised_address)
        return coordinator.kafka_coordinator(group, self.member_context.clock.now_ms())

    def _kafka_leaders(
        self,
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, tuple[int, str]]]:
        """Who leads what for the Kafka-protocol listener: the share-partitions this worker is
        live on (with its leader epoch), and the other leaders' listeners as their
        announcements reached this worker's coordinator (none when it coordinates no
        partition: those share-partitions are then served here, as by a gateway)."""
        local = {
            TopicPartition(topic, p): leader.fencing.partitions[p].epoch
            for topic, leader in self.leaders.items()
            for p in list(leader.fencing.partitions)
            if leader.fencing.is_live(p)
        }
        known = (
            {}
            if self.coordinator is None
            else self.coordinator.kafka_leaders(self.member_context.clock.now_ms())
        )
        remote = {TopicPartition(t, p): where for (t, p), where in known.items()}
        return local, remote

    @property
    def exactly_once(self) -> bool:
        """``queueflow.processing.guarantee=exactly_once`` (docs/architecture.md
        "Exactly-once: transactional acknowledgements")."""
        return self.settings.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE

    async def _prepare_exactly_once(self) -> None:
        """Create the ack topics (co-partitioned with their source topics, configured as the
        request topics), check this worker can run transactions (one that runs share agents)
        and read the ack topics (a leader), and start the ack readers.

        Raises:
            ConfigurationError: naming the missing ACL or broker setting.
        """
        s = self.settings
        if self.role != "leader":
            await check_transactions(self.kafka, self.app_id, s.transaction_timeout_ms)
        if not self.leaders:
            return
        counts = await partition_counts(self.kafka, list(self.leaders))
        ack_topics = [topics.ack_topic(self.app_id, name) for name in self.leaders]
        for name, ack_topic in zip(self.leaders, ack_topics, strict=True):
            await ensure_topic(self.kafka, ack_topic, counts[name], topics.CONTROL_TOPIC_CONFIG)
        await check_ack_topics_readable(
            self.kafka,
            {ack: counts[name] for name, ack in zip(self.leaders, ack_topics, strict=True)},
        )
        for reader in self._ack_readers.values():
            await reader.start()

    @property
    def _changelog_writer(self) -> ChangelogWriter:
        if self._changelog is None:
            self._changelog = ChangelogWriter(self.app, self._runtime.ownership)
        return self._changelog

    async def _flush_state(self) -> None:
        await self._changelog_writer.flush()

    async def stop_agents(self) -> None:
        """Stop the share agents (drain, flush outcomes, leave the group). Call it before
        Faust's ``App.on_stop``, which stops the consumer first: in an ``all`` worker the
        leave is answered by this worker's own coordinator, which needs it."""
        for agent in self.agents:
            await agent.stop()

    async def close(self) -> None:
        """Close the leaders' endpoint, ack readers and metadata clients."""
        for reader in self._ack_readers.values():
            await reader.stop()
        for leader in self.leaders.values():
            await leader.keys.close()
            if leader.fetcher.holes is not None:
                await leader.fetcher.holes.close()
        for writer in self._dead_letter_writers.values():
            await writer.stop()
        if self.kafka_listener is not None:
            await self.kafka_listener.close()
            self.kafka_listener = None
        if self.leads:
            if self.endpoint is not None:
                await self.endpoint.close()
            await self._offsets.close()
            await self._metadata.close()
            await self._batches.close()

    async def _on_assigned(self, sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        self._fences_unsettled(self._check_stalls())  # a stall is seen before partitions move
        epoch = self.app.consumer_generation_id
        self._runtime.watch_heartbeats()
        _compat.filter_consumer_records(self.app, self._drop_junk, "queueflow-junk")
        for topic, leader in self.leaders.items():
            name = self._request_topics[topic].get_topic_name()
            led = {tp.partition for tp in assigned if tp.topic == name}
            leader.assign(self._with_state(self._tables[topic], name, led, epoch), epoch)
        if self.coordinator is not None:  # the coordinator epoch: see engine.fencing
            name = self._coordinator_topic.get_topic_name()
            owned = {tp.partition for tp in assigned if tp.topic == name}
            self.coordinator.assign(self._with_state(self._groups_table, name, owned, epoch), epoch)

    @staticmethod
    def _with_state(table: Any, topic: str, partitions: set[int], epoch: int) -> set[int]:
        """The ``partitions`` of control topic ``topic`` (a request or the coordinator topic)
        this worker may serve: those whose partition of ``table``'s changelog Faust assigned it
        as active too (so its table recovery reads their state). Any other is left unserved
        (``leader_state_unassigned``) until the next rebalance: served from an unrecovered
        store, a share-partition would hand its records out again from the start, a group
        would lose its members and assignments."""
        state = _compat.active_changelog_partitions(table)
        missing = partitions - state
        if missing:
            log.error(
                "leader_state_unassigned",
                topic=topic,
                partitions=sorted(missing),
                generation=epoch,
                changelog=table.changelog_topic.get_topic_name(),
                detail="Faust assigned this worker these partitions without their state "
                "changelog partitions (did the group leader's metadata lack the changelog "
                "topic? 'Ignoring missing topic' in its log); they are not served until the "
                "next rebalance",
            )
        return partitions & state

    def _drop_junk(self, tp: Any, records: list[Any]) -> list[Any]:
        """The records of a fetched batch of ``tp`` to make stream events of: on a request or
        the coordinator topic, junk by its first bytes is dropped, counted and logged here
        (:meth:`~queueflow.server.junk.JunkGate.keep`), so that a flood costs a few hundred ns
        a record rather than Faust's per-event work (docs/operations.md "Junk floods, quotas
        and ACLs"). Faust commits past the dropped offsets with the next record it processes;
        what it re-delivers after a restart is dropped again."""
        gate = self._junk_gates.get(tp.topic)
        if gate is None:
            return records
        try:
            return gate.keep(tp.partition, records)
        except Exception:  # never stop Faust's consumer: the agents drop junk one by one
            log.exception("junk_filter_failed", topic=tp.topic, partition=tp.partition)
            return records

    async def _watch_partitions(self) -> None:
        """Partitions added to a source topic at runtime (``kafka-topics.sh --alter
        --partitions``): grow its changelog and request topic to match (co-partitioned), and
        make Faust's consumer see it now rather than at its next metadata refresh (5 min), so
        that Faust rebalances and a worker leads the new partitions. Share groups notice on
        their members' next heartbeats; the new share-partitions start at the log start."""
        if not self.leaders:
            return
        try:
            counts = await self._metadata.partition_counts(list(self.leaders))
            grown = {
                name: count
                for name, count in counts.items()
                if count > (self._request_topics[name].partitions or 0)
            }
            for name, count in grown.items():
                request_topic, table = self._request_topics[name], self._tables[name]
                # The changelog first: a rebalance in between leaves a changelog partition
                # without a request partition for a moment, never the other way round.
                await ensure_partitions(self.kafka, table.changelog_topic.get_topic_name(), count)
                if self.exactly_once:  # before the request topic: as the changelog
                    ack_topic = topics.ack_topic(self.app_id, name)
                    await ensure_partitions(self.kafka, ack_topic, count)
                await ensure_partitions(self.kafka, request_topic.get_topic_name(), count)
                old = request_topic.partitions
                request_topic.partitions = table.partitions = count
                table.changelog_topic.partitions = count
                log.info("source_partitions_added", topic=name, partitions=count, before=old)
            if grown:
                await self._refresh_consumer_metadata()
        except Exception as exc:  # the broker may be restarting: try again next time
            log.warning("partition_watch_failed", error=repr(exc))

    async def _refresh_consumer_metadata(self) -> None:
        """Make Faust's consumer fetch metadata now: a change of its topics' partition counts
        makes it rejoin the group (aiokafka), so Faust rebalances over the new partitions."""
        await _compat.refresh_consumer_metadata(self.app)

    async def _watch_stalls(self) -> None:
        previous, now = self._guarded_ms, self._check_stalls()
        self._guarded_ms = now
        if previous is not None and now - previous > 10 * STALL_CHECK_INTERVAL_S * 1000:  # held
            self._fences_unsettled(now)
        await self._watch_recovery(now)

    def _check_stalls(self) -> int:
        """The stall guard of the leaders and the coordinator (no I/O); returns the monotonic
        time (ms) it checked at."""
        now = monotonic_ms(self.server_context.clock)
        for leader in list(self.leaders.values()):
            leader.check_stalls(now)
        if self.coordinator is not None:
            self.coordinator.check_stalls(now)
        if self._lease_watch is not None and self.leaders:
            self._lease_watch.watch(self._live_partitions)
        return now

    def _live_partitions(self) -> dict[str, list[int]]:
        """The request partitions this worker is live on, per source topic."""
        return {
            topic: [p for p in leader.fencing.partitions if leader.fencing.is_live(p)]
            for topic, leader in self.leaders.items()
        }

    async def _fences_loop(self) -> None:
        """Send the fences due and the endpoint's announcements, at the stall guard's pace
        while something moves and every :data:`FENCES_IDLE_INTERVAL_S` otherwise."""
        while True:
            await self._send_fences()
            interval = self._fences_interval_s()
            if interval <= STALL_CHECK_INTERVAL_S:
                await asyncio.sleep(interval)
                continue
            self._fences_wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._fences_wake.wait(), interval)

    def _fences_interval_s(self) -> float:
        """How long (s) the fences task waits before its next round (see
        :data:`FENCES_IDLE_INTERVAL_S`)."""
        runtime = self._runtime
        moving = (
            monotonic_ms(self.server_context.clock) < self._fences_settled_ms
            or runtime.rebalancing
            or not runtime.streams_active
            or any(
                not leader.fencing.is_live(p)
                for leader in self.leaders.values()
                for p in leader.fencing.partitions
            )
        )
        return STALL_CHECK_INTERVAL_S if moving else FENCES_IDLE_INTERVAL_S

    def _fences_unsettled(self, now_ms: int) -> None:
        """Something moved (assignment, revocation, stall): the fences task keeps the stall
        guard's pace for :data:`FENCES_SETTLE_S` and runs now."""
        self._fences_settled_ms = now_ms + int(FENCES_SETTLE_S * 1000)
        self._fences_wake.set()

    async def _send_fences(self) -> None:
        for leader in list(self.leaders.values()):
            await leader.send_fences()
        if self.coordinator is not None:
            await self.coordinator.send_fences()
        if self.endpoint is not None:
            await self.endpoint.announce()

    async def _watch_recovery(self, now: int) -> None:
        """Start Faust's table recovery over whenever it has made no progress for
        :data:`RECOVERY_RESTART_MS` (or half of ``queueflow.leader.recovery.stall.ms``, if
        shorter), and stop the worker when it has made none for all of
        ``queueflow.leader.recovery.stall.ms`` (see :class:`RecoveryWatch`): it would keep its
        partitions and serve nothing; stopped, its partitions move to another worker."""
        recovering, remaining = _compat.table_recovery(self.app)
        stuck = self._recovery_restart_watch.check(recovering, remaining, now)
        if stuck is None:
            if not recovering:
                self._recovery_restarts = 0
        elif not self._stopping_stalled:
            # Faust's recovery has been seen to wait for good for changelog records its
            # consumer never delivered (CI on 3.9.1; in make partition-test a changelog first
            # assigned late, see _declare_changelog); started over, it read them in a second.
            self._recovery_restarts += 1
            self._recovery_restart_watch.rearm(now)
            log.warning(
                "leader_recovery_restarted",
                stalled_ms=stuck,
                remaining=remaining,
                restarts=self._recovery_restarts,
                note="Faust's table recovery made no progress: starting it over; the worker "
                "stops if it still makes none by queueflow.leader.recovery.stall.ms",
            )
            _compat.restart_table_recovery(self.app)
        stalled = self._recovery_watch.check(recovering, remaining, now)
        if stalled is None or self._stopping_stalled:
            return
        self._stopping_stalled = True  # once: the stall guard goes on ticking while it stops
        reason = RuntimeError(
            f"table recovery made no progress for {stalled} ms with {remaining} changelog "
            "records left (queueflow.leader.recovery.stall.ms); restart the worker"
        )
        log.error(
            "leader_recovery_stalled",
            stalled_ms=stalled,
            remaining=remaining,
            error=str(reason),
            note="Faust's table recovery made no progress: stopping this worker so that its "
            "partitions move to another; restart it",
        )
        await self._stop_failed(reason)

    def _has_peers(self) -> bool:
        """Another worker of the app holds some of its control partitions (the coordinator
        topic's, the request topics'): this one is not alone."""
        controls = [(self._coordinator_topic, self.server_context.coordinator_partitions)]
        controls += [(t, t.partitions or 0) for t in self._request_topics.values()]
        wanted = {
            TopicPartition(topic.get_topic_name(), p)
            for topic, count in controls
            for p in range(count)
        }
        return not wanted <= self._runtime.assigned()

    def _auth_key_mismatch(self, evidence: str) -> None:
        """This worker's key differs from its peers' (:mod:`queueflow.server.auth_health`):
        say so and stop the worker, non-zero, so that its partitions move to the others."""
        log.error(
            "auth_key_mismatch",
            evidence=evidence,
            note="this worker's queueflow.auth.secret differs from the other workers' and "
            "members': it can verify none of their messages and they none of its own. "
            "Stopping it so that its partitions move to the other workers; give it the "
            "app's secret and restart it",
        )
        self._key_mismatch_stop = asyncio.ensure_future(
            self._stop_failed(
                RuntimeError(
                    "queueflow.auth.secret differs from the other workers' and members' (see "
                    "the auth_key_mismatch log line); give this worker the app's secret"
                )
            )
        )

    async def _stop_failed(self, reason: BaseException) -> None:
        """Stop this worker so that it exits non-zero with ``reason`` (a supervisor restarts
        it). Marked failed, the SIGTERM stops it gracefully (its offsets committed, its group
        left: its partitions move at once). A crash would stop the consumer thread before the
        stop's commit, which then waits for it for good (seen in CI: the worker never exited)."""
        if not _compat.mark_worker_failed(self.app, reason):
            await self.app.crash(reason)
        os.kill(os.getpid(), signal.SIGTERM)

    async def _on_revoked(self, sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        # Woken from a pause longer than the session, the consumer thread's revocation can
        # reach this loop before the stall guard's timer: step down for the stall first.
        self._fences_unsettled(self._check_stalls())
        # Lapsed before the rebalance began: a successor may have served them (engine.fencing).
        lease_held = lease_allows(self._runtime.lease_remaining_ms())
        self._runtime.lease.reset()  # the next generation proves itself by a heartbeat
        for topic, leader in self.leaders.items():
            name = self._request_topics[topic].get_topic_name()
            leader.revoke({tp.partition for tp in revoked if tp.topic == name}, lease_held)
        if self.coordinator is not None:
            name = self._coordinator_topic.get_topic_name()
            self.coordinator.revoke({tp.partition for tp in revoked if tp.topic == name})


def run_by_faust_command() -> bool:
    """True when this process's program is Faust's command line (``faust -A app worker`` or
    ``python -m faust -A app worker``): the process is a Faust worker (or another Faust command)
    of the app being built, not a host that imports queueflow."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name == "faust.__main__":
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "faust"


class _RegistryCollector:
    """Collects another registry's metrics (to show them on an existing ``/metrics`` page)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Any:
        return self.registry.collect()


class App(faust.App):
    """A Faust app with share groups (KIP-932) on any Kafka cluster.

    Args:
        id: the app id; it names the Faust consumer group of the leaders and every internal
            topic.
        role: ``all`` | ``leader`` | ``member`` (default ``$QUEUEFLOW_ROLE`` or ``all``).
        share_settings: share-group settings overrides, by KIP-932 name or attribute name.
        group_configs: per-group configs, ``{"group": {"share.delivery.count.limit": 3}}``
            (``share.auto.offset.reset``, ``share.record.lock.duration.ms``,
            ``share.delivery.count.limit``, ``share.partition.max.record.locks``,
            ``share.session.timeout.ms``, ``share.heartbeat.interval.ms``), checked against the
            broker-level bounds; values set with ``queueflow configs --alter`` win over them.
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
        group_configs: Mapping[str, Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        warn_unknown_faust_options(type(self), id, kwargs)
        kwargs.setdefault("store", "rocksdb://")
        for name, value in LEADER_GROUP_DEFAULTS.items():
            if name.upper() not in os.environ:
                kwargs.setdefault(name, value)
        super().__init__(id, **kwargs)
        self.share_groups = ShareGroups(
            self, role=role, settings=share_settings, group_configs=group_configs
        )

    @refuse_unknown_keywords
    def share_agent(
        self,
        topic: Any,
        *,
        group: str,
        concurrency: int = 1,
        name: str | None = None,
        lock_duration_ms: int | None = None,
        batch: bool = False,
        batch_size: int | None = None,
        handler_timeout_ms: int | None = None,
        sink: Sequence[Any] = (),
        dead_letter: Any = None,
        processing_guarantee: str | None = None,
        ordering: str = "none",
        lazy_records: bool = False,
    ) -> Callable[[Handler], ShareAgent]:
        """Declare a share agent: ``handler(record)`` runs once per delivery of each record
        (with ``batch=True``, ``handler(records)`` once per batch of deliveries).

        Args:
            topic: the source topic (``app.topic(...)`` or a name).
            group: the share group id.
            concurrency: handler tasks per worker process (with ``batch=True``: batches
                handled at once).
            name: agent name (defaults to the handler's qualified name).
            lock_duration_ms: this member's acquisition lock duration in ms (KIP-932 allows a
                consumer its own, up to ``group.share.max.record.lock.duration.ms``).
            batch: the handler is ``async def handler(records: list[ShareRecord])`` and gets
                the records of one ShareFetch; it returns one outcome per record, in order
                (``ACCEPT``/``RELEASE``/``REJECT``/``None``), or one outcome for all of them. A
                raise, or any other return value, RELEASEs every record of the batch (see
                :mod:`queueflow.member.agent` and docs/guide.md "Batch handlers").
            batch_size: with ``batch=True``, the most records per handler call (``None``: a
                whole ShareFetch, at most ``max.poll.records``).
            handler_timeout_ms: a call still running this many ms after it started is
                cancelled and its records RELEASEd; ``None``: only just before their acquisition
                lock expires (which applies in any case; :mod:`queueflow.member.agent`).
            ordering: ``"key"``: key-ordered sharing (docs/concepts.md "Key-ordered
                sharing"): records with the same key are never handled at two members at
                once and are handled in offset order; different keys spread over all members.
                Sets the group config ``share.ordering=key`` as the app's default for
                ``group``.
            lazy_records: with ``batch=True``, the records are lazy views: key, value and
                headers are decoded from the fetched batch only when the handler first
                touches one (docs/performance.md "Lazy record views"; pays for a handler
                that reads offsets only, costs more for one that reads every value).

        Returns:
            A decorator; the decorated name becomes the :class:`ShareAgent`.

        Raises:
            ConfigurationError: concurrency < 1, batch_size < 1 or without ``batch=True``,
                handler_timeout_ms < 1, an unknown processing_guarantee, or a lock duration
                out of range (the checks of
                :class:`~queueflow.member.agent.ShareAgentOptions`, whose fields the arguments
                after ``group`` are).
        """
        return self.share_groups.share_agent(
            topic,
            group=group,
            concurrency=concurrency,
            name=name,
            lock_duration_ms=lock_duration_ms,
            batch=batch,
            batch_size=batch_size,
            handler_timeout_ms=handler_timeout_ms,
            sink=sink,
            dead_letter=dead_letter,
            processing_guarantee=processing_guarantee,
            ordering=ordering,
            lazy_records=lazy_records,
        )

    async def on_first_start(self) -> None:
        await super().on_first_start()
        await self.share_groups.prepare()

    async def on_stop(self) -> None:
        await self.share_groups.stop_agents()  # while the coordinator still consumes
        await self.share_groups.close()
        await super().on_stop()


@refuse_unknown_keywords
def attach(
    app: faust.App,
    role: str | None = None,
    settings: ShareGroupSettings | Mapping[str, Any] | None = None,
    group_configs: Mapping[str, Mapping[str, Any]] | None = None,
) -> ShareGroups:
    """Add share groups to an existing :class:`faust.App`.

    Call it before the worker starts and declare agents with ``groups.share_agent(...)``.
    See docs/guide.md "Existing Faust apps".

    Returns:
        The :class:`ShareGroups` whose ``share_agent`` decorator declares agents.

    Raises:
        ConfigurationError: an unknown role or an invalid setting.
    """
    groups = ShareGroups(app, role=role, settings=settings, group_configs=group_configs)
    original = app.on_first_start

    async def on_first_start() -> None:  # before Faust declares and subscribes topics
        await original()
        await groups.prepare()

    app.on_first_start = on_first_start  # type: ignore[method-assign]
    original_stop = app.on_stop

    async def on_stop() -> None:  # Faust's on_stop stops the consumer first
        await groups.stop_agents()
        await groups.close()
        await original_stop()

    app.on_stop = on_stop  # type: ignore[method-assign]
    return groups
