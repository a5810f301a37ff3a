"""Publishing a share agent's results before their outcome is recorded (at-least-once).

The runner (:mod:`queueflow.member.agent.runner`) hands a
:class:`~queueflow.member.agent.results.HandlerResult` with outputs to
:meth:`Publisher.publish`: every record is encoded (:class:`Encoder`: the destination's own
serializers), produced with acks=all, and every produce acknowledged by the brokers; only then
are the outcomes recorded in the session. A failure (an unknown topic, authorization, a value the
serializer can't encode, a timeout) RELEASEs every record of that handler call and logs one error
(``share_agent_results_not_published``) naming the topic and the error; nothing is acknowledged
for them. Agents that publish nothing never get here (no per-record cost) and never open a
producer. See docs/guide.md "Producing results".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError

from queueflow.errors import ConfigurationError
from queueflow.member.agent.outputs import Outbound
from queueflow.member.agent.results import HandlerResult, safe_repr
from queueflow.member.producer import Headers, ResultProducer
from queueflow.structs import AcknowledgeType

if TYPE_CHECKING:
    from queueflow.member.agent.core import ShareAgent

__all__ = ["Encoded", "Encoder", "PlainEncoder", "PublishError", "Publisher", "produce_all"]

#: How long (s) a topic found missing fails publishes at once before it is looked up again
#: (so that a missing sink costs one metadata wait per interval, not one per record).
MISSING_TOPIC_RECHECK_S = 5.0

#: One record ready to produce: topic, value, key, headers, partition.
Encoded = tuple[str, bytes | None, bytes | None, Headers, int | None]


class Encoder(Protocol):
    """Names destinations and encodes records for them with their serializers."""

    def topic_name(self, to: Any) -> str:
        """The topic name of destination ``to`` (a name, a Faust topic or agent)."""
        ...

    def encode(self, out: Outbound) -> tuple[bytes | None, bytes | None]:
        """``out``'s key and value as bytes (``bytes`` pass through; ``out.raw``: both are).

        Raises:
            Exception: the destination's serializer can't encode them.
        """
        ...


class PlainEncoder:
    """The :class:`Encoder` without Faust (a :class:`~queueflow.ShareConsumer`'s context, the
    in-process cluster): destinations are topic names; ``bytes`` pass through, a ``str`` key
    is UTF-8, anything else is JSON (Faust's default serializers: raw keys, json values)."""

    def topic_name(self, to: Any) -> str:
        """See :meth:`Encoder.topic_name`.

        Raises:
            TypeError: ``to`` is not a topic name.
        """
        if isinstance(to, str):
            return to
        name = getattr(to, "get_topic_name", None)
        if name is not None:
            return str(name())
        raise TypeError(f"a destination is a topic name; got {type(to).__name__}")

    def encode(self, out: Outbound) -> tuple[bytes | None, bytes | None]:
        """See :meth:`Encoder.encode`."""
        return _plain(out.key, key=True), _plain(out.value, key=False)


def _plain(value: Any, key: bool) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if key and isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


class PublishError(Exception):
    """Results could not be published.

    Attributes:
        topic: the destination topic.
        error: what failed (the serializer's or the client's error).
    """

    def __init__(self, topic: str, error: BaseException | str) -> None:
        self.topic = topic
        self.error = error
        super().__init__(f"{topic}: {safe_repr(error)}")


def encode_all(encoder: Encoder, outputs: Sequence[Sequence[Outbound]]) -> list[Encoded]:
    """Encode every record of ``outputs`` (per source record, in order).

    Raises:
        PublishError: a destination is not a topic, or its serializer failed.
    """
    out: list[Encoded] = []
    for records in outputs:
        for item in records:
            try:
                topic = encoder.topic_name(item.to)
            except Exception as exc:
                raise PublishError(safe_repr(item.to), exc) from exc
            try:
                key, value = encoder.encode(item)
            except Exception as exc:
                raise PublishError(topic, exc) from exc
            out.append((topic, value, key, item.headers, item.partition))
    return out


async def produce_all(
    producer: ResultProducer,
    records: Sequence[Encoded],
    current: list[str],
    sent: list[tuple[str, asyncio.Future[Any]]],
) -> None:
    """Produce ``records`` and wait until the brokers acknowledged each one.

    Every topic is looked up first, so a missing one fails before anything is produced (nothing
    half-published). ``current[0]`` names the topic being looked up, sent or awaited (for the
    error when this raises or is cancelled); ``sent`` collects the delivery futures (the caller
    retrieves their exceptions).

    Raises:
        Exception: what the producer raised (``UnknownTopicOrPartitionError``, an ACL error,
            a timeout...).
    """
    for topic in dict.fromkeys(topic for topic, *_ in records):
        current[0] = topic
        await producer.check_topic(topic)
    for topic, value, key, headers, partition in records:
        current[0] = topic
        sent.append((topic, await producer.send(topic, value, key, headers, partition)))
    for topic, fut in sent:
        current[0] = topic
        await fut


class Publisher:
    """Publishes one share agent's results at-least-once (see the module docstring).

    Args:
        agent: the share agent (its context, options, log).
        encoder: how destinations are named and records encoded.
    """

    def __init__(self, agent: ShareAgent, encoder: Encoder) -> None:
        self.agent = agent
        self.encoder = encoder
        self._producer: ResultProducer | None = None
        # Calls publish concurrently (runner: one task per call): one of them starts it.
        self._starting = asyncio.Lock()
        self._missing: dict[str, float] = {}  # topic -> when it was found missing

    def destinations(self) -> list[str]:
        """The topic names of the agent's ``sink=`` and ``dead_letter=``."""
        options = self.agent.options
        dead_letter = [] if options.dead_letter is None else [options.dead_letter]
        found = [*options.sink, *dead_letter]
        return list(dict.fromkeys(self.encoder.topic_name(to) for to in found))

    async def check_destinations(self) -> list[str]:
        """At start: look up the ``sink=``/``dead_letter=`` topics; log an error naming each
        missing one (``share_agent_sink_topic_missing``: records that need it will be
        RELEASEd) and return them."""
        missing: list[str] = []
        io, clock = self.agent.ctx.io, self.agent.ctx.clock
        for name in self.destinations():
            try:
                await io.partition_counts([name])
            except ConfigurationError as exc:
                missing.append(name)
                self._missing[name] = clock.monotonic()
                self.agent.log.error(
                    "share_agent_sink_topic_missing",
                    sink_topic=name,
                    error=str(exc),
                    note="records whose results go there are RELEASEd until it exists",
                )
        return missing

    async def producer(self) -> ResultProducer:
        """The agent's producer, started on first use (once, however many calls wait)."""
        async with self._starting:
            if self._producer is None:
                agent = self.agent
                producer = agent.ctx.io.result_producer(f"{agent.client_id}:results")
                try:
                    await producer.start()
                except BaseException:
                    await producer.close()
                    raise
                self._producer = producer
            return self._producer

    async def produce(self, records: list[Encoded]) -> None:
        """Produce ``records`` and wait until the brokers acknowledged every one, within
        ``queueflow.request.timeout.ms``.

        Raises:
            PublishError: naming the first topic that failed and its error.
        """
        clock = self.agent.ctx.clock
        now = clock.monotonic()
        for topic, *_ in records:
            found = self._missing.get(topic)
            if found is not None:
                if now - found < MISSING_TOPIC_RECHECK_S:
                    raise PublishError(topic, UnknownTopicOrPartitionError(topic))
                del self._missing[topic]
        try:
            producer = await self.producer()
        except Exception as exc:  # the broker unreachable: tried again on the next publish
            raise PublishError(records[0][0], exc) from exc
        timeout_s = self.agent.ctx.settings.request_timeout_ms / 1000
        sent: list[tuple[str, asyncio.Future[Any]]] = []
        current = [records[0][0]]  # the topic being sent or awaited

        try:
            await asyncio.wait_for(produce_all(producer, records, current, sent), timeout_s)
        except UnknownTopicOrPartitionError as exc:
            self._missing[current[0]] = clock.monotonic()
            raise PublishError(current[0], exc) from exc
        except (KafkaTimeoutError, asyncio.TimeoutError) as exc:
            raise PublishError(current[0], f"not acknowledged within {timeout_s} s") from exc
        except Exception as exc:
            raise PublishError(current[0], exc) from exc
        finally:
            for _, fut in sent:  # not awaited after a failure: their errors are known
                if fut.done() and not fut.cancelled():
                    fut.exception()

    async def publish(self, result: HandlerResult) -> HandlerResult:
        """Publish ``result.outputs``; the result to apply: ``result`` itself once every record
        is acknowledged by the brokers, else one RELEASEing every record (logged)."""
        assert result.outputs is not None
        try:
            await self.produce(encode_all(self.encoder, result.outputs))
        except PublishError as exc:
            self.not_published(result, exc)
            release = (AcknowledgeType.RELEASE,) * len(result.records)
            return result._replace(outcomes=release, outputs=None)
        return result

    def not_published(self, result: HandlerResult, exc: PublishError) -> None:
        """Log one error for a handler call whose results were not published."""
        runner = self.agent.runner
        records = result.records
        where = runner.where(records[0]) if len(records) == 1 else runner.where_batch(records)
        self.agent.log.error(
            "share_agent_results_not_published",
            sink_topic=exc.topic,
            error=safe_repr(exc.error),
            note="records RELEASEd, nothing acknowledged for them",
            **where,
        )

    async def close(self) -> None:
        """Close the producer (if one was opened)."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.close()
