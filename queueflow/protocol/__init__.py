"""The wire: control messages between members, leaders and the coordinator
(:mod:`~queueflow.protocol.messages`), the encoding of durable share-partition state
(:mod:`~queueflow.protocol.state_codec`) and of group metadata
(:mod:`~queueflow.protocol.group_codec`), and the names of queueflow's internal topics
(:mod:`~queueflow.protocol.topics`).

Depends on the engine's value types only; no Kafka client.
"""
