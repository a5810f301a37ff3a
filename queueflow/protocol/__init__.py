"""The wire: control messages between members, leaders and the coordinator, the encoding of
durable state, and the names of queueflow's internal topics.

Depends on the engine's value types only; no Kafka client.
"""
