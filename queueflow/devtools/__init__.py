"""Developer tooling: the local Kafka broker (Maven-resolved Apache Kafka jars) and the
``queueflow`` command line. Nothing in the runtime imports it."""
