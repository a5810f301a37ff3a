"""The producers share agents publish their results with (the seam under
:mod:`queueflow.member.agent.publishing`).

:class:`ResultProducer` is what a :class:`~queueflow.member.context.MemberIO` hands out: on
Kafka, :class:`KafkaResultProducer` (acks=all, idempotent; transactional for an
``exactly_once`` agent); in memory, the in-process cluster's (:mod:`queueflow.testing.inprocess`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer

from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly

__all__ = ["Headers", "KafkaResultProducer", "ResultProducer"]

#: Record headers, in order.
Headers = Sequence[tuple[str, bytes]]


class ResultProducer(Protocol):
    """Produces encoded result records; a transactional one also runs transactions."""

    async def start(self) -> None:
        """Connect (for a transactional producer: also fence older producers of its id).

        Raises:
            Exception: the client could not start (aiokafka's errors on Kafka).
        """
        ...

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        partition: int | None,
    ) -> asyncio.Future[Any]:
        """Queue one record; the future resolves once the brokers acknowledged it (acks=all).

        Raises:
            Exception: the record can't be queued (an unknown topic after the request
                timeout; a closed producer).
        """
        ...

    async def check_topic(self, topic: str) -> None:
        """Make sure ``topic`` exists before anything is produced to it (metadata, cached).

        Raises:
            aiokafka.errors.UnknownTopicOrPartitionError: no such topic (after the request
                timeout on Kafka).
        """
        ...

    async def begin(self) -> None:
        """Begin a transaction (transactional producers only)."""
        ...

    async def commit(self) -> None:
        """Commit the transaction begun (transactional producers only).

        Raises:
            Exception: the commit failed; the transaction is aborted or must be.
        """
        ...

    async def abort(self) -> None:
        """Abort the transaction begun (transactional producers only)."""
        ...

    async def close(self) -> None:
        """Flush and disconnect (idempotent; never raises)."""
        ...


class KafkaResultProducer:
    """A :class:`ResultProducer` on Kafka: acks=all, idempotent, every wait bounded by
    ``request_timeout_ms`` (an unknown topic fails within it rather than aiokafka's 60 s).

    Args:
        kafka: the cluster.
        client_id: the Kafka client id.
        request_timeout_ms: the bound of every request and metadata wait (ms).
        transactional_id: makes it transactional (``None``: not).
        transaction_timeout_ms: the brokers abort a transaction open longer than this (ms).
    """

    def __init__(
        self,
        kafka: KafkaClientConfig,
        client_id: str,
        request_timeout_ms: int,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        extra: dict[str, Any] = {}
        if transactional_id is not None:
            extra = {
                "transactional_id": transactional_id,
                "transaction_timeout_ms": transaction_timeout_ms,
            }
        self._producer = AIOKafkaProducer(
            **kafka.client_kwargs(client_id),
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=request_timeout_ms,
            **extra,
        )
        self._started = False
        self._closed = False

    async def start(self) -> None:
        """See :meth:`ResultProducer.start`."""
        if not self._started:
            self._started = True
            await self._producer.start()

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        partition: int | None,
    ) -> asyncio.Future[Any]:
        """See :meth:`ResultProducer.send`."""
        fut: asyncio.Future[Any] = await self._producer.send(
            topic, value, key=key, headers=list(headers), partition=partition
        )
        return fut

    async def check_topic(self, topic: str) -> None:
        """See :meth:`ResultProducer.check_topic`."""
        await self._producer.partitions_for(topic)

    async def begin(self) -> None:
        """See :meth:`ResultProducer.begin`."""
        await self._producer.begin_transaction()

    async def commit(self) -> None:
        """See :meth:`ResultProducer.commit`."""
        await self._producer.commit_transaction()

    async def abort(self) -> None:
        """See :meth:`ResultProducer.abort`."""
        await self._producer.abort_transaction()

    async def close(self) -> None:
        """See :meth:`ResultProducer.close` (also after a failed :meth:`start`)."""
        if self._started and not self._closed:
            self._closed = True
            await stop_quietly("result producer", self._producer.stop)
