"""Start-time checks of ``queueflow.processing.guarantee=exactly_once``: can this worker's
principal, on this cluster, run Kafka transactions and read the ack topics? (docs/operations.md
"Exactly-once: ACLs and broker settings")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import stamina
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kafka_errors

from queueflow.errors import ConfigurationError
from queueflow.kafka.admin import admin_client
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.protocol import topics

__all__ = ["check_ack_topics_readable", "check_transactions"]

#: The broker settings a transaction coordinator needs, named when it stays unavailable.
_STATE_LOG = (
    "the broker's transaction coordinator is unavailable: its transaction state log "
    "(__transaction_state) can't be created or has too few in-sync replicas; on a cluster of "
    "fewer than 3 brokers set transaction.state.log.replication.factor (default 3) and "
    "transaction.state.log.min.isr (default 2) to at most the number of brokers"
)


async def check_transactions(
    kafka: KafkaClientConfig, app_id: str, transaction_timeout_ms: int, timeout_s: float = 30.0
) -> None:
    """Initialise a transactional producer (InitProducerId) with a transactional id of the
    members' prefix ``<app>-share-txn-``, then close it.

    Transient errors (the broker restarting, the transaction coordinator still loading: the
    retriable Kafka errors) are retried with back-off (0.5 s up to 5 s) for up to ``timeout_s``
    (s), so a worker started while its broker restarts waits instead of exiting.

    Raises:
        ConfigurationError: naming the missing ACL (WRITE/DESCRIBE on the transactional ids,
            IDEMPOTENT_WRITE on the cluster), the broker setting (the transaction state log's
            replication, ``transaction.max.timeout.ms``) or the last error.
    """
    prefix = topics.transactional_id_prefix(app_id)
    where = "queueflow.processing.guarantee=exactly_once"
    last: list[kafka_errors.KafkaError] = []

    async def init_producer_id() -> None:
        producer = AIOKafkaProducer(
            **kafka.client_kwargs(),
            transactional_id=f"{prefix}start-check",
            transaction_timeout_ms=transaction_timeout_ms,
            enable_idempotence=True,
        )
        try:
            await producer.start()
        except kafka_errors.KafkaError as exc:
            last.append(exc)
            raise
        finally:
            with contextlib.suppress(Exception):
                await stop_quietly("transaction check producer", producer.stop)

    async def attempts() -> None:
        async for attempt in stamina.retry_context(
            on=_retriable,
            attempts=None,
            timeout=None,  # bounded by wait_for below, which also cuts a back-off short
            wait_initial=0.5,
            wait_max=5.0,
            wait_jitter=0.1,
        ):
            with attempt:
                await init_producer_id()

    try:
        await asyncio.wait_for(attempts(), timeout_s)
    except kafka_errors.TransactionalIdAuthorizationFailed:
        raise ConfigurationError(
            f"{where}: the broker refused InitProducerId (TransactionalIdAuthorizationFailed): "
            f"this principal needs WRITE and DESCRIBE on the transactional ids with prefix "
            f"{prefix!r} (queueflow acls apply --exactly-once)"
        ) from None
    except kafka_errors.ClusterAuthorizationFailedError:
        raise ConfigurationError(
            f"{where}: the broker refused InitProducerId (ClusterAuthorizationFailed): this "
            "principal needs IDEMPOTENT_WRITE on the cluster (queueflow acls apply --exactly-once)"
        ) from None
    except kafka_errors.InvalidTransactionTimeout:
        raise ConfigurationError(
            f"{where}: queueflow.transaction.timeout.ms={transaction_timeout_ms} exceeds the "
            "broker's transaction.max.timeout.ms: lower it, or raise the broker's"
        ) from None
    except (TimeoutError, kafka_errors.KafkaError) as exc:
        error = last[-1] if last else exc
        raise ConfigurationError(
            f"{where}: no transactional producer could start within {timeout_s:g} s "
            f"(last error: {error!r}): {_STATE_LOG}"
        ) from None


def _retriable(exc: Exception) -> bool:
    """A Kafka error worth another InitProducerId (connection lost, coordinator loading)."""
    return isinstance(exc, kafka_errors.KafkaError) and bool(exc.retriable)


async def check_ack_topics_readable(
    kafka: KafkaClientConfig, ack_topics: Mapping[str, int], timeout_s: float = 30.0
) -> None:
    """Describe ``ack_topics`` (name -> partition count) and ask for the last stable offsets
    of their partitions read_committed, as a leader's ack reader will.

    Raises:
        ConfigurationError: this principal may not read an ack topic (naming the topics and the
            ACL), or the broker did not answer.
    """
    names = sorted(ack_topics)
    if not names:
        return
    unreadable = ConfigurationError(
        "queueflow.processing.guarantee=exactly_once: leaders need READ on the ack topics "
        f"{names} (queueflow acls apply --exactly-once); the broker refused "
        "TopicAuthorizationFailed"
    )
    admin = admin_client(kafka)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        described = await asyncio.wait_for(admin.describe_topics(names), timeout_s)
    except (TimeoutError, kafka_errors.KafkaError) as exc:
        raise ConfigurationError(
            f"queueflow.processing.guarantee=exactly_once: the ack topics {names} can't be "
            f"described: {exc!r}"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    if any(_error(topic) is kafka_errors.TopicAuthorizationFailedError for topic in described):
        raise unreadable
    consumer = AIOKafkaConsumer(
        **kafka.client_kwargs(), group_id=None, isolation_level="read_committed"
    )
    tps = [TopicPartition(name, p) for name in names for p in range(ack_topics[name])]
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        await asyncio.wait_for(consumer.end_offsets(tps), timeout_s)
    except kafka_errors.TopicAuthorizationFailedError:
        raise unreadable from None
    except (TimeoutError, kafka_errors.KafkaError) as exc:
        raise ConfigurationError(
            f"queueflow.processing.guarantee=exactly_once: the ack topics {names} can't be "
            f"read: {exc!r}"
        ) from None
    finally:
        await stop_quietly("ack topic check consumer", consumer.stop)


def _error(topic: object) -> type[Exception] | None:
    """The error class of one topic of a DescribeTopics (Metadata) answer."""
    code = topic.get("error_code", 0) if isinstance(topic, dict) else 0
    return kafka_errors.for_code(code) if code else None
