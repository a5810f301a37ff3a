"""What the member side is given: settings, the clock, metrics, and its link to the cluster.

A :class:`MemberContext` is built once per app (or per :class:`~queueflow.ShareConsumer`) and
passed to every member it runs. Its :class:`MemberIO` is the seam between members and the
cluster: :class:`KafkaMemberIO` in production, an in-process one
(:mod:`queueflow.testing.inprocess`) in unit tests.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Protocol

from queueflow.clock import SYSTEM_CLOCK, Clock
from queueflow.kafka.admin import partition_counts
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.startup import wait_for_broker, wait_for_topics
from queueflow.kafka.tls import member_ssl_context
from queueflow.member.browse import BrowseSource
from queueflow.member.browse_source import KafkaBrowseSource
from queueflow.member.producer import KafkaResultProducer, ResultProducer
from queueflow.member.reader import KafkaRecordReader, RecordSource
from queueflow.member.transport import KafkaMemberTransport, MemberTransport
from queueflow.metrics import Metrics
from queueflow.protocol import topics as internal
from queueflow.settings import ShareGroupSettings

__all__ = ["KafkaMemberIO", "MemberContext", "MemberIO"]


class MemberIO(Protocol):
    """How members of one app reach the cluster."""

    async def partition_counts(self, topics: list[str]) -> dict[str, int]:
        """Partition counts of ``topics``.

        Raises:
            ConfigurationError: a topic does not exist (the message says how to create it).
        """
        ...

    async def prepare(self, settings: ShareGroupSettings, topics: list[str]) -> dict[str, int]:
        """Wait until the cluster answers, check the source ``topics`` and wait until the app's
        internal topics exist; creates nothing (the app's leader workers create them).

        Returns:
            The partition counts of ``topics``.

        Raises:
            BrokerError: no broker within ``queueflow.broker.wait.ms``.
            ConfigurationError: a source topic does not exist, or no such app (its internal
                topics are missing after ``queueflow.member.join.timeout.ms``).
        """
        ...

    async def coordinator_partitions(self) -> int:
        """Partitions of the app's coordinator topic, once it exists (after :meth:`prepare`):
        a share group's coordinator is partition
        :func:`~queueflow.protocol.topics.coordinator_partition` of it, as a Kafka client's
        FindCoordinator finds the broker leading the group's partition of
        ``__consumer_offsets`` (docs/architecture.md "Coordinator sharding").

        Raises:
            ConfigurationError: the coordinator topic does not exist.
        """
        ...

    @property
    def principal(self) -> str:
        """The Kafka principal the member's clients authenticate as (``User:<name>`` with SASL
        PLAIN/SCRAM; ``""``: not known), bound into its assignment tickets."""
        ...

    def transport(
        self, member_id: str, client_id: str, reply_route: str | None = None
    ) -> MemberTransport:
        """A new (not started) request/reply transport for one member, whose requests are keyed
        by ``member_id`` and whose replies are those keyed by ``member_id`` or ``reply_route``
        (the pseudonym of its reply key that sealed replies are keyed by, with
        ``queueflow.auth.mode=hmac``; :func:`~queueflow.protocol.sealed_replies.reply_route`)."""
        ...

    def record_source(self) -> RecordSource:
        """A new reader of acquired records for one member."""
        ...

    def browse_source(self) -> BrowseSource:
        """What a browse reads: the app's changelogs and the source records
        (:mod:`queueflow.member.browse`)."""
        ...

    def result_producer(
        self,
        client_id: str,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> ResultProducer:
        """A new (not started) producer of a share agent's results (acks=all); transactional
        when ``transactional_id`` is given (``exactly_once``)."""
        ...


class KafkaMemberIO:
    """:class:`MemberIO` over a Kafka cluster.

    Args:
        kafka: the cluster.
        app_id: the app id whose leaders serve the members.
    """

    def __init__(
        self,
        kafka: KafkaClientConfig,
        app_id: str,
        request_timeout_ms: int = 30_000,
        check_crcs: bool = True,
    ) -> None:
        self.kafka = kafka
        self.app_id = app_id
        self.request_timeout_ms = request_timeout_ms
        self.check_crcs = check_crcs
        self._coordinator_partitions: int | None = None

    @property
    def principal(self) -> str:
        """See :attr:`MemberIO.principal`."""
        return self.kafka.principal

    async def partition_counts(self, topics: list[str]) -> dict[str, int]:
        """See :meth:`MemberIO.partition_counts`."""
        return await partition_counts(self.kafka, topics)

    async def prepare(self, settings: ShareGroupSettings, topics: list[str]) -> dict[str, int]:
        """See :meth:`MemberIO.prepare`."""
        await wait_for_broker(self.kafka, settings.broker_wait_ms, who="member")
        counts = await partition_counts(self.kafka, topics)
        names = [internal.coordinator_topic(self.app_id), internal.reply_topic(self.app_id)]
        await wait_for_topics(self.kafka, names, settings.join_timeout_ms, self.app_id)
        return counts

    async def coordinator_partitions(self) -> int:
        """See :meth:`MemberIO.coordinator_partitions`; read once (the count of a topic that
        exists never changes: queueflow refuses to re-hash groups)."""
        if self._coordinator_partitions is None:
            name = internal.coordinator_topic(self.app_id)
            counts = await partition_counts(self.kafka, [name])
            self._coordinator_partitions = counts[name]
        return self._coordinator_partitions

    def transport(
        self, member_id: str, client_id: str, reply_route: str | None = None
    ) -> MemberTransport:
        """See :meth:`MemberIO.transport`."""
        return KafkaMemberTransport(
            self.kafka, self.app_id, member_id, client_id, reply_route=reply_route
        )

    def record_source(self) -> RecordSource:
        """See :meth:`MemberIO.record_source`."""
        return KafkaRecordReader(self.kafka, check_crcs=self.check_crcs)

    def browse_source(self) -> BrowseSource:
        """See :meth:`MemberIO.browse_source`."""
        return KafkaBrowseSource(self.kafka, self.request_timeout_ms)

    def result_producer(
        self,
        client_id: str,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> ResultProducer:
        """See :meth:`MemberIO.result_producer`; every wait bounded by
        ``queueflow.request.timeout.ms``."""
        return KafkaResultProducer(
            self.kafka,
            client_id,
            self.request_timeout_ms,
            transactional_id,
            transaction_timeout_ms,
        )


@dataclass(slots=True)
class MemberContext:
    """Everything the members of one app share.

    Args:
        app_id: the app id whose leaders and coordinator serve the members.
        settings: share-group settings.
        io: the link to the cluster.
        clock: wall and monotonic time.
        metrics: where member metrics go.
        direct_ssl: the TLS client context for the leaders' direct endpoints
            (:func:`queueflow.kafka.tls.member_ssl_context`); ``None``: plaintext.
    """

    app_id: str
    settings: ShareGroupSettings
    io: MemberIO
    clock: Clock = SYSTEM_CLOCK
    metrics: Metrics = field(default_factory=Metrics)
    direct_ssl: ssl.SSLContext | None = None

    @classmethod
    def for_kafka(
        cls,
        kafka: KafkaClientConfig,
        app_id: str,
        settings: ShareGroupSettings,
        metrics: Metrics | None = None,
    ) -> MemberContext:
        """The context of members on a Kafka cluster.

        Raises:
            ConfigurationError: a ``queueflow.leader.listener.ssl.*`` file can't be loaded.
        """
        io = KafkaMemberIO(kafka, app_id, settings.request_timeout_ms, settings.check_crcs)
        direct_ssl = member_ssl_context(settings, kafka)
        return cls(app_id, settings, io, metrics=metrics or Metrics(), direct_ssl=direct_ssl)
