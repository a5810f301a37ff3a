"""Developer tooling: the local Kafka broker (Apache Kafka jars from Maven Central) and the
``queueflow`` command line. Nothing in the runtime imports it."""
