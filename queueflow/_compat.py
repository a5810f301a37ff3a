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
    "active_changelog_partitions",
    "add_service",
    "admin_send_request",
    "admin_send_to_controller",
    "clear_store_partition",
    "current_event_scope",
    "filter_consumer_records",
    "group_coordinator",
    "mark_worker_failed",
    "on_heartbeat_ok",
    "raw_records",
    "refresh_consumer_metadata",
    "refresh_producer_metadata",
    "set_persisted_offset",
    "store_partition_get",
    "table_recovery",
    "table_store",
    "tolerate_undecodable_records",
    "undecodable_records",
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


def active_changelog_partitions(table: Any) -> set[int]:
    """The partitions of a Faust table's changelog that the app's current assignment makes
    this worker the active (not standby) owner of.

    Uses ``app.assignor.assigned_actives()`` (Faust's ``PartitionAssignor``, the set of
    ``TP`` it assigned as active) and ``Collection.changelog_topic_name``.
    """
    name = table.changelog_topic_name
    return {tp.partition for tp in table.app.assignor.assigned_actives() if tp.topic == name}


def clear_store_partition(table: Any, partition: int) -> int:
    """Empty the local store of a table's changelog ``partition`` (its persisted offset
    included, so that Faust's table recovery reads the changelog from its start), and make
    Faust's recovery forget how far it had read that partition. Returns the keys deleted.

    Call it from ``Table.on_rebalance``, before Faust's ``Recovery.on_rebalance`` sets the
    partition's start offset (``Recovery._add`` keeps an existing ``active_offsets`` entry
    when the store has no persisted offset). Uses the RocksDB store's ``_db_for_partition``
    (a ``rocksdict.Rdict``, raw mode: ``keys()``, ``delete``) and ``_key_index`` (its key to
    partition cache), and ``app.tables.recovery.active_offsets`` / ``standby_offsets``.
    """
    store = table.data
    open_partition = getattr(store, "_db_for_partition", None)
    if open_partition is None:  # an in-memory store: rebuilt from the changelog anyway
        return 0
    db = open_partition(partition)
    keys = list(db.keys())
    for key in keys:
        db.delete(key)
    store._key_index.clear()
    # Faust's TP and aiokafka's TopicPartition are named tuples: a plain tuple finds either.
    table.app.tables.recovery.active_offsets.pop((table.changelog_topic_name, partition), None)
    return len(keys)


def store_partition_get(table: Any, partition: int, key: bytes) -> bytes | None:
    """The value of ``key`` in the local store of a table's changelog ``partition`` (None:
    absent), read directly, as :meth:`Store.apply_changelog_batch` writes it.

    Uses the RocksDB store's ``_db_for_partition`` (``faust.stores.rocksdb.Store``).
    """
    open_partition = getattr(table.data, "_db_for_partition", None)
    if open_partition is None:  # an in-memory store
        return None
    value: bytes | None = open_partition(partition).get(key)
    return value


def add_service(app: Any, service: Any) -> None:
    """Start ``service`` (a :class:`mode.Service` instance) with a Faust app's worker, after
    table recovery, and stop it with the worker.

    Uses ``faust.App._extra_services`` (what ``@app.service`` fills with classes; Faust starts
    instances in it as they are).
    """
    app._extra_services.append(service)


def mark_worker_failed(app: Any, reason: BaseException) -> bool:
    """Make the Faust worker that runs ``app`` exit non-zero (raising ``reason``) once it has
    stopped, without crashing its services: stop it then (SIGTERM) and it stops gracefully,
    committing its offsets and leaving its group, so its partitions move at once.

    ``app.crash(reason)`` marks every service crashed instead, the consumer thread included:
    a stop that must still commit offsets then waits for that thread for good.

    Uses mode's beacon tree (``app.beacon.root.data`` is the ``mode.Worker``; Faust's worker
    attaches the app's beacon under its own) and ``Worker.crash_reason``, which
    ``mode.Worker._shutdown_loop`` re-raises after the loop closed (the process exits 1).

    Returns:
        False when ``app`` runs under no worker (nothing marked; crash it instead).
    """
    root = app.beacon.root
    worker = None if root is None else root.data
    if worker is None or worker is app or not hasattr(worker, "crash_reason"):
        return False
    worker.crash_reason = reason
    return True


