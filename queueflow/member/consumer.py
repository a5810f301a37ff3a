"""``ShareConsumer``: a plain share-group client for scripts, mirroring KIP-932's
``KafkaShareConsumer`` (subscribe, poll, acknowledge, commit_sync/commit_async, close).

It is asynchronous, like aiokafka's consumer::

    consumer = ShareConsumer("my-group", app_id="thumbnails", bootstrap_servers="localhost:9092")
    await consumer.subscribe(["jobs"])
    while True:
        for record in await consumer.poll(timeout_ms=1000):
            handle(record)                 # implicit mode: the next poll ACCEPTs the batch
    await consumer.close()

With ``acknowledgement_mode="explicit"`` every record returned by :meth:`ShareConsumer.poll`
must be acknowledged (:meth:`ShareConsumer.acknowledge`) before the next poll, or the poll raises
:class:`IllegalStateError` (KIP-932 "Acknowledgement modes"). Acknowledgements ride along with the
next poll, or are sent at once by :meth:`commit_sync` / :meth:`commit_async`.

``app_id`` is the id of the queueflow app whose leader workers serve the group.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from queueflow.errors import ConfigurationError, QueueflowError, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig, check_control_auth
from queueflow.kafka.security import security_kwargs
from queueflow.member.context import MemberContext
from queueflow.member.session import FetchResult, ShareFetchSession
from queueflow.protocol.messages import AckError
from queueflow.settings import ShareGroupSettings
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

__all__ = ["CommitCallback", "IllegalStateError", "ShareConsumer"]

#: ``callback(offsets: {(topic, partition): {offset, ...}}, exception or None)``.
CommitCallback = Callable[[dict[TopicPartition, set[int]], Exception | None], Any]


log = structlog.get_logger("queueflow.member.consumer")
_ACK = AcknowledgeType.ACCEPT  # the default outcome


class IllegalStateError(QueueflowError):
    """The consumer was used out of order (e.g. explicit mode polled with unacknowledged
    records, or used after close)."""


class ShareConsumer:
    """A member of a share group.

    Args:
        group: the share group id.
        app_id: id of the queueflow app whose leaders serve this group.
        bootstrap_servers: ``host:port[,host:port]`` or a ``kafka://`` URL.
        acknowledgement_mode: ``"implicit"`` (default) or ``"explicit"``
            (``share.acknowledgement.mode``).
        max_poll_records: records acquired per share-partition per poll.
        lock_duration_ms: this consumer's acquisition lock duration, or ``None`` for the group's.
        settings: share-group settings overrides.
        client_id: the Kafka client id, shown by admin tooling.
        context: the member context to run in, instead of one built from
            ``bootstrap_servers`` and ``settings`` (e.g. an in-process one from
            :mod:`queueflow.testing.inprocess`).
        security_protocol: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``, as in
            aiokafka; default from the other security arguments (see
            :func:`queueflow.kafka.security.security_kwargs`).
        sasl_mechanism: ``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``, ... (default ``PLAIN``
            for SASL protocols).
        sasl_plain_username: the SASL user (PLAIN/SCRAM).
        sasl_plain_password: its password.
        ssl_context: TLS context: the cluster's CA, and a client certificate for mutual TLS
            (``aiokafka.helpers.create_ssl_context(cafile=..., certfile=..., keyfile=...)``).
            Every Kafka client of the consumer uses these security settings.

    Raises:
        ConfigurationError: an invalid mode or setting, an invalid combination of security
            arguments (the message names it), or a SASL/SSL cluster with
            ``queueflow.auth.mode=auto`` and no ``queueflow.auth.secret``.
    """

    def __init__(
        self,
        group: str,
        *,
        app_id: str,
        bootstrap_servers: str = "localhost:9092",
        acknowledgement_mode: str = "implicit",
        max_poll_records: int | None = None,
        lock_duration_ms: int | None = None,
        settings: ShareGroupSettings | Mapping[str, Any] | None = None,
        client_id: str = "queueflow-share-consumer",
        context: MemberContext | None = None,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise ConfigurationError(
                f"share.acknowledgement.mode={acknowledgement_mode!r}; use 'implicit' or 'explicit'"
            )
        self.group = group
        self.app_id = app_id
        self.mode = acknowledgement_mode
        security = security_kwargs(
            security_protocol=security_protocol,
            sasl_mechanism=sasl_mechanism,
            sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password,
            ssl_context=ssl_context,
        )
        if context is None:
            kafka = KafkaClientConfig.from_broker(
                bootstrap_servers, client_id=client_id, extra=security
            )
            loaded = (
                settings
                if isinstance(settings, ShareGroupSettings)
                else ShareGroupSettings.load(settings)
            )
            check_control_auth(loaded, kafka)
            context = MemberContext.for_kafka(kafka, app_id, loaded)
        self.ctx = context
        self.settings = context.settings
        self.max_poll_records = max_poll_records or self.settings.max_poll_records
        self.lock_duration_ms = lock_duration_ms
        self.client_id = client_id
        self._session: ShareFetchSession | None = None
        self._delivered: dict[tuple[str, int, int], ShareRecord] = {}
        self._callback: CommitCallback | None = None
        self._closed = False
        # ShareFetches still under way when a poll returned (long polls of other
        # share-partitions); their records go to a later poll.
        self._inflight: dict[TopicPartition, asyncio.Task[FetchResult | None]] = {}
        self._acking: dict[TopicPartition, asyncio.Task[ShareGroupError | None]] = {}
        #: The last ShareFetch error of each share-partition, ``{(topic, partition): error}``;
        #: cleared by the next answer without one. The consumer keeps retrying those
        #: share-partitions (with back-off) and serves the others.
        self.partition_errors: dict[TopicPartition, ShareGroupError] = {}

    @property
    def member_id(self) -> str | None:
        """This member's id once subscribed."""
        return None if self._session is None else self._session.member_id

    def assignment(self) -> set[TopicPartition]:
        """The share-partitions the coordinator assigned to this member."""
        return set() if self._session is None else set(self._session.assignment)

    async def subscribe(self, topics: Iterable[str]) -> None:
        """Join the share group subscribed to ``topics`` (exact names; no patterns).

        Raises:
            ConfigurationError: a topic doesn't exist.
            ShareGroupError: no coordinator answered (no leader worker running for ``app_id``).
        """
        self._check_open()
        if self._session is not None:
            await self._session.close(leave=True)
        self._session = ShareFetchSession(
            self.ctx,
            self.group,
            topics,
            self.client_id,
            self.lock_duration_ms,
            on_acknowledged=self._report,
        )
        try:
            await self._session.start()
        except BaseException:
            session, self._session = self._session, None
            await session.close(leave=False)  # leaves no client open behind the error
            raise

    def set_acknowledgement_commit_callback(self, callback: CommitCallback | None) -> None:
        """``callback(offsets: {(topic, partition): {offset, ...}}, exception or None)`` runs
        after each acknowledgement batch a leader answers."""
        self._callback = callback

    def acknowledge(
        self, record: ShareRecord, kind: AcknowledgeType = _ACK, *, error: Exception | None = None
    ) -> None:
        """Acknowledge a record returned by the last poll (sent with the next poll or commit).

        ``RENEW`` (KIP-1222) extends the record's acquisition lock instead: the record stays to
        be acknowledged (with ACCEPT, RELEASE or REJECT; in explicit mode before the next poll).
        Send it with :meth:`commit_sync` while the work on the record goes on.

        ``error``: why you RELEASE or REJECT it, for the dead-letter headers (``queueflow.
        dead_letter.exception.*``; docs/guide.md "Dead-letter topics").

        Raises:
            IllegalStateError: the record was not delivered by the last poll, or was already
                acknowledged.
            ConfigurationError: ``kind`` is not ACCEPT, RELEASE, REJECT or RENEW.
        """
        self._check_open()
        key = (record.topic, record.partition, record.offset)
        if kind is AcknowledgeType.RENEW:  # KIP-1222: keep it, with a fresh lock
            if key not in self._delivered:
                raise IllegalStateError(
                    f"{record.topic}[{record.partition}]@{record.offset} was not returned by the "
                    "last poll or is already acknowledged; only those can be renewed"
                )
            self._require_session().acknowledge(
                TopicPartition(record.topic, record.partition), record.offset, kind
            )
            return
        if kind not in (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT):
            raise ConfigurationError(
                f"acknowledge type {kind!r}; use ACCEPT, RELEASE, REJECT or RENEW"
            )
        if self._delivered.pop(key, None) is None:
            raise IllegalStateError(
                f"{record.topic}[{record.partition}]@{record.offset} was not returned by the last "
                "poll or is already acknowledged"
            )
        session, tp = self._require_session(), TopicPartition(record.topic, record.partition)
        session.acks.add(tp, record.offset, kind, None if error is None else AckError.of(error))
        if kind is AcknowledgeType.RELEASE:
            session.remember_released(record)

    async def poll(self, timeout_ms: int = 1000) -> list[ShareRecord]:
        """Fetch records from the assigned share-partitions.

        In implicit mode, records of the previous poll not yet acknowledged are ACCEPTed first.

        Args:
            timeout_ms: the longest to wait for records, in ms.

        Returns:
            Records, each share-partition's in increasing offset order; [] on timeout.

        A share-partition whose leader fails (a timeout while it fails over, corrupt state)
        yields nothing and is retried on the next poll; its error is in
        :attr:`partition_errors` and logged once as ``share_fetch_error``.

        Raises:
            IllegalStateError: explicit mode with unacknowledged records, or not subscribed.
            ShareGroupError: a non-retriable error (see :attr:`ErrorCode.retriable`).
        """
        session = self._require_session()
        self._settle_previous()
        clock = self.ctx.clock
        deadline = clock.monotonic() + timeout_ms / 1000
        backoff = 0.005
        inflight = self._inflight
        while True:
            remaining = max(deadline - clock.monotonic(), 0.0)
            pending_acks = set(session.acks.partitions())
            for tp in [tp for tp in inflight if tp not in session.assignment]:
                await session.end_long_polls(tp)  # reassigned: the parked fetch ends now
            started = self._start_fetches(session, pending_acks, remaining)
            if not inflight:
                await asyncio.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, 0.1)
                if clock.monotonic() >= deadline:
                    return []
                continue
            # Like a KIP-932 ShareFetch with MinBytes: return as soon as any share-partition
            # has records; long polls of the others carry on into the next poll.
            if remaining > 0:
                # A reassignment also ends the wait: the loop then ends lost partitions' polls.
                session.assignment_changed.clear()
                changed = asyncio.ensure_future(session.assignment_changed.wait())
                done, _ = await asyncio.wait(
                    [*inflight.values(), changed],
                    timeout=remaining,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                changed.cancel()
            else:  # poll(0): one round trip of the fetches that don't wait
                if started:
                    await asyncio.wait(started)
                done = {task for task in inflight.values() if task.done()}
            records: list[ShareRecord] = []
            long_polled = False
            for tp, task in list(inflight.items()):
                if task in done:
                    del inflight[tp]
                    result = task.result()
                    if result is not None:
                        records += result.records
                        long_polled = long_polled or result.long_polled
            if records or clock.monotonic() >= deadline:
                for r in records:
                    self._delivered[(r.topic, r.partition, r.offset)] = r
                return records
            if not long_polled:  # answered empty at once (request topic, errors): back off
                await asyncio.sleep(min(backoff, max(deadline - clock.monotonic(), 0)))
                backoff = min(backoff * 2, 0.1)

    def _start_fetches(
        self, session: ShareFetchSession, pending_acks: set[TopicPartition], remaining: float
    ) -> list[asyncio.Task[FetchResult | None]]:
        """Start a ShareFetch (held up to ``remaining`` s) of each share-partition assigned or
        with ``pending_acks`` that has none under way; returns them."""
        inflight, started = self._inflight, []
        wait_ms = min(self.settings.fetch_max_wait_ms, int(remaining * 1000))
        for tp in sorted(session.assignment | pending_acks):
            if tp in inflight:
                if tp in pending_acks:
                    self._acknowledge_now(tp)  # don't wait for the long poll to end
                continue
            if tp in session.assignment:
                session.prepare(tp)  # idempotent: its reader connects once
            inflight[tp] = asyncio.ensure_future(self._fetch(tp, tp in session.assignment, wait_ms))
            started.append(inflight[tp])
        return started

    def _acknowledge_now(self, tp: TopicPartition) -> None:
        """Send ``tp``'s pending acknowledgements alone (ShareAcknowledge) while its ShareFetch
        is held by the leader (KIP-932: acknowledgements need not wait for a fetch)."""
        task = self._acking.get(tp)
        if task is None or task.done():
            self._acking[tp] = asyncio.ensure_future(self._require_session().flush(tp))

    async def _fetch(
        self, tp: TopicPartition, assigned: bool, max_wait_ms: int = 0
    ) -> FetchResult | None:
        session = self._require_session()
        try:
            result = await session.fetch(tp, self.max_poll_records if assigned else 0, max_wait_ms)
        except ShareGroupError as exc:
            if not exc.code.retriable:
                raise
            self._note_error(tp, exc)  # e.g. a leader failing over: try again next poll
            return None
        if result.error is not None:
            self._note_error(tp, result.error)
        else:
            self.partition_errors.pop(tp, None)
        return result

    def _note_error(self, tp: TopicPartition, error: ShareGroupError) -> None:
        if tp not in self.partition_errors:
            log.error(
                "share_fetch_error",
                group=self.group,
                member_id=self.member_id,
                topic=tp.topic,
                partition=tp.partition,
                error=error.code.value,
                detail=error.message,
            )
        self.partition_errors[tp] = error

    def _report(
        self, tp: TopicPartition, offsets: list[int], error: ShareGroupError | None
    ) -> None:
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
        both.

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

    async def close(self) -> None:
        """Acknowledge what is pending, release the records not acknowledged, and leave.

        In implicit mode the records of the last poll are released, not accepted (as
        ``KafkaShareConsumer.close`` does); explicit acknowledgements already given are sent.
        """
        if self._closed:
            return
        if self._session is not None:
            for result in await asyncio.gather(*self._inflight.values(), return_exceptions=True):
                if isinstance(result, FetchResult):  # acquired after the last poll: release
                    for record in result.records:
                        self._delivered[(record.topic, record.partition, record.offset)] = record
            self._inflight.clear()
            await asyncio.gather(*self._acking.values(), return_exceptions=True)
            self._acking.clear()
            for topic, partition, offset in list(self._delivered):
                self._session.acknowledge(
                    TopicPartition(topic, partition), offset, AcknowledgeType.RELEASE
                )
            self._delivered.clear()
            await self.commit_sync()
            await self._session.close(leave=True)
        self._closed = True

    async def __aenter__(self) -> ShareConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("this ShareConsumer is closed")

    def _require_session(self) -> ShareFetchSession:
        self._check_open()
        if self._session is None:
            raise IllegalStateError("call subscribe() before poll() or commit")
        return self._session
