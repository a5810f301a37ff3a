"""The ``queueflow-state`` data source: share-group state as a DataFrame, for analytics with
Spark SQL (``spark.read.format("queueflow-state")``).

It reads the state changelog of each source topic of an app, ``<app.id>-share-state-<topic>-
changelog`` (the compacted changelog of the Faust table ``share-state-<topic>``), one Spark
partition per changelog partition, up to the end offsets looked up when the read is planned. As
log compaction would, it keeps the latest value of every key (a tombstone deletes the key), then
rebuilds every share-partition the way a leader restores it: the snapshot ``S/<group>/<partition>``
and its deltas ``D/<group>/<partition>/<state epoch>/<snapshot epoch>/<index>`` in index order
(:func:`queueflow.engine.state.replay`); deltas of other epochs are superseded and ignored.

Two views (the ``view`` option):

``ranges`` (default): one row per run of in-flight records with one state and delivery count::

    group string, topic string, partition int, spso long, speo long,
    first_offset long, last_offset long, state string, delivery_count int,
    state_epoch int, snapshot_epoch int, error string

  The runs cover SPSO..SPEO-1 exactly; offsets the state does not list (never delivered) are a
  run ``AVAILABLE`` with delivery count 0. A share-partition with no in-flight records has one
  row with null ``first_offset``, ``last_offset``, ``state`` and ``delivery_count``.

``records``: one row per in-flight record::

    group string, topic string, partition int, offset long, state string,
    delivery_count int, error string

What the state can and cannot say:

* ``state`` is ``AVAILABLE``, ``ACQUIRED``, ``ACKNOWLEDGED`` or ``ARCHIVED``. queueflow
  persists acquisition locks (KIP-932 does not), so a record a consumer holds reads as
  ``ACQUIRED`` with the delivery count of its current delivery; state written before locks were
  persisted (format version 2) shows it as ``AVAILABLE``. A lock that has elapsed but that no
  leader has expired yet still reads ``ACQUIRED``.
* Records below the SPSO are finished (Acknowledged or Archived) and **gone from the state**:
  their history is not kept, so a poison record is visible only while it is in flight.
* The SPEO is derived: the end of the last persisted run, or the SPSO.
* A share-partition whose snapshot or deltas cannot be decoded (what makes a leader refuse it)
  yields one row with the error in ``error`` and nulls elsewhere, and a ``state_corrupt``
  warning is logged; the rest of the read goes on. A key of an unknown layout yields such a row
  with a null ``group``.

Options: ``bootstrap.servers`` (or ``kafka.bootstrap.servers``), ``app.id``, ``topic`` (or
``topics``, comma-separated), optional ``group``, ``view``, ``read.timeout.ms`` (default 60000)
and the ``kafka.*`` security options of the ``queueflow`` sink.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import structlog
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from queueflow.engine.state import RecordState, StateBatch, replay
from queueflow.errors import ConfigurationError, CorruptStateError
from queueflow.kafka.admin import topic_partition_counts
from queueflow.kafka.options import KafkaOptions
from queueflow.protocol.state_codec import decode_state, parse_state_key
from queueflow.protocol.topics import state_changelog

__all__ = [
    "RANGES_SCHEMA",
    "RECORDS_SCHEMA",
    "ChangelogPartition",
    "QueueflowStateDataSource",
    "QueueflowStateReader",
    "latest_values",
    "state_rows",
]

log = structlog.get_logger("queueflow.spark.state")

#: Schema of the default view (``view`` = ``ranges``).
RANGES_SCHEMA: Final = (
    "group string, topic string, partition int, spso long, speo long, first_offset long, "
    "last_offset long, state string, delivery_count int, state_epoch int, snapshot_epoch int, "
    "error string"
)
#: Schema of the ``records`` view.
RECORDS_SCHEMA: Final = (
    "group string, topic string, partition int, offset long, state string, delivery_count int, "
    "error string"
)
VIEWS: Final = ("ranges", "records")
_DEFAULT_TIMEOUT_MS: Final = 60000
_INT32_MAX: Final = 2**31 - 1


# --------------------------------------------------------------------------------------------
# From changelog values to rows (pure)
# --------------------------------------------------------------------------------------------


def latest_values(records: Iterator[tuple[bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    """The table a compacted changelog describes: the last value of each key, in offset order;
    a tombstone (value None) deletes its key; records without a key are skipped.

    Args:
        records: ``(key, value)`` pairs in offset order.
    """
    table: dict[bytes, bytes] = {}
    for key, value in records:
        if key is None:
            continue
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


@dataclass
class _Entries:
    """The table entries of one share-partition."""

    snapshot: bytes | None = None
    deltas: dict[tuple[int, int, int], bytes] | None = None


@dataclass(frozen=True)
class _SharePartitionState:
    spso: int
    speo: int
    runs: tuple[StateBatch, ...]
    state_epoch: int
    snapshot_epoch: int


def _replay(entries: _Entries, where: str) -> _SharePartitionState | None:
    """The leader's restore rule (queueflow.server.durable.DurableSharePartition.load)."""
    if entries.snapshot is None:
        return None  # deltas without a snapshot: a leader sees no state either
    deltas = entries.deltas or {}
    snapshot, updates = decode_state(
        entries.snapshot, lambda *epochs_index: deltas.get(epochs_index), where=where
    )
    spso, batches = replay(snapshot, updates, where=where)
    if snapshot.state_epoch > _INT32_MAX or snapshot.snapshot_epoch > _INT32_MAX:
        raise CorruptStateError(f"corrupt share-partition state for {where}: epochs out of range")
    runs: list[StateBatch] = []
    end = spso
    for b in batches:
        if b.first_offset > end:  # not listed: never delivered (Available, count 0)
            runs.append(StateBatch(end, b.first_offset - 1, RecordState.AVAILABLE, 0))
        runs.append(b)
        end = b.last_offset + 1
    return _SharePartitionState(
        spso, end, tuple(runs), snapshot.state_epoch, snapshot.snapshot_epoch
    )


