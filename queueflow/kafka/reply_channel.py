"""A request/reply channel over Kafka: keyed request records out, replies read back from one
partition of the app's reply topic (the transport of members and of the admin)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import UnknownTopicOrPartitionError

from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.protocol import topics as internal

__all__ = ["KafkaReplyChannel", "ReplyHandler"]

#: Called with the raw bytes of each reply addressed to the channel's key.
ReplyHandler = Callable[[bytes], None]


class KafkaReplyChannel:
    """Requests as records keyed by ``key``; replies with that key read from one randomly chosen
    partition of ``reply_topic``, from its end at :meth:`start` on.

    Args:
        kafka: the cluster.
        reply_topic: the app's reply topic (:func:`queueflow.protocol.topics.reply_topic`).
        key: the key of the requests and of the replies to hand over (a member or admin id).
        client_id: the Kafka client id.
        what: names the clients in log lines (``"member"``, ``"admin"``).
        acks: the producer's ``acks`` (``1`` or ``"all"``).
        wait_for_ack: :meth:`send` waits for the broker's acknowledgement (else it returns once
            the record is queued; a lost one is a missing answer, which the caller times out).
        reply_fetch_wait_ms: how long (ms) the broker may hold a fetch of the empty reply
            partition.
        also_key: replies keyed by this are handed over too (a member's sealed replies are
            keyed by a pseudonym, :func:`~queueflow.protocol.sealed_replies.reply_route`).
    """

    def __init__(
        self,
        kafka: KafkaClientConfig,
        reply_topic: str,
        key: str,
        client_id: str,
        *,
        what: str,
        acks: int | str = 1,
        wait_for_ack: bool = False,
        reply_fetch_wait_ms: int = 500,
        also_key: str | None = None,
    ) -> None:
        self.kafka = kafka
        self.reply_topic = reply_topic
        self.client_id = client_id
        self.reply_partition = random.randrange(internal.REPLY_PARTITIONS)
        self._key = key.encode()
        self._reply_keys = {self._key} | ({also_key.encode()} if also_key else set())
        self._what = what
        self._acks = acks
        self._wait_for_ack = wait_for_ack
        self._reply_fetch_wait_ms = reply_fetch_wait_ms
        self._producer: AIOKafkaProducer | None = None
        self._replies: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self, on_reply: ReplyHandler) -> None:
        """Start the producer and the reply consumer (at the reply partition's end, so every
        answer to a request sent afterwards is read); call ``on_reply(bytes)`` for each reply
        keyed by this channel from now on.

        Raises:
            aiokafka.errors.KafkaError: a client could not start.
        """
        self._producer = AIOKafkaProducer(
            **self.kafka.client_kwargs(self.client_id), linger_ms=0, acks=self._acks
        )
        await self._producer.start()
        self._replies = AIOKafkaConsumer(
            **self.kafka.client_kwargs(self.client_id),
            enable_auto_commit=False,
            fetch_max_wait_ms=self._reply_fetch_wait_ms,
        )
        await self._replies.start()
        tp = KafkaTopicPartition(self.reply_topic, self.reply_partition)
        self._replies.assign([tp])
        await self._replies.seek_to_end(tp)
        await self._replies.position(tp)
        self._reader = asyncio.create_task(
            self._read(on_reply), name=f"queueflow-{self._what}-replies"
        )

    async def _read(self, on_reply: ReplyHandler) -> None:
        assert self._replies is not None
        keys = self._reply_keys
        while True:
            batches = await self._replies.getmany(timeout_ms=1000)
            for messages in batches.values():
                for message in messages:
                    if message.key in keys and message.value is not None:
                        on_reply(message.value)

    async def send(self, topic: str, partition: int, payload: bytes) -> None:
        """Produce one request record to ``topic[partition]``, keyed by this channel.

        Raises:
            RuntimeError: :meth:`start` was not called.
            aiokafka.errors.UnknownTopicOrPartitionError: ``topic`` has no ``partition`` even
                after a metadata refresh (one added at runtime whose request partition the
                leader workers have not created yet).
            aiokafka.errors.KafkaError: the record could not be produced.
        """
        if self._producer is None:
            raise RuntimeError(f"the {self._what} transport's start() was not called")
        try:
            await self._send(topic, partition, payload)
        except AssertionError:
            # aiokafka's "Unrecognized partition": one added at runtime (docs/operations.md) that
            # this producer's metadata doesn't know yet; refresh it and try once more.
            await self._producer.client.force_metadata_update()
            try:
                await self._send(topic, partition, payload)
            except AssertionError:
                raise UnknownTopicOrPartitionError(
                    f"{topic} has no partition {partition} (yet)"
                ) from None

    async def _send(self, topic: str, partition: int, payload: bytes) -> None:
        assert self._producer is not None
        if self._wait_for_ack:
            await self._producer.send_and_wait(topic, payload, key=self._key, partition=partition)
        else:
            await self._producer.send(topic, payload, key=self._key, partition=partition)

    async def close(self) -> None:
        """Stop the reply reader, the consumer and the producer (idempotent)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        if self._replies is not None:
            await stop_quietly(f"{self._what} reply consumer", self._replies.stop)
            self._replies = None
        if self._producer is not None:
            await stop_quietly(f"{self._what} producer", self._producer.stop)
            self._producer = None