def restart_table_recovery(app: Any) -> None:
    """Make Faust's table recovery start over: it seeks every active changelog partition to
    where its recovery starts and reads again, as after a rebalance during recovery.

    Uses ``app.tables.recovery.signal_recovery_start`` (``faust.tables.recovery.Recovery``:
    set by its ``on_rebalance``; a recovery waiting on the changelogs raises ``RebalanceAgain``
    and its loop runs the recovery again with the same assignment).
    """
    app.tables.recovery.signal_recovery_start.set()


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


# --- aiokafka's record parsing --------------------------------------------------------------

#: The records a read in this context could not decode, ``[(offset, reason)]``, while
#: :func:`undecodable_records` collects them; ``None`` elsewhere (aiokafka's own behaviour).
_UNDECODABLE: ContextVar[list[tuple[int, str]] | None] = ContextVar(
    "queueflow_undecodable_records", default=None
)


@contextlib.contextmanager
def undecodable_records() -> Iterator[list[tuple[int, str]]]:
    """Within the block, the aiokafka consumer reads of the current task (``getmany``) return
    a record whose header name is not UTF-8 instead of raising ``UnicodeDecodeError`` for
    good: its header names are decoded with U+FFFD replacement characters, and
    ``(offset, reason)`` is appended to the list this yields, so the caller treats that record
    as undecodable. Needs :func:`tolerate_undecodable_records` installed.

    aiokafka decodes header names strictly while it iterates a fetched batch; the error ends
    the iteration, the records before it in the fetch are not returned, and every later read
    of the partition fetches the same batch and fails the same way (a consumer stuck for
    good on one record).
    """
    seen: list[tuple[int, str]] = []
    token = _UNDECODABLE.set(seen)
    try:
        yield seen
    finally:
        _UNDECODABLE.reset(token)


def tolerate_undecodable_records() -> None:
    """Install (once per process) the wrapper that lets :func:`undecodable_records` work.

    Replaces ``aiokafka.consumer.fetcher.MemoryRecords`` (what the fetcher builds for each
    fetched partition) with a wrapper that keeps the fetched bytes and, only inside
    :func:`undecodable_records`, wraps each ``DefaultRecordBatch``: a batch whose iteration
    raises ``UnicodeDecodeError`` is parsed again, from the record that failed on, by a
    lenient subclass of ``aiokafka.record.default_records._DefaultRecordBatchPy``
    (its ``_read_msg``, ``_buffer``, ``_pos``). Elsewhere (another task, Faust's consumer
    thread) the batches are aiokafka's own, unchanged.
    """
    import aiokafka.consumer.fetcher as fetcher

    if not getattr(fetcher.MemoryRecords, "queueflow_tolerant", False):
        fetcher.MemoryRecords = _tolerant_memory_records(fetcher.MemoryRecords)


