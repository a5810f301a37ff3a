"""A Kafka-protocol listener: Kafka's own KIP-932 share consumers (Java ``KafkaShareConsumer``,
``kafka-console-share-consumer.sh``) join this app's share groups through it
(``queueflow.kafka.listener``; docs/kafka-listener.md).

Each Kafka-protocol member is a queueflow member
(:class:`~queueflow.member.session.ShareFetchSession`), so tickets, fencing, delivery counts and
group configs apply unchanged. Metadata names each share-partition's leader worker's listener
(:mod:`queueflow.listener.leadership`); a listener a member fetches from but does not heartbeat
to acts for it with the ticket the coordinator gives for it (:mod:`queueflow.listener.delegated`).
Frames are read and written with kio's Kafka protocol types.
"""

from queueflow.listener.server import KafkaListener, parse_listener

__all__ = ["KafkaListener", "parse_listener"]
