"""The driver-side share-group member of a ``queueflow`` Spark source.

Spark calls a Python stream reader's ``initialOffset`` / ``latestOffset`` / ``commit`` in one
long-lived "streaming source runner" process on the driver (docs: the notes in
docs/spark.md, "How it works"). :class:`SparkMember` lives there: a daemon thread runs an
asyncio loop hosting one :class:`~queueflow.member.session.ShareFetchSession` (membership,
heartbeats, acquisitions, acknowledgements, lock renewal), and its synchronous methods,
called from the runner's thread, run coroutines on that loop and wait for them.

It acquires offsets only (KIP-932 ShareFetch without reading payloads): the records are read
by the executors from the coordinates. It remembers which batch (``seq``) acquired what, so
that acknowledging a batch is idempotent, and renews the locks of acquired, unacknowledged
records every ``renew_interval_ms`` (KIP-1222 RENEW) until they are acknowledged. When the
runner process dies, the renewals stop and the leaders hand the records out again once their
locks expire (or the member's session times out).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import KafkaError

from queueflow.errors import ShareGroupError
from queueflow.kafka.startup import wait_for_broker
from queueflow.member.context import MemberContext
from queueflow.member.session import ShareFetchSession
from queueflow.settings import ShareGroupSettings
from queueflow.spark.options import SourceOptions
from queueflow.spark.outcomes import OutcomeRange, OutcomeReader
from queueflow.structs import AcknowledgeType, TopicPartition

__all__ = ["AcquiredRange", "SparkMember"]

log = structlog.get_logger("queueflow.spark.member")

#: ``(topic, partition, first, last, delivery_count)``: offsets ``first..last`` (inclusive),
#: acquired with that delivery count; the form they take in the source's offsets.
AcquiredRange = tuple[str, int, int, int, int]

T = TypeVar("T")

#: Extra seconds a synchronous call waits beyond its own deadline for the loop to answer.
_CALL_SLACK_S = 30.0


def _count(ranges: list[AcquiredRange]) -> int:
    return sum(last - first + 1 for _, _, first, last, _ in ranges)


def _split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal non-negative integers, largest first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class SparkMember:
    """A share-group member driven by Spark's streaming source runner (thread-safe, sync).

    Args:
        options: the source's options.
        settings: share-group settings (default: :meth:`ShareGroupSettings.load`, i.e. the
            environment and defaults); ``max_poll_records`` and ``request_timeout_ms`` are used
            here.
        client_id: the Kafka client id of the member's clients.
    """

    def __init__(
        self,
        options: SourceOptions,
        settings: ShareGroupSettings | None = None,
        client_id: str = "queueflow-spark",
    ) -> None:
        self.options = options
        self.settings = settings or ShareGroupSettings.load()
        self.client_id = client_id
        self.session: ShareFetchSession | None = None
        #: Acquired, not yet acknowledged: batch seq → its ranges.
        self.batches: dict[int, list[AcquiredRange]] = {}
        #: Outcomes read from the outcomes topic for held records: seq → {(tp, offset): kind}.
        self.overrides: dict[int, dict[tuple[str, int, int], AcknowledgeType]] = {}
        #: Counters: acquired, accepted, released, rejected, renewed (offsets), ack_errors.
        self.stats: dict[str, int] = dict.fromkeys(
            ("acquired", "accepted", "released", "rejected", "renewed", "ack_errors"), 0
        )
        #: The lock duration (ms) the leaders last reported, 0 before the first acquisition.
        self.lock_timeout_ms = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock: asyncio.Lock | None = None
        self._outcomes: OutcomeReader | None = None
        self._renewer: asyncio.Task[None] | None = None
        #: Share-partitions an availableNow run stopped acquiring from (they reached the target).
        self._exhausted: set[TopicPartition] = set()
        self._guard = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """True once :meth:`start` succeeded (until :meth:`close`)."""
        return self.session is not None

    @property
    def member_id(self) -> str | None:
        """The member id once started."""
        return None if self.session is None else self.session.member_id

    def start(self) -> None:
        """Start the loop thread, join the group and wait (up to the request timeout) for an
        assignment; idempotent.

        Raises:
            BrokerError: the cluster did not answer within ``queueflow.request.timeout.ms``
                (or ``queueflow.broker.wait.ms`` if lower); the message names the bootstrap
                servers, the cause (refused, unresolvable host, TLS, SASL) and what to do.
            ConfigurationError: a topic does not exist (the message names it).
            ShareGroupError: ``REQUEST_TIMED_OUT`` when no coordinator answers (no leader
                worker runs for ``app.id``).
        """
        with self._guard:
            if self.session is not None:
                return
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="queueflow-spark-member", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
            try:
                self._call(self._start(), self.settings.request_timeout_ms * 3 / 1000)
            except BaseException:
                self._stop_loop()
                raise

    async def _start(self) -> None:
        opts = self.options
        kafka = opts.kafka_config(self.client_id)
        # Fail fast, with the cause, when the cluster can't be reached: at most the request
        # timeout (not queueflow.broker.wait.ms, which outlasts start()'s own deadline).
        limit_ms = min(self.settings.broker_wait_ms, self.settings.request_timeout_ms)
        await wait_for_broker(kafka, limit_ms, who="queueflow Spark source")
        ctx = MemberContext.for_kafka(kafka, opts.app_id, self.settings)
        session = ShareFetchSession(
            ctx, opts.group, opts.topics, self.client_id, opts.lock_duration_ms
        )
        outcomes = OutcomeReader(kafka, opts.app_id, opts.group)
        try:
            await session.start()
            await outcomes.start()
            await self._await_assignment(session, self.settings.request_timeout_ms / 1000)
        except BaseException:
            await session.close(leave=True)
            await outcomes.close()
            raise
        self._lock = asyncio.Lock()
        self.session, self._outcomes = session, outcomes
        self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        log.info(
            "spark_member_started",
            group=opts.group,
            member_id=session.member_id,
            topics=list(opts.topics),
            assignment=sorted(session.assignment),
        )

    @staticmethod
    async def _await_assignment(session: ShareFetchSession, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not session.assignment and loop.time() < deadline:
            changed = session.assignment_changed
            try:
                await asyncio.wait_for(changed.wait(), max(deadline - loop.time(), 0.001))
            except TimeoutError:
                break
            changed.clear()
        if not session.assignment:
            log.warning("spark_member_no_assignment", group=session.group, waited_s=timeout_s)

    def close(self) -> None:
        """Leave the group (the leaders release what this member holds) and stop the thread."""
        with self._guard:
            if self._loop is None:
                return
            try:
                if self.session is not None:
                    self._call(self._close(), self.settings.request_timeout_ms / 1000)
            finally:
                self.session = None
                self._stop_loop()

    async def _close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        if self.session is not None:
            await self.session.flush_all()
            await self.session.close(leave=True)
        if self._outcomes is not None:
            await self._outcomes.close()

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the queueflow Spark member is not running")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout_s + _CALL_SLACK_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"the queueflow Spark member did not answer in {timeout_s} s"
            ) from None

    # -- acquiring -------------------------------------------------------------------------
    def acquire(
        self,
        seq: int,
        max_records: int,
        timeout_ms: int,
        below: Mapping[TopicPartition, int] | None = None,
    ) -> list[AcquiredRange]:
        """Acquire up to ``max_records`` offsets across the assigned share-partitions as batch
        ``seq``, waiting up to ``timeout_ms`` for the first ones (KIP-932 ShareFetch, no
        payloads; pending acknowledgements ride along).

        Args:
            seq: the batch these offsets belong to (acknowledged by
                :meth:`acknowledge_through`).
            max_records: the most offsets to acquire (> 0).
            timeout_ms: how long (ms) to wait when nothing is available.
            below: availableNow targets: offsets at or above ``below[tp]`` are released at
                once and ``tp`` is not asked again.

        Returns:
            The acquired ranges (empty when nothing was available in time).
        """
        self.start()
        return self._call(
            self._acquire(seq, max_records, timeout_ms, below),
            timeout_ms / 1000 + self.settings.request_timeout_ms / 1000,
        )

    async def _acquire(
        self,
        seq: int,
        max_records: int,
        timeout_ms: int,
        below: Mapping[TopicPartition, int] | None,
    ) -> list[AcquiredRange]:
        session, lock = self.session, self._lock
        assert session is not None and lock is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        out: list[AcquiredRange] = []
        backoff = 0.01
        while True:
            remaining = max_records
            active = sorted(tp for tp in session.assignment if tp not in self._exhausted)
            async with lock:
                while remaining > 0 and active:
                    active = active[:remaining]  # at least one offset per partition asked
                    shares = _split(remaining, len(active))
                    results = await asyncio.gather(
                        *(
                            self._acquire_one(session, tp, n, below)
                            for tp, n in zip(active, shares, strict=True)
                        ),
                    )
                    full: list[TopicPartition] = []
                    for tp, share, (ranges, more) in zip(active, shares, results, strict=True):
                        got = _count(ranges)
                        out.extend(ranges)
                        remaining -= got
                        if more and got >= share:
                            full.append(tp)  # it may have more
                    active = full
                if out:
                    self.batches[seq] = out
                    self.stats["acquired"] += _count(out)
                # Acknowledgements that found no acquisition to ride along with.
                await self._flush_all(session)
            if out or loop.time() >= deadline:
                return out
            await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
            backoff = min(backoff * 2, 0.1)

    async def _acquire_one(
        self,
        session: ShareFetchSession,
        tp: TopicPartition,
        max_records: int,
        below: Mapping[TopicPartition, int] | None,
    ) -> tuple[list[AcquiredRange], bool]:
        """Acquire from one share-partition; returns (ranges, whether to ask it again)."""
        try:
            acquisition = await session.acquire(tp, max_records)
        except (ShareGroupError, KafkaError) as exc:  # e.g. a leader failing over: next time
            log.warning(
                "spark_acquire_failed", topic=tp.topic, partition=tp.partition, error=repr(exc)
            )
            return [], False
        if acquisition.error is not None:
            log.warning(
                "spark_acquire_error",
                topic=tp.topic,
                partition=tp.partition,
                error=acquisition.error.code.value,
                detail=acquisition.error.message,
            )
            return [], False
        if acquisition.lock_timeout_ms:
            self.lock_timeout_ms = acquisition.lock_timeout_ms
        ranges: list[AcquiredRange] = []
        target = None if below is None else below.get(tp)
        trimmed = False
        for first, last, count in acquisition.ranges:
            if target is not None and last >= target:
                # availableNow: not ours to take in this run; hand it back at once.
                lo = max(first, target)
                session.acknowledge_range(tp, lo, last, AcknowledgeType.RELEASE)
                trimmed = True
                last = lo - 1
            if first <= last:
                ranges.append((tp.topic, tp.partition, first, last, count))
        if trimmed:
            self._exhausted.add(tp)
        return ranges, not trimmed

    def end_offsets(self) -> dict[TopicPartition, int]:
        """The log end offset of every partition of the subscribed topics (availableNow's
        target: records produced later are not part of the run)."""
        self.start()
        return self._call(self._end_offsets(), self.settings.request_timeout_ms / 1000)

    async def _end_offsets(self) -> dict[TopicPartition, int]:
        session = self.session
        assert session is not None
        tps = [
            KafkaTopicPartition(topic, p)
            for topic, count in session.partitions.items()
            for p in range(count)
        ]
        consumer = AIOKafkaConsumer(
            **self.options.kafka_config(self.client_id).client_kwargs(), enable_auto_commit=False
        )
        await consumer.start()
        try:
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        self._exhausted.clear()
        return {TopicPartition(tp.topic, tp.partition): end for tp, end in ends.items()}

    # -- acknowledging ---------------------------------------------------------------------
    def acknowledge_through(self, seq: int, flush: bool = True) -> int:
        """Acknowledge every held batch with seq <= ``seq``: the outcomes recorded for their
        records (:func:`queueflow.spark.acknowledge`), ACCEPT for the rest. Idempotent: a
        batch is acknowledged once, then forgotten.

        Args:
            seq: Spark committed every batch up to this one.
            flush: send the acknowledgements now and wait for the leaders (else they ride
                along with the next acquisition).

        Returns:
            How many offsets were acknowledged.

        Raises:
            TimeoutError: the outcomes topic could not be read up to its end (nothing is
                acknowledged; the records come back when their locks expire).
        """
        if self.session is None or not any(s <= seq for s in self.batches):
            return 0
        return self._call(
            self._acknowledge_through(seq, flush), self.settings.request_timeout_ms * 2 / 1000
        )

    async def _acknowledge_through(self, seq: int, flush: bool) -> int:
        session, lock, outcomes = self.session, self._lock, self._outcomes
        assert session is not None and lock is not None and outcomes is not None
        async with lock:
            self._apply_outcomes(await outcomes.read_to_end(self.settings.request_timeout_ms))
            done = 0
            for s in sorted(x for x in self.batches if x <= seq):
                ranges = self.batches.pop(s)
                overrides = self.overrides.pop(s, {})
                for topic, partition, first, last, _ in ranges:
                    tp = TopicPartition(topic, partition)
                    for lo, hi, kind in _runs(topic, partition, first, last, overrides):
                        session.acknowledge_range(tp, lo, hi, kind)
                        key = {
                            AcknowledgeType.ACCEPT: "accepted",
                            AcknowledgeType.RELEASE: "released",
                            AcknowledgeType.REJECT: "rejected",
                        }[kind]
                        self.stats[key] += hi - lo + 1
                done += _count(ranges)
            if flush:
                await self._flush_all(session)
            return done

    def _apply_outcomes(self, ranges: list[OutcomeRange]) -> None:
        """Note the outcomes of held records; ignore those of records not held."""
        ignored = 0
        for r in ranges:
            applied = 0
            for s, held in self.batches.items():
                for topic, partition, first, last, count in held:
                    if (topic, partition) != (r.topic, r.partition):
                        continue
                    if r.delivery_count and r.delivery_count != count:
                        continue  # an outcome of another delivery of these records
                    lo, hi = max(first, r.first), min(last, r.last)
                    if lo > hi:
                        continue
                    target = self.overrides.setdefault(s, {})
                    kind = AcknowledgeType(r.outcome)
                    for offset in range(lo, hi + 1):
                        target[(topic, partition, offset)] = kind
                    applied += hi - lo + 1
            ignored += (r.last - r.first + 1) - applied
        if ignored:
            log.debug("spark_outcomes_ignored", offsets=ignored, note="not held by this member")

    async def _flush_all(self, session: ShareFetchSession) -> None:
        for tp, error in (await session.flush_all()).items():
            if error is not None:
                self.stats["ack_errors"] += 1
                log.warning(
                    "spark_acknowledgement_failed",
                    topic=tp.topic,
                    partition=tp.partition,
                    error=str(error),
                    note="these records will be delivered again",
                )

    # -- lock renewal ----------------------------------------------------------------------
    def renew_interval_s(self) -> float:
        """Seconds between renewals: ``renewIntervalMs``, else a third of the lock duration
        (this member's, else the one the leaders reported, else the group setting)."""
        if self.options.renew_interval_ms:
            return self.options.renew_interval_ms / 1000
        lock_ms = (
            self.options.lock_duration_ms
            or self.lock_timeout_ms
            or self.settings.record_lock_duration_ms
        )
        return max(lock_ms / 3, 100) / 1000

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.renew_interval_s())
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep renewing: a leader may be failing over
                log.warning("spark_lock_renewal_failed", error=repr(exc))

    async def renew(self) -> int:
        """Renew the locks of every held record (KIP-1222 RENEW); returns how many offsets."""
        session, lock = self.session, self._lock
        if session is None or lock is None:
            return 0
        async with lock:
            tps: set[TopicPartition] = set()
            total = 0
            for ranges in self.batches.values():
                for topic, partition, first, last, _ in ranges:
                    tp = TopicPartition(topic, partition)
                    session.acknowledge_range(tp, first, last, AcknowledgeType.RENEW)
                    tps.add(tp)
                    total += last - first + 1
            for tp in sorted(tps):
                error = await session.flush(tp)
                if error is not None:
                    log.warning(
                        "spark_lock_renewal_refused",
                        topic=tp.topic,
                        partition=tp.partition,
                        error=str(error),
                    )
            self.stats["renewed"] += total
            return total


def _runs(
    topic: str,
    partition: int,
    first: int,
    last: int,
    overrides: Mapping[tuple[str, int, int], AcknowledgeType],
) -> list[tuple[int, int, AcknowledgeType]]:
    """``first..last`` as runs of equal outcome: the overrides, ACCEPT elsewhere."""
    if not overrides:
        return [(first, last, AcknowledgeType.ACCEPT)]
    runs: list[tuple[int, int, AcknowledgeType]] = []
    for offset in range(first, last + 1):
        kind = overrides.get((topic, partition, offset), AcknowledgeType.ACCEPT)
        if runs and runs[-1][2] is kind and runs[-1][1] == offset - 1:
            runs[-1] = (runs[-1][0], offset, kind)
        else:
            runs.append((offset, offset, kind))
    return runs
