"""``spark.readStream.format("queueflow")``: a Spark Structured Streaming source over a queueflow
share group (KIP-932 queues), on PySpark's Python Data Source API (4.2+, admission control).

How a micro-batch goes (see docs/spark.md, "How it works"):

1. ``latestOffset(start, limit)`` runs in Spark's streaming source runner on the driver. It first
   acknowledges every batch up to ``start`` (Spark calls it only once the batch ending at
   ``start`` is in the commit log): the outcomes chosen in ``foreachBatch``
   (:func:`queueflow.spark.acknowledge`), ACCEPT for the rest. Then it acquires up to ``limit``
   offsets (a ShareFetch that acquires without reading payloads) and returns them as the next
   offset: ``{"seq": N, "member": id, "acq": [[topic, partition, first, last, count], ...]}``.
2. ``partitions(start, end)`` splits ``end["acq"]`` into tasks; ``read`` on the executors reads
   the payloads by offset from Kafka. Records never pass through the driver.
3. ``commit(end)`` acknowledges the same way (whichever of the two hooks comes first does it).

Acquired, unacknowledged records have their locks renewed by the runner (KIP-1222 RENEW) until
they are acknowledged; when the runner dies they come back once their locks expire.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from queueflow.spark.runtime import require_pyspark

require_pyspark()

from pyspark.sql.datasource import (  # noqa: E402 (after the version check)
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (  # noqa: E402
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from queueflow.errors import ConfigurationError  # noqa: E402
from queueflow.settings import ShareGroupSettings  # noqa: E402
from queueflow.spark.member import SparkMember  # noqa: E402
from queueflow.spark.options import SourceOptions, parse_source_options  # noqa: E402
from queueflow.spark.read import (  # noqa: E402
    SCHEMA_DDL,
    QueueflowInputPartition,
    plan_partitions,
    read_partition,
    spark_schema,
)
from queueflow.structs import TopicPartition  # noqa: E402

__all__ = ["QueueflowDataSource", "QueueflowStreamReader"]

#: Offsets of a batch read (ms) at the least: a task fails if its offsets can't be read in time.
_MIN_READ_TIMEOUT_MS = 30_000


class QueueflowDataSource(DataSource):
    """The ``queueflow`` format: share-group streaming source (this module) and sink
    (:mod:`queueflow.spark.sink`).

    Register it with :func:`queueflow.spark.register`; options as in docs/spark.md.
    """

    @classmethod
    def name(cls) -> str:
        """``"queueflow"``."""
        return "queueflow"

    def schema(self) -> str:
        """Spark's Kafka source schema plus ``delivery_count int`` (DDL)."""
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> QueueflowStreamReader:
        """The share-group stream reader.

        Raises:
            ConfigurationError: an option is missing, unknown or invalid, or ``schema`` is not
                the source's.
        """
        _check_schema(schema)
        return QueueflowStreamReader(parse_source_options(self.options))

    def writer(self, schema: Any, overwrite: bool) -> Any:
        """The batch sink (see :func:`queueflow.spark.sink.make_writer`)."""
        from queueflow.spark.sink import make_writer

        return make_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        """The streaming sink (see :func:`queueflow.spark.sink.make_stream_writer`)."""
        from queueflow.spark.sink import make_stream_writer

        return make_stream_writer(self.options, schema, overwrite)


def _check_schema(schema: Any) -> None:
    if schema is None:
        return
    expected = spark_schema()
    given = [(f.name, f.dataType) for f in getattr(schema, "fields", [])]
    if given != [(f.name, f.dataType) for f in expected.fields]:
        shown = schema.simpleString() if hasattr(schema, "simpleString") else schema
        raise ConfigurationError(
            f"the queueflow source has a fixed schema ({SCHEMA_DDL}); a different one was given "
            f"({shown}); drop .schema(...) and select or cast columns after load()"
        )


class QueueflowStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream reader of one query over a share group (see the module docstring).

    Its instance in Spark's source runner owns a :class:`~queueflow.spark.member.SparkMember`,
    started on the first ``initialOffset``/``latestOffset`` (never in ``__init__``: Spark also
    creates readers in planner processes and pickles one to the executors).

    Args:
        options: the parsed source options.
        settings: share-group settings for the member (default: from the environment).
    """

    def __init__(self, options: SourceOptions, settings: ShareGroupSettings | None = None) -> None:
        self.options = options
        self.settings = settings or ShareGroupSettings.load()
        self._member: SparkMember | None = None
        self._available_now = False
        self._targets: dict[TopicPartition, int] | None = None
        #: (start seq, offset returned for it): a repeated latestOffset(start) gets the same.
        self._last: tuple[int, dict[str, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_member"] = None  # a thread and sockets: never pickled to executors
        return state

    @property
    def member(self) -> SparkMember:
        """The runner's member (started on first use)."""
        if self._member is None:
            self._member = SparkMember(self.options, self.settings)
        self._member.start()
        return self._member

    # -- offsets (runner) ------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        """``{"seq": 0, "acq": []}``; starts the member (joins the group).

        Raises:
            ConfigurationError: a topic does not exist.
            ShareGroupError: no coordinator answered (no leader worker for ``app.id``).
        """
        self.member  # noqa: B018 (start it: fail early on an unknown topic)
        return {"seq": 0, "acq": []}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxRecordsPerTrigger)``, default the group's ``max.poll.records``."""
        return ReadMaxRows(self._default_max())

    def _default_max(self) -> int:
        return self.options.max_records_per_trigger or self.settings.max_poll_records

    def _max_records(self, limit: ReadLimit | None) -> int:
        if isinstance(limit, ReadMaxRows):
            return max(int(limit.max_rows), 1)
        if isinstance(limit, ReadAllAvailable):
            # Trigger.Once / availableNow without our split: one batch of the usual size.
            return self._default_max()
        return self._default_max()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Acknowledge the batches up to ``start`` (Spark committed them), then acquire up to
        ``limit`` offsets as the next batch, waiting up to ``pollTimeoutMs`` for some.

        Args:
            start: the end offset of the last batch (``{"seq": N, ...}``).
            limit: ``ReadMaxRows(n)``; ``ReadAllAvailable`` acquires ``maxRecordsPerTrigger``
                (default ``max.poll.records``).

        Returns:
            ``start`` when nothing was acquired, else ``{"seq": N + 1, "member": member id,
            "acq": [[topic, partition, first, last, delivery_count], ...]}``.

        Raises:
            ConfigurationError: a topic does not exist (first call).
            TimeoutError: the outcomes topic could not be read (nothing was acknowledged).
        """
        seq = int(start.get("seq", 0))
        member = self.member
        member.acknowledge_through(seq, flush=False)  # they ride along with the acquisitions
        if self._last is not None and self._last[0] == seq:
            return self._last[1]
        ranges = member.acquire(
            seq + 1,
            self._max_records(limit),
            self.options.poll_timeout_ms,
            self._targets if self._available_now else None,
        )
        if not ranges:
            return start
        end = {"seq": seq + 1, "member": member.member_id, "acq": [list(r) for r in ranges]}
        self._last = (seq, end)
        return end

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: the run takes the records below each partition's current log end
        offset; a share-partition that hands out an offset at or above it is not asked again
        in this run, and those offsets are released at once."""
        self._available_now = True
        self._targets = self.member.end_offsets()

    def commit(self, end: dict[str, Any]) -> None:
        """Acknowledge every batch up to ``end`` (idempotent; see :meth:`latestOffset`)."""
        if self._member is not None and self._member.started:
            self._member.acknowledge_through(int(end.get("seq", 0)), flush=True)

    def stop(self) -> None:
        """Leave the group (Spark rarely calls this: it kills the runner process instead)."""
        if self._member is not None:
            self._member.close()
            self._member = None

    # -- planning and reading --------------------------------------------------------------
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The tasks of the batch ``start``..``end``: from ``end["acq"]`` alone, so the same
        after a restart (``[]`` when ``start == end``)."""
        if int(start.get("seq", 0)) == int(end.get("seq", 0)):
            return []
        return plan_partitions(end.get("acq", []), self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Read a task's offsets from Kafka (on an executor); yields Arrow record batches."""
        assert isinstance(partition, QueueflowInputPartition)
        timeout_ms = max(_MIN_READ_TIMEOUT_MS, self.settings.request_timeout_ms)
        return read_partition(self.options, partition, timeout_ms)
