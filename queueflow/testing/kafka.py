"""Producing test records to a real cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from aiokafka import AIOKafkaProducer

__all__ = ["produce"]


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


async def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | str],
    *,
    keys: Sequence[bytes | str | None] | None = None,
    partitions: int | None = None,
    partition: int | None = None,
    acks: int | str = 1,
    linger_ms: int = 0,
    enable_idempotence: bool = False,
    window: int = 5000,
    timeout_s: float = 120.0,
) -> list[tuple[int, int]]:
    """Produce ``values`` to ``topic`` in order and wait until every one is acknowledged.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        topic: an existing topic.
        values: record values; ``str`` is UTF-8 encoded.
        keys: one key per value (same length), or None for no keys.
        partitions: if given, value ``i`` goes to partition ``i % partitions`` (round-robin).
        partition: if given (and ``partitions`` is not), every value goes to this partition.
            With neither, the producer's partitioner chooses.
        acks: the producer's ``acks`` (``0``, ``1`` or ``"all"``).
        linger_ms: the producer's ``linger_ms``.
        enable_idempotence: the producer's ``enable_idempotence``.
        window: at most this many records are awaited together (bounds memory).
        timeout_s: overall bound in seconds, from connecting to the last acknowledgement.

    Returns:
        ``(partition, offset)`` of each value, in the order given.

    Raises:
        asyncio.TimeoutError: not everything was acknowledged within ``timeout_s``.
        aiokafka.errors.KafkaError: the broker refused a record.
    """
    return await asyncio.wait_for(
        _produce(
            bootstrap,
            topic,
            list(values),
            keys,
            partitions,
            partition,
            acks,
            linger_ms,
            enable_idempotence,
            window,
        ),
        timeout_s,
    )


async def _produce(
    bootstrap: str,
    topic: str,
    values: list[bytes | str],
    keys: Sequence[bytes | str | None] | None,
    partitions: int | None,
    partition: int | None,
    acks: int | str,
    linger_ms: int,
    enable_idempotence: bool,
    window: int,
) -> list[tuple[int, int]]:
    if keys is not None and len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys for {len(values)} values")
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=acks,
        linger_ms=linger_ms,
        enable_idempotence=enable_idempotence,
    )
    await producer.start()
    where: list[tuple[int, int]] = []
    try:
        for lo in range(0, len(values), window):
            futures = []
            for i in range(lo, min(lo + window, len(values))):
                target = i % partitions if partitions else partition
                key = _as_bytes(keys[i]) if keys is not None else None
                futures.append(
                    await producer.send(topic, _as_bytes(values[i]), key=key, partition=target)
                )
            for meta in await asyncio.gather(*futures):
                where.append((meta.partition, meta.offset))
    finally:
        await producer.stop()
    return where