def state_rows(
    topic: str,
    table: Mapping[bytes, bytes],
    *,
    group: str | None = None,
    view: str = "ranges",
) -> Iterator[tuple[Any, ...]]:
    """Rows of the ``view`` schema for the share-partitions of ``topic`` in ``table``.

    Args:
        topic: the source topic the table belongs to.
        table: the state table (keys ``S/...`` and ``D/...``, see :func:`latest_values`).
        group: only this share group (None: every group).
        view: ``ranges`` (:data:`RANGES_SCHEMA`) or ``records`` (:data:`RECORDS_SCHEMA`).

    Yields tuples ordered by group and partition. Corrupt state becomes a row with ``error``
    set (and a ``state_corrupt`` warning); it never raises for the data.
    """
    by_sp: dict[tuple[str, int], _Entries] = defaultdict(_Entries)
    for key, value in table.items():
        try:
            kind, g, partition, delta = parse_state_key(key)
        except (ValueError, UnicodeDecodeError) as exc:
            if group is None:
                error = f"unrecognised state table key {key!r} in the changelog of {topic!r}: {exc}"
                log.warning("state_corrupt", topic=topic, key=repr(key), error=error)
                yield _error_row(view, None, topic, None, error)
            continue
        if kind in ("R", "A", "K") or (group is not None and g != group):
            continue  # "R"/"A": a leader's request-log / ack-log position; "K": parked keys
        entries = by_sp[(g, partition)]
        if delta is None:
            entries.snapshot = value
        else:
            if entries.deltas is None:
                entries.deltas = {}
            entries.deltas[delta] = value
    for (g, partition), entries in sorted(by_sp.items()):
        where = f"group={g} topic={topic} partition={partition}"
        try:
            sp = _replay(entries, where)
        except CorruptStateError as exc:
            log.warning("state_corrupt", group=g, topic=topic, partition=partition, error=str(exc))
            yield _error_row(view, g, topic, partition, str(exc))
            continue
        if sp is None:
            continue
        if view == "records":
            for run in sp.runs:
                for offset in range(run.first_offset, run.last_offset + 1):
                    state = run.state.name
                    yield (g, topic, partition, offset, state, run.delivery_count, None)
            continue
        common = (g, topic, partition, sp.spso, sp.speo)
        epochs = (sp.state_epoch, sp.snapshot_epoch, None)
        if not sp.runs:
            yield (*common, None, None, None, None, *epochs)
        for run in sp.runs:
            yield (
                *common,
                run.first_offset,
                run.last_offset,
                run.state.name,
                run.delivery_count,
                *epochs,
            )


def _error_row(
    view: str, group: str | None, topic: str, partition: int | None, error: str
) -> tuple[Any, ...]:
    if view == "records":
        return (group, topic, partition, None, None, None, error)
    return (group, topic, partition, None, None, None, None, None, None, None, None, error)


# --------------------------------------------------------------------------------------------
# Data source
# --------------------------------------------------------------------------------------------