def _tolerant_memory_records(inner: Any) -> Any:
    import struct

    from aiokafka.record.default_records import _DefaultRecordBatchPy, _DefaultRecordPy
    from aiokafka.record.util import decode_varint

    def read_bytes(buffer: Any, pos: int) -> tuple[bytes | None, int]:
        size, pos = decode_varint(buffer, pos)
        if size < 0:
            return None, pos
        return bytes(buffer[pos : pos + size]), pos + size

    class LenientBatch(_DefaultRecordBatchPy):  # type: ignore[misc,unused-ignore]
        """A v2 batch whose undecodable header names become U+FFFD, the offsets noted."""

        #: The last record read was undecodable.
        lossy = False

        def _read_msg(self, decode_varint: Any = decode_varint) -> Any:
            start: int = self._pos  # type: ignore[has-type]
            try:
                record = super()._read_msg()
                self.lossy = False
                return record
            except UnicodeDecodeError as exc:
                self.lossy = True
                self._pos = start
                record = self.lossy_record()
                seen = _UNDECODABLE.get()
                if seen is not None:
                    seen.append((record.offset, f"a header name is not UTF-8 ({exc.reason})"))
                return record

        def lossy_record(self) -> Any:
            buffer = self._buffer
            length, pos = decode_varint(buffer, self._pos)
            end = pos + length
            _attributes, pos = decode_varint(buffer, pos)
            ts_delta, pos = decode_varint(buffer, pos)
            offset_delta, pos = decode_varint(buffer, pos)
            key, pos = read_bytes(buffer, pos)
            value, pos = read_bytes(buffer, pos)
            count, pos = decode_varint(buffer, pos)
            headers: list[tuple[str, bytes | None]] = []
            for _ in range(max(count, 0)):
                name, pos = read_bytes(buffer, pos)
                header_value, pos = read_bytes(buffer, pos)
                headers.append(((name or b"").decode("utf-8", "replace"), header_value))
            self._pos = end
            log_append = self.timestamp_type == self.LOG_APPEND_TIME
            timestamp = self.max_timestamp if log_append else self.first_timestamp + ts_delta
            return _DefaultRecordPy(
                self.base_offset + offset_delta,
                timestamp,
                self.timestamp_type,
                key,
                value,
                headers,
            )

    def lenient_records(data: bytes, base_offset: int) -> Iterator[Any]:
        """The records of the batch at ``base_offset`` in ``data`` from its first undecodable
        one on (aiokafka's parser returned those before it, then failed on it)."""
        pos = 0
        while pos + 12 <= len(data):
            offset, length = struct.unpack_from(">qi", data, pos)
            end = pos + 12 + length
            if offset == base_offset:
                batch = LenientBatch(memoryview(data)[pos:end])
                started = False
                for record in batch:
                    started = started or batch.lossy
                    if started:
                        yield record
                return
            pos = end

    class TolerantBatch:
        """aiokafka's batch; parsed again leniently from where a header name failed."""

        __slots__ = ("batch", "data")

        def __init__(self, batch: Any, data: bytes) -> None:
            self.batch, self.data = batch, data

        def __getattr__(self, name: str) -> Any:
            return getattr(self.batch, name)

        def __next__(self) -> Any:
            return next(self.batch)

        def __iter__(self) -> Iterator[Any]:
            try:
                yield from self.batch
                return
            except UnicodeDecodeError:
                pass
            yield from lenient_records(self.data, self.batch.base_offset)

    class TolerantMemoryRecords:
        """aiokafka's ``MemoryRecords`` over ``data``, keeping ``data`` for a lenient parse."""

        queueflow_tolerant = True

        def __init__(self, data: bytes) -> None:
            self.data = data
            self.inner = inner(data)

        def size_in_bytes(self) -> int:
            return int(self.inner.size_in_bytes())

        def has_next(self) -> bool:
            return bool(self.inner.has_next())

        def next_batch(self) -> Any:
            batch = self.inner.next_batch()
            if batch is None or _UNDECODABLE.get() is None or getattr(batch, "magic", 0) < 2:
                return batch
            return TolerantBatch(batch, self.data)

    return TolerantMemoryRecords


_RAW_RECORDS: ContextVar[bool] = ContextVar("queueflow_raw_records", default=False)


@contextlib.contextmanager
def raw_records() -> Iterator[None]:
    """Within the block, the aiokafka consumer reads of the current task (``getmany``) return
    the parser's own records (``DefaultRecord`` and the like: ``offset``, ``timestamp``,
    ``timestamp_type``, ``key``, ``value``, ``headers`` as a list) instead of building a
    ``ConsumerRecord`` for each (key and value deserializers are not applied). Installs the
    switch once per process (:func:`_install_raw_records`); elsewhere (another task, Faust's
    consumers) reads are aiokafka's own, unchanged, at one context variable read per record.
    """
    _install_raw_records()
    token = _RAW_RECORDS.set(True)
    try:
        yield
    finally:
        _RAW_RECORDS.reset(token)


def _install_raw_records() -> None:
    """Wrap ``aiokafka.consumer.fetcher.PartitionRecords._consumer_record`` (what iterating a
    fetched partition calls per record) so that it returns the record as parsed inside
    :func:`raw_records`."""
    from aiokafka.consumer.fetcher import PartitionRecords

    if getattr(PartitionRecords, "queueflow_raw", False):
        return
    build = PartitionRecords._consumer_record
    is_raw = _RAW_RECORDS.get

    def consumer_record(self: Any, tp: Any, record: Any) -> Any:
        return record if is_raw() else build(self, tp, record)

    PartitionRecords._consumer_record = consumer_record
    PartitionRecords.queueflow_raw = True


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
