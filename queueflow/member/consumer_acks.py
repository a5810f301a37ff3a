"""The acknowledging half of :class:`~queueflow.member.consumer.ShareConsumer`: acknowledge
(by record, or by topic, partition and offset as ``KafkaShareConsumer.acknowledge(String, int,
long, AcknowledgeType)``), the commit callback, ``commit_sync`` and ``commit_async``
(KIP-932 "Acknowledgement modes", "Client programming interface")."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any, overload

from queueflow.errors import ConfigurationError, QueueflowError, ShareGroupError
from queueflow.member.consumer_metrics import ShareConsumerMetrics
from queueflow.member.outcomes import Release, release_options
from queueflow.member.session import ShareFetchSession
from queueflow.protocol.messages import AckError
from queueflow.settings import ShareGroupSettings
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

__all__ = ["AcknowledgingConsumer", "CommitCallback", "IllegalStateError"]

#: ``callback(offsets: {(topic, partition): {offset, ...}}, exception or None)``.
CommitCallback = Callable[[dict[TopicPartition, set[int]], Exception | None], Any]

_OUTCOMES = (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT)
#: ``acknowledge``'s ``kind`` (an outcome, or ``queueflow.release(delay)``) and ``delay`` (s).
_Kind = AcknowledgeType | Release
_Delay = float | datetime.timedelta | None


class IllegalStateError(QueueflowError):
    """The consumer was used out of order (e.g. explicit mode polled with unacknowledged
    records, or used after close)."""


class AcknowledgingConsumer:
    """Acknowledgements and commits of a share consumer (the base of ``ShareConsumer``, which
    sets these attributes and delivers the records)."""

    mode: str
    settings: ShareGroupSettings
    _metrics: ShareConsumerMetrics
    _session: ShareFetchSession | None
    _delivered: dict[tuple[str, int, int], ShareRecord]
    _callback: CommitCallback | None
    _closed: bool

    def set_acknowledgement_commit_callback(self, callback: CommitCallback | None) -> None:
        """``callback(offsets: {(topic, partition): {offset, ...}}, exception or None)`` runs
        after each acknowledgement batch a leader answers."""
        self._callback = callback

    @overload
    def acknowledge(
        self,
        record: ShareRecord,
        kind: _Kind = AcknowledgeType.ACCEPT,
        /,
        *,
        delay: _Delay = None,
        error: Exception | None = None,
    ) -> None: ...

    @overload
    def acknowledge(
        self,
        topic: str,
        partition: int,
        offset: int,
        kind: _Kind = AcknowledgeType.ACCEPT,
        /,
        *,
        delay: _Delay = None,
        error: Exception | None = None,
    ) -> None: ...

    def acknowledge(
        self,
        record: ShareRecord | str,
        /,
        *args: Any,
        delay: _Delay = None,
        error: Exception | None = None,
    ) -> None:
        """Acknowledge a record returned by the last poll (sent with the next poll or commit):
        ``acknowledge(record[, kind])`` or, as ``KafkaShareConsumer``,
        ``acknowledge(topic, partition, offset[, kind])``; ``kind`` defaults to ACCEPT.

        ``RENEW`` (KIP-1222) extends the record's acquisition lock instead: the record stays to
        be acknowledged (with ACCEPT, RELEASE or REJECT; in explicit mode before the next poll).
        Send it with :meth:`commit_sync` while the work on the record goes on. A RELEASE
        ``delay`` (s or timedelta), or ``kind=queueflow.release(delay)``: docs/concepts.md
        "Delayed redelivery". ``error``: why you RELEASE or REJECT it, for the dead-letter
        headers (``queueflow.dead_letter.exception.*``; docs/guide.md "Dead-letter topics").

        Raises:
            IllegalStateError: the record was not delivered by the last poll, or was already
                acknowledged.
            ConfigurationError: ``kind`` is not ACCEPT, RELEASE, REJECT or RENEW; a bad
                delay (:func:`~queueflow.member.outcomes.release_options`).
            TypeError: other arguments than those above.
        """
        self._check_open()
        record, raw_kind = self._target(record, args)
        kind, delay_ms = release_options(raw_kind, delay, self.settings.redelivery_max_delay_ms)
        key = (record.topic, record.partition, record.offset)
        tp = TopicPartition(record.topic, record.partition)
        if kind is AcknowledgeType.RENEW:  # KIP-1222: keep it, with a fresh lock
            if key not in self._delivered:
                raise IllegalStateError(
                    f"{record.topic}[{record.partition}]@{record.offset} was not returned by the "
                    "last poll or is already acknowledged; only those can be renewed"
                )
            self._require_session().acknowledge(tp, record.offset, kind)
            return
        if kind not in _OUTCOMES:
            raise ConfigurationError(
                f"acknowledge type {kind!r}; use ACCEPT, RELEASE, REJECT or RENEW"
            )
        if self._delivered.pop(key, None) is None:
            raise IllegalStateError(
                f"{record.topic}[{record.partition}]@{record.offset} was not returned by the last "
                "poll or is already acknowledged"
            )
        session = self._require_session()
        why = None if error is None else AckError.of(error)
        session.acknowledge(tp, record.offset, kind, why, delay_ms=delay_ms)
        if kind is AcknowledgeType.RELEASE:
            session.remember_released(record)

    def _target(self, first: ShareRecord | str, args: tuple[Any, ...]) -> tuple[ShareRecord, _Kind]:
        """The record and type of :meth:`acknowledge`'s arguments."""
        if isinstance(first, ShareRecord):
            if len(args) > 1:
                raise TypeError("acknowledge(record[, kind]) takes at most 2 arguments")
            return first, args[0] if args else AcknowledgeType.ACCEPT
        if not isinstance(first, str) or len(args) not in (2, 3):
            raise TypeError(
                "acknowledge takes (record[, kind]) or (topic, partition, offset[, kind]), "
                f"got {first!r} and {len(args)} more argument(s)"
            )
        partition, offset = args[0], args[1]
        kind = args[2] if len(args) == 3 else AcknowledgeType.ACCEPT
        record = self._delivered.get((first, partition, offset))
        if record is None:
            raise IllegalStateError(
                f"{first}[{partition}]@{offset} was not returned by the last poll or is already "
                "acknowledged"
            )
        return record, kind

    def _report(
        self, tp: TopicPartition, offsets: list[int], error: ShareGroupError | None
    ) -> None:
        self._metrics.acknowledged(len(offsets), error is not None)
        if self._callback is not None and offsets:
            self._callback({tp: set(offsets)}, error)

    def _settle_previous(self) -> None:
        if not self._delivered:
            return
        if self.mode == "explicit":
            raise IllegalStateError(
                f"{len(self._delivered)} records from the last poll are not acknowledged; in "
                "explicit mode acknowledge every record before polling again"
            )
        session = self._require_session()
        for topic, partition, offset in list(self._delivered):
            session.acknowledge(TopicPartition(topic, partition), offset, AcknowledgeType.ACCEPT)
        self._delivered.clear()

    async def commit_sync(
        self, timeout_ms: int | None = None
    ) -> dict[TopicPartition, Exception | None]:
        """Send pending acknowledgements now and wait for the leaders' answers.

        In implicit mode this first ACCEPTs the records of the last poll. Acknowledgements a
        leader refuses as stale are dropped and the others sent again (see
        :class:`~queueflow.member.session.ShareFetchSession`); the commit callback hears of
        both. Records below the share-partition's start offset (finished by another member
        after this one's lock elapsed) are skipped without an error, as Kafka's broker does.

        Args:
            timeout_ms: the longest to wait, in ms (None: until every leader answered or timed
                out, ``queueflow.request.timeout.ms`` each).

        Returns:
            ``{(topic, partition): None or the error}`` for each share-partition acknowledged:
            the result of its last acknowledgement batch.

        Raises:
            asyncio.TimeoutError: ``timeout_ms`` passed first.
        """
        session = self._require_session()
        if self.mode == "implicit":
            self._settle_previous()
        results: dict[TopicPartition, Exception | None] = {}

        async def one(tp: TopicPartition) -> None:
            results[tp] = await session.flush(tp)

        work = asyncio.gather(*(one(tp) for tp in session.acks.partitions()))
        if timeout_ms is None:
            await work
        else:
            await asyncio.wait_for(work, timeout_ms / 1000)
        return results

    def commit_async(self) -> asyncio.Task[dict[TopicPartition, Exception | None]]:
        """Send pending acknowledgements without waiting; results go to the commit callback."""
        return asyncio.ensure_future(self.commit_sync())

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("this ShareConsumer is closed")

    def _require_session(self) -> ShareFetchSession:
        self._check_open()
        if self._session is None:
            raise IllegalStateError("call subscribe() before poll() or commit")
        return self._session