@dataclass
class ChangelogPartition(InputPartition):
    """One changelog partition to read: offsets ``start`` (inclusive) to ``end`` (exclusive).

    Attributes:
        topic: the source topic whose state it holds.
        changelog: the changelog topic.
        partition: the changelog partition.
        start / end: offsets to read, looked up on the driver when the read was planned.
    """

    topic: str
    changelog: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class _StateOptions:
    kafka: KafkaOptions
    app_id: str
    topics: tuple[str, ...]
    group: str | None
    view: str
    timeout_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _StateOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        kafka = KafkaOptions.parse(opts)
        app_id = opts.get("app.id")
        if not app_id:
            raise ConfigurationError(
                "missing option 'app.id': the id of the queueflow app whose share-group state "
                "to read (the App's id, as given to `queueflow leader --app`)"
            )
        raw = opts.get("topics") or opts.get("topic") or ""
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise ConfigurationError(
                "missing option 'topic': the source topic(s) whose share-group state to read "
                "(comma-separated in 'topics' for several)"
            )
        view = opts.get("view", "ranges").lower()
        if view not in VIEWS:
            raise ConfigurationError(f"option 'view'={view!r}: use one of {', '.join(VIEWS)}")
        try:
            timeout_ms = int(opts.get("read.timeout.ms", _DEFAULT_TIMEOUT_MS))
        except ValueError:
            timeout_ms = -1
        if timeout_ms <= 0:
            raise ConfigurationError(
                f"option 'read.timeout.ms'={opts.get('read.timeout.ms')!r}: a positive number "
                "of milliseconds"
            )
        return cls(kafka, app_id, topics, opts.get("group") or None, view, timeout_ms)


class QueueflowStateDataSource(DataSource):
    """``spark.read.format("queueflow-state")``: share-group state of a queueflow app.

    Options (case-insensitive):
        bootstrap.servers: the cluster (required; ``kafka.bootstrap.servers`` also works).
        app.id: the queueflow app id (required).
        topic / topics: the source topic(s), comma-separated (required).
        group: only this share group (default: all).
        view: ``ranges`` (default) or ``records``.
        read.timeout.ms: how long a task may take to read its changelog partition (60000).
        kafka.*: the security options of the sink (:class:`~queueflow.spark.sink.KafkaOptions`).

    Raises (when the read is planned):
        ConfigurationError: a missing or invalid option, or a changelog topic that does not
            exist (the message names it: check ``app.id`` and ``topic``).
    """

    @classmethod
    def name(cls) -> str:
        return "queueflow-state"

    def schema(self) -> str:
        view = {str(k).lower(): v for k, v in self.options.items()}.get("view", "ranges")
        return RECORDS_SCHEMA if str(view).lower() == "records" else RANGES_SCHEMA

    def reader(self, schema: Any) -> QueueflowStateReader:
        return QueueflowStateReader(self.options)


class QueueflowStateReader(DataSourceReader):
    """Batch reader of :class:`QueueflowStateDataSource`; connects only in :meth:`partitions`
    (driver) and :meth:`read` (executors)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = _StateOptions.parse(options)

    def partitions(self) -> Sequence[ChangelogPartition]:
        """One partition per changelog partition, with its offsets as of now.

        Raises:
            ConfigurationError: a changelog topic does not exist.
        """
        return asyncio.run(self._plan())

    async def _plan(self) -> list[ChangelogPartition]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        o = self.options
        config = o.kafka.client_config("queueflow-spark-state")
        names = {state_changelog(o.app_id, t): t for t in o.topics}
        counts = await topic_partition_counts(config, names)
        missing = [n for n in names if n not in counts]
        if missing:
            raise ConfigurationError(
                f"no state changelog topic {', '.join(repr(n) for n in missing)} on "
                f"{o.kafka.bootstrap}: check 'app.id' ({o.app_id!r}) and 'topic'; the changelog "
                "exists once a leader worker of that app has served the topic"
            )
        tps = [TopicPartition(n, p) for n, c in counts.items() for p in range(c)]
        consumer = AIOKafkaConsumer(
            **config.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await consumer.start()
        try:
            starts = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        return [
            ChangelogPartition(names[tp.topic], tp.topic, tp.partition, starts[tp], ends[tp])
            for tp in tps
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """Rows of the share-partitions in one changelog partition (executor side).

        Args:
            partition: a :class:`ChangelogPartition` from :meth:`partitions`.

        Raises:
            TimeoutError: the partition was not read up to its end offset within
                ``read.timeout.ms``.
        """
        o = self.options
        if not isinstance(partition, ChangelogPartition) or partition.end <= partition.start:
            return
        table = asyncio.run(self._read_changelog(partition))
        yield from state_rows(partition.topic, table, group=o.group, view=o.view)

    async def _read_changelog(self, p: ChangelogPartition) -> dict[bytes, bytes]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        o = self.options
        config = o.kafka.client_config("queueflow-spark-state")
        consumer = AIOKafkaConsumer(
            **config.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        tp = TopicPartition(p.changelog, p.partition)
        records: list[tuple[bytes | None, bytes | None]] = []
        deadline = time.monotonic() + o.timeout_ms / 1000
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, p.start)
            while await consumer.position(tp) < p.end:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"read {p.changelog}[{p.partition}] only up to offset "
                        f"{await consumer.position(tp)} of {p.end} in {o.timeout_ms} ms; raise "
                        "'read.timeout.ms' or check the cluster"
                    )
                batch = await consumer.getmany(tp, timeout_ms=500, max_records=10000)
                for record in batch.get(tp, ()):
                    if record.offset < p.end:
                        records.append((record.key, record.value))
        finally:
            await consumer.stop()
        return latest_values(iter(records))
