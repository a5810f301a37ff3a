"""Where the local broker's files live, and which cluster to use: the Kafka version, the cache
of its jars, the CLI's data directory and the environment variables that override them."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "ENV_BROKER",
    "ENV_BROKER_JVM_OPTS",
    "ENV_CACHE_DIR",
    "ENV_HOME",
    "ENV_TOOL_JVM_OPTS",
    "INSTALL_HINT",
    "KAFKA_VERSION",
    "RESOURCES",
    "bootstrap_from_env",
    "cache_dir",
    "default_data_dir",
    "kafka_home",
]

#: The Apache Kafka release whose jars are resolved and run. The single place to change it.
KAFKA_VERSION = "4.3.1"

ENV_BROKER = "QUEUEFLOW_BROKER"
ENV_CACHE_DIR = "QUEUEFLOW_CACHE_DIR"
ENV_HOME = "QUEUEFLOW_HOME"
ENV_BROKER_JVM_OPTS = "QUEUEFLOW_BROKER_JVM_OPTS"
ENV_TOOL_JVM_OPTS = "QUEUEFLOW_TOOL_JVM_OPTS"

#: The package directory holding the resource files (pom.xml, *.properties templates).
RESOURCES = Path(__file__).resolve().parent

INSTALL_HINT = (
    "Java 17+ and Maven are the only prerequisites of the local Kafka broker. Install them, "
    "e.g. on Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless maven "
    "(macOS: brew install openjdk@17 maven), or set QUEUEFLOW_BROKER=host:port to use an "
    "existing Kafka 4.2+ cluster with share groups enabled."
)


def cache_dir() -> Path:
    """Return queueflow's cache directory (not created).

    ``$QUEUEFLOW_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/queueflow``, else
    ``~/.cache/queueflow``.
    """
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "queueflow"


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """Return the cache directory of one Kafka version: ``<cache_dir()>/kafka-<version>``."""
    return cache_dir() / f"kafka-{version}"


def default_data_dir() -> Path:
    """Return the CLI's default broker data directory (not created).

    ``$QUEUEFLOW_HOME/broker`` if ``QUEUEFLOW_HOME`` is set, else ``./.queueflow/broker``
    relative to the current directory (``.queueflow/`` is gitignored).
    """
    home = os.environ.get(ENV_HOME)
    base = Path(home).expanduser() if home else Path.cwd() / ".queueflow"
    return (base / "broker").absolute()


def bootstrap_from_env() -> str | None:
    """Return ``$QUEUEFLOW_BROKER`` (``host:port[,host:port...]`` of an existing cluster) or None.

    When it is set, tests and tools use that cluster and no local broker is started.
    """
    value = os.environ.get(ENV_BROKER, "").strip()
    return value or None
