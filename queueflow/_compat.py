"""The one place queueflow uses private or undocumented APIs of faust-streaming and aiokafka.

Everything here reaches past a library's public interface; nothing else in queueflow does
(``tests/unit/test_compat.py`` walks the AST of every module and fails on a private Faust, mode
or aiokafka name outside this module). Each function is small and names the internal it uses;
each internal has a canary test in ``tests/unit/test_compat.py`` that fails, naming the internal
and the installed version, when an upgrade removes or changes it. :data:`TESTED` gives the
version ranges those canaries cover; pyproject.toml pins the dependencies to them.

Layering: this module sits below ``queueflow.kafka`` (the kafka layer and the developer tools
use the admin-client functions), so it imports neither Faust nor mode at module level: the
objects come in as arguments. The single exception is :func:`current_event_scope`, which needs
the context variable of ``faust.streams`` and imports it when called (that one edge is listed
in the import contracts' ``ignore_imports``).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextvars import ContextVar
from typing import Any

__all__ = [
    "TESTED",
    "add_service",
    "admin_send_request",
    "admin_send_to_controller",
    "current_event_scope",
    "filter_consumer_records",
    "group_coordinator",
    "on_heartbeat_ok",
    "refresh_consumer_metadata",
    "refresh_producer_metadata",
    "set_persisted_offset",
    "table_recovery",
    "table_store",
]

#: Distribution → the version range the canary tests cover (pyproject.toml pins the same).
TESTED: dict[str, str] = {
    "faust-streaming": ">=0.15.3,<0.16",
    "aiokafka": ">=0.14.0,<0.15",
}

#: ``callback(generation, sent_ms)`` of :func:`on_heartbeat_ok`.
HeartbeatCallback = Callable[[int, int], None]


# --- aiokafka, through Faust's consumer and producer -------------------------------------------


def group_coordinator(app: Any) -> Any:
    """The aiokafka ``GroupCoordinator`` of a Faust app's consumer.

    Uses ``faust.transport.drivers.aiokafka.Consumer._thread`` (the consumer thread),
    ``AIOKafkaConsumerThread._ensure_consumer()`` and ``AIOKafkaConsumer._coordinator``.

    Args:
        app: a started :class:`faust.App` whose consumer has joined its group (e.g. in an
            ``on_partitions_assigned`` receiver).

    Raises:
        faust.exceptions.ConsumerNotStarted: the consumer thread has no consumer yet.
    """
    return app.consumer._thread._ensure_consumer()._coordinator


def on_heartbeat_ok(coordinator: Any, callback: HeartbeatCallback) -> None:
    """Call ``callback(generation, sent_ms)`` after every heartbeat the broker accepted.

    Wraps aiokafka's ``GroupCoordinator._do_heartbeat`` (a coroutine that sends one
    HeartbeatRequest and returns True when the broker still knows the member). It runs in
    Faust's consumer thread, so ``callback`` must be thread-safe (e.g. replace one tuple).
    ``generation`` is the coordinator's generation when the heartbeat was sent and ``sent_ms``
    the :func:`time.monotonic` time of sending, in ms. Wrap a coordinator once.

    Args:
        coordinator: from :func:`group_coordinator`.
        callback: called with (generation, sent_ms) for each OK heartbeat.
    """
    original: Callable[[], Awaitable[bool]] = coordinator._do_heartbeat

    async def do_heartbeat() -> bool:
        generation = int(coordinator.generation)
        sent_ms = int(time.monotonic() * 1000)
        ok = bool(await original())
        if ok:
            callback(generation, sent_ms)
        return ok

    coordinator._do_heartbeat = do_heartbeat


async def refresh_producer_metadata(app: Any) -> None:
    """Fetch the cluster metadata of a Faust app's producer now (e.g. after partitions were
    added: aiokafka refuses to send to a partition its metadata does not know).

    Uses ``faust.transport.drivers.aiokafka.Producer._ensure_producer()`` and
    ``AIOKafkaProducer.client.force_metadata_update()``.

    Raises:
        faust.exceptions.NotReady: the producer has not started.
    """
    await app.producer._ensure_producer().client.force_metadata_update()


async def refresh_consumer_metadata(app: Any) -> bool:
    """Make a Faust app's consumer fetch cluster metadata now (a change of its topics'
    partition counts then makes it rejoin its group, so Faust rebalances).

    Uses ``Consumer._thread``, ``AIOKafkaConsumerThread._ensure_consumer()``,
    ``AIOKafkaConsumer._client`` and mode's ``ServiceThread.call_thread`` (the client belongs
    to the consumer thread's event loop).

    Returns:
        False when the consumer has no consumer thread (nothing done), else True.

    Raises:
        faust.exceptions.ConsumerNotStarted: the consumer thread has no consumer yet.
    """
    thread = getattr(app.consumer, "_thread", None)
    if thread is None:
        return False
    client = thread._ensure_consumer()._client
    await thread.call_thread(client.force_metadata_update)
    return True


# --- Faust: stream events, tables, services ---------------------------------------------------


@contextlib.contextmanager
def current_event_scope(event: object) -> Iterator[object]:
    """Within the block, ``faust.streams.current_event()`` returns ``event`` (current task
    only): Faust's tables and stores pick the partition of a read or write from
    ``current_event().message.topic`` / ``.partition``.

    Sets and resets ``faust.streams._current_event`` (a :class:`contextvars.ContextVar` of a
    weak reference to the event); ``event`` must accept weak references and stay referenced
    for the duration of the block.
    """
    import faust.streams  # the one Faust import of this module (see the module docstring)

    var: ContextVar[Any] = faust.streams._current_event  # of weakref.ref[EventT]: a stand-in
    token = var.set(weakref.ref(event))
    try:
        yield event
    finally:
        var.reset(token)


def table_store(table: Any) -> MutableMapping[Any, Any]:
    """The store of a Faust table, read and written directly: no changelog record, no buffer,
    no stream event required for reads (a write to a RocksDB store still needs a current event,
    see :func:`current_event_scope`, to pick the partition).

    Uses ``faust.tables.base.Collection.data`` (the ``Store`` behind the table).
    """
    store: MutableMapping[Any, Any] = table.data
    return store


def set_persisted_offset(table: Any, tp: Any, offset: int) -> None:
    """Record in ``table``'s store that its changelog partition ``tp`` is durable up to
    ``offset`` (table recovery starts after it), as Faust's own changelog callback does.

    Uses ``faust.stores.base.Store.set_persisted_offset(tp, offset)``.

    Args:
        table: a Faust table.
        tp: the changelog partition (aiokafka's ``TopicPartition`` from the send's metadata).
        offset: the offset of the record the broker acknowledged.
    """
    table.data.set_persisted_offset(tp, offset)


def add_service(app: Any, service: Any) -> None:
    """Start ``service`` (a :class:`mode.Service` instance) with a Faust app's worker, after
    table recovery, and stop it with the worker.

    Uses ``faust.App._extra_services`` (what ``@app.service`` fills with classes; Faust starts
    instances in it as they are).
    """
    app._extra_services.append(service)


def table_recovery(app: Any) -> tuple[bool, int]:
    """Whether a Faust app's table recovery is in progress, and how many changelog records its
    active tables have still to read (0 when not recovering).

    Uses ``app.tables.recovery`` (``faust.tables.manager.TableManager.recovery``, not in
    ``TableManagerT``), ``Recovery.in_recovery`` and ``Recovery.active_remaining_total()``.
    """
    recovery = app.tables.recovery
    if not recovery.in_recovery:
        return False, 0
    return True, int(recovery.active_remaining_total())


def filter_consumer_records(
    app: Any, keep: Callable[[Any, list[Any]], list[Any]], marker: str
) -> bool:
    """Make a Faust app's consumer pass each fetched batch through ``keep(tp, records)`` (the
    records it returns go on to the agents; the others are never turned into events). Idempotent
    per ``marker``; False if the consumer does not exist yet.

    Uses ``faust.transport.consumer.Consumer.scheduler`` (the instance of the
    ``ConsumerScheduler`` setting, a public extension point, whose ``iterate(records)`` Faust
    calls with each fetched ``{tp: [ConsumerRecord, ...]}``) and ``app._consumer`` (so that the
    consumer is not created early). Faust commits past the offsets ``keep`` leaves out as gaps
    once a later record of the partition is processed (``Consumer._add_gap``).
    """
    consumer = app._consumer
    if consumer is None:
        return False
    scheduler = consumer.scheduler
    if getattr(scheduler, "queueflow_marker", None) == marker:
        return True
    consumer.scheduler = _FilteringScheduler(scheduler, keep, marker)
    return True


class _FilteringScheduler:
    """A Faust ``SchedulingStrategyT`` that drops records before delegating (see
    :func:`filter_consumer_records`)."""

    def __init__(
        self, inner: Any, keep: Callable[[Any, list[Any]], list[Any]], marker: str
    ) -> None:
        self.inner = inner
        self.keep = keep
        self.queueflow_marker = marker

    def iterate(self, records: Any) -> Any:
        keep = self.keep
        return self.inner.iterate({tp: keep(tp, batch) for tp, batch in records.items()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# --- aiokafka's admin client -----------------------------------------------------------------


async def admin_send_request(admin: Any, request: Any) -> Any:
    """Send a protocol ``request`` (``aiokafka.protocol`` class) to any broker through a
    started ``AIOKafkaAdminClient`` and return its response (requests the admin client has no
    method for, e.g. a MetadataRequest that must not auto-create topics).

    Uses ``AIOKafkaAdminClient._send_request(request)``.

    Raises:
        aiokafka.errors.KafkaError: the request failed.
    """
    return await admin._send_request(request)


async def admin_send_to_controller(admin: Any, request: Any) -> Any:
    """Send a protocol ``request`` to the cluster's controller through a started
    ``AIOKafkaAdminClient`` and return its response (e.g. CreateAcls).

    Uses ``AIOKafkaAdminClient._send_to_controller(request)``.

    Raises:
        aiokafka.errors.KafkaError: the request failed.
    """
    return await admin._send_to_controller(request)
