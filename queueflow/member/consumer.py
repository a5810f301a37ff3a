"""``ShareConsumer``: a plain share-group client for scripts, mirroring KIP-932's
``KafkaShareConsumer`` (subscribe, unsubscribe, subscription, poll, acknowledge by record or by
topic/partition/offset, commit_sync/commit_async, metrics, close with a timeout; KIP-1206
``share.acquire.mode``).

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
import math
import ssl
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from queueflow.errors import ConfigurationError, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig, check_control_auth
from queueflow.kafka.security import security_kwargs
from queueflow.member.acquire_mode import split_budget
from queueflow.member.browsing import Browsing
from queueflow.member.consumer_acks import AcknowledgingConsumer, CommitCallback, IllegalStateError
from queueflow.member.consumer_metrics import ShareConsumerMetrics
from queueflow.member.context import MemberContext
from queueflow.member.key_ordering import check_key_ordered, check_ordering
from queueflow.member.session import FetchResult, ShareFetchSession
from queueflow.settings import ShareAcquireMode, ShareGroupSettings, refuse_unknown_keywords
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

__all__ = ["CLOSE_TIMEOUT_MS", "CommitCallback", "IllegalStateError", "ShareConsumer"]

#: ``close()``'s bound when none is given, in ms (``KafkaShareConsumer.close()``'s 30 s).
CLOSE_TIMEOUT_MS = 30_000

log = structlog.get_logger("queueflow.member.consumer")
_ACK = AcknowledgeType.ACCEPT  # the default outcome


class ShareConsumer(AcknowledgingConsumer, Browsing):
    """A member of a share group.

    Args:
        group: the share group id.
        app_id: id of the queueflow app whose leaders serve this group.
        bootstrap_servers: ``host:port[,host:port]`` or a ``kafka://`` URL.
        acknowledgement_mode: ``"implicit"`` (default) or ``"explicit"``
            (``share.acknowledgement.mode``).
        max_poll_records: records acquired per share-partition per poll (``max.poll.records``;
            per poll across share-partitions with ``acquire_mode="record_limit"``).
        acquire_mode: ``"batch_optimized"`` or ``"record_limit"`` (KIP-1206
            ``share.acquire.mode``; default: the setting's, ``batch_optimized``).
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
        ordering: ``"key"``: :meth:`subscribe` refuses a group that is not key-ordered
            (``share.ordering``; docs/concepts.md "Key-ordered sharing"); default ``"none"``.

    Raises:
        ConfigurationError: an invalid mode, acquire mode, ordering or setting, an invalid
            combination of security arguments (the message names it), or a SASL/SSL cluster with
            ``queueflow.auth.mode=auto`` and no ``queueflow.auth.secret``.
    """

    @refuse_unknown_keywords
    def __init__(
        self,
        group: str,
        *,
        app_id: str,
        bootstrap_servers: str = "localhost:9092",
        acknowledgement_mode: str = "implicit",
        max_poll_records: int | None = None,
        acquire_mode: str | None = None,
        lock_duration_ms: int | None = None,
        settings: ShareGroupSettings | Mapping[str, Any] | None = None,
        client_id: str = "queueflow-share-consumer",
        context: MemberContext | None = None,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        ordering: str = "none",
    ) -> None:
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise ConfigurationError(
                f"share.acknowledgement.mode={acknowledgement_mode!r}; use 'implicit' or 'explicit'"
            )
        self.group = group
        self.app_id = app_id
        self.mode = acknowledgement_mode
        self.ordering = check_ordering(ordering)
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
        try:
            self.acquire_mode = ShareAcquireMode(acquire_mode or self.settings.share_acquire_mode)
        except ValueError:
            raise ConfigurationError(
                f"share.acquire.mode={acquire_mode!r}; use 'batch_optimized' or 'record_limit'"
            ) from None
        self._metrics = ShareConsumerMetrics(context.clock.monotonic())
        self._asked: dict[TopicPartition, int] = {}  # records each fetch under way asked for
        self._turn = 0  # which share-partition is first in line for a record_limit remainder
        self.lock_duration_ms = lock_duration_ms
        self.client_id = client_id
        self._session: ShareFetchSession | None = None
        self._delivered: dict[tuple[str, int, int], ShareRecord] = {}
        self._callback: CommitCallback | None = None
        self._closed = False
        # ShareFetches under way when a poll returned: their records go to a later poll.
        self._inflight: dict[TopicPartition, asyncio.Task[FetchResult | None]] = {}
        self._acking: dict[TopicPartition, asyncio.Task[ShareGroupError | None]] = {}
        #: The last ShareFetch error of each share-partition, ``{(topic, partition): error}``;
        #: cleared by the next answer without one (those are retried with back-off).
        self.partition_errors: dict[TopicPartition, ShareGroupError] = {}

    @property
    def member_id(self) -> str | None:
        """This member's id once subscribed."""
        return None if self._session is None else self._session.member_id

    def assignment(self) -> set[TopicPartition]:
        """The share-partitions the coordinator assigned to this member."""
        return set() if self._session is None else set(self._session.assignment)

    def subscription(self) -> set[str]:
        """The topics this consumer subscribes to (``KafkaShareConsumer.subscription()``);
        empty before :meth:`subscribe` and after :meth:`unsubscribe`."""
        return set() if self._session is None else set(self._session.topics)

    async def unsubscribe(self) -> None:
        """Leave the group, as :meth:`close` does (pending acknowledgements sent, records not
        acknowledged released), but stay usable: :meth:`subscribe` joins again
        (``KafkaShareConsumer.unsubscribe()``). Nothing happens when not subscribed.

        Raises:
            IllegalStateError: the consumer is closed.
        """
        self._check_open()
        await self._leave()

    def metrics(self) -> dict[str, dict[str, float]]:
        """The consumer's metrics by the Java client's metric group and name (Kafka's "Share
        Consumer Metrics"; see :mod:`queueflow.member.consumer_metrics`), e.g.
        ``metrics()["consumer-share-fetch-manager-metrics"]["records-consumed-total"]``."""
        snapshot = self._metrics.snapshot(self.ctx.clock.monotonic())
        snapshot["consumer-share-fetch-manager-metrics"]["assigned-partitions"] = float(
            len(self.assignment())
        )
        return snapshot

    async def subscribe(self, topics: Iterable[str]) -> None:
        """Join the share group subscribed to ``topics`` (exact names; no patterns).

        Raises:
            ConfigurationError: a topic doesn't exist, or the group is not key-ordered.
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
            if self.ordering == "key":  # the group must be key-ordered (member.key_ordering)
                check_key_ordered(self.group, self._session.router.membership.ticket)
        except BaseException:
            session, self._session = self._session, None
            await session.close(leave=False)  # leaves no client open behind the error
            raise

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
        self._metrics.poll_started(clock.monotonic())
        self._turn += 1
        records = await self._poll(session, timeout_ms)
        size = sum(len(r.raw_value or b"") + len(r.raw_key or b"") for r in records)
        self._metrics.poll_ended(clock.monotonic(), len(records), size)
        return records

    async def _poll(self, session: ShareFetchSession, timeout_ms: int) -> list[ShareRecord]:
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
                    self._asked.pop(tp, None)
                    result = task.result()
                    if result is not None:
                        records += _give_back_expiring(session, result.records)
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
        idle = sorted(session.assignment - inflight.keys())
        for tp in sorted(pending_acks & inflight.keys()):
            self._acknowledge_now(tp)  # don't wait for the long poll to end
        budgets = self._budgets(idle)
        for tp in sorted((session.assignment | pending_acks) - inflight.keys()):
            asked = budgets.get(tp, 0)
            if not asked and tp not in pending_acks:
                continue  # record_limit: no room left in this poll
            if asked:
                session.prepare(tp)  # idempotent: its reader connects once
            self._asked[tp] = asked
            inflight[tp] = asyncio.ensure_future(self._fetch(tp, asked, wait_ms if asked else 0))
            started.append(inflight[tp])
        return started

    def _budgets(self, idle: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Records to ask each assigned share-partition with no fetch under way for:
        ``max_poll_records`` each (``batch_optimized``), or what the fetches under way left of
        ``max_poll_records``, split among them (``record_limit``, KIP-1206)."""
        if self.acquire_mode is ShareAcquireMode.BATCH_OPTIMIZED:
            return dict.fromkeys(idle, self.max_poll_records)
        left = self.max_poll_records - sum(self._asked.get(tp, 0) for tp in self._inflight)
        return split_budget(left, idle, self._turn)

    def _acknowledge_now(self, tp: TopicPartition) -> None:
        """Send ``tp``'s pending acknowledgements alone (ShareAcknowledge) while its ShareFetch
        is held by the leader (KIP-932: acknowledgements need not wait for a fetch)."""
        task = self._acking.get(tp)
        if task is None or task.done():
            self._acking[tp] = asyncio.ensure_future(self._require_session().flush(tp))

    async def _fetch(
        self, tp: TopicPartition, max_records: int, max_wait_ms: int = 0
    ) -> FetchResult | None:
        session = self._require_session()
        try:
            result = await session.fetch(tp, max_records, max_wait_ms)
        except ShareGroupError as exc:
            if not exc.code.retriable:
                raise
            self._note_error(tp, exc)  # e.g. a leader failing over: try again next poll
            return None
        if max_records:
            self._metrics.fetched(result.round_trip_s, len(result.records))
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

    async def close(self, timeout_ms: int | None = None) -> None:
        """Acknowledge what is pending, release the records not acknowledged, and leave, within
        ``timeout_ms`` (``KafkaShareConsumer.close(Duration)``).

        In implicit mode the records of the last poll are released, not accepted (as
        ``KafkaShareConsumer.close`` does); explicit acknowledgements already given are sent.
        No error is reported for records another member finished after this one's lock
        elapsed (below the start offset): Kafka's broker skips them too.

        Args:
            timeout_ms: the longest close may take, in ms (default :data:`CLOSE_TIMEOUT_MS`,
                Kafka's 30 s; 0: at once). When it passes (a leader or the coordinator doesn't
                answer), the consumer is closed without waiting any more: what it held comes back
                when its locks or its session time out. Logged as
                ``share_consumer_close_timed_out``.
        """
        if self._closed:
            return
        limit_ms = CLOSE_TIMEOUT_MS if timeout_ms is None else max(timeout_ms, 0)
        try:
            await asyncio.wait_for(self._leave(), limit_ms / 1000)
        except asyncio.TimeoutError:
            log.warning(
                "share_consumer_close_timed_out",
                group=self.group,
                member_id=self.member_id,
                timeout_ms=limit_ms,
                note="closed without leaving: held records come back when their locks or the "
                "member's session time out",
            )
            await self._abandon()
        self._closed = True

    async def _leave(self) -> None:
        """Settle and leave the group (see :meth:`close`); the consumer stays open."""
        session = self._session
        if session is None:
            return
        for result in await asyncio.gather(*self._inflight.values(), return_exceptions=True):
            if isinstance(result, FetchResult):  # acquired after the last poll: given back
                _give_back_expiring(session, result.records, math.inf)
        self._inflight.clear()
        self._asked.clear()
        await asyncio.gather(*self._acking.values(), return_exceptions=True)
        self._acking.clear()
        for topic, partition, offset in list(self._delivered):
            session.acknowledge(TopicPartition(topic, partition), offset, AcknowledgeType.RELEASE)
        self._delivered.clear()
        await self.commit_sync()
        await session.close(leave=True)
        self._session = None
        self.partition_errors.clear()

    async def _abandon(self) -> None:
        """Stop every request under way and close the session's clients without leaving."""
        for task in [*self._inflight.values(), *self._acking.values()]:
            task.cancel()
        await asyncio.gather(
            *self._inflight.values(), *self._acking.values(), return_exceptions=True
        )
        self._inflight.clear()
        self._acking.clear()
        self._asked.clear()
        self._delivered.clear()
        session, self._session = self._session, None
        if session is not None:
            await session.close(leave=False)

    async def __aenter__(self) -> ShareConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _give_back_expiring(
    session: ShareFetchSession, records: list[ShareRecord], within_s: float = 1.0
) -> list[ShareRecord]:
    """``records`` without those whose lock ends within ``within_s`` (at most a tenth of the
    lock; fetched by a long poll that ended while the app did not poll; ``inf``: all): those
    are RELEASEd with their delivery given back, never having reached the app
    (docs/concepts.md "Delivery counts")."""
    now = session.ctx.clock.monotonic()

    def expiring(r: ShareRecord) -> bool:
        if within_s == math.inf:
            return True
        lock_s = r.lock_deadline - r.delivered_at  # delivered_at: when it was read
        return r.lock_deadline <= now + min(within_s, lock_s / 10)

    if not any(expiring(r) for r in records):
        return records
    kept = []
    for r in records:
        if not expiring(r):
            kept.append(r)
        else:
            tp = TopicPartition(r.topic, r.partition)
            session.acknowledge(tp, r.offset, AcknowledgeType.RELEASE, undelivered=True)
    return kept
