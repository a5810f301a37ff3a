"""A local single-node Apache Kafka broker (KRaft, broker + controller) for development and tests.

Java 17+ and Maven are the only prerequisites. The Kafka jars are resolved from Maven Central
once, into a cache outside the repository::

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
* ``JAVA_HOME``: if set, ``$JAVA_HOME/bin/java`` is used instead of ``java`` on ``PATH``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from queueflow.errors import BrokerError

__all__ = [
    "DEFAULT_BROKER_JVM_OPTS",
    "DEFAULT_TOOL_JVM_OPTS",
    "KAFKA_VERSION",
    "TOOL_ALIASES",
    "BrokerError",
    "BrokerStatus",
    "LocalBroker",
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
    "run_kafka_tool",
]

log = logging.getLogger(__name__)

#: The Apache Kafka release whose jars are resolved and run. The single place to change it.
KAFKA_VERSION = "4.3.1"

#: Broker JVM options unless ``QUEUEFLOW_BROKER_JVM_OPTS`` is set (split like a shell would).
DEFAULT_BROKER_JVM_OPTS = "-Xms256m -Xmx768m -XX:+UseSerialGC"
#: Kafka tool JVM options unless ``QUEUEFLOW_TOOL_JVM_OPTS`` is set.
DEFAULT_TOOL_JVM_OPTS = "-Xms32m -Xmx512m -XX:+UseSerialGC"

#: Short names accepted by :func:`run_kafka_tool` (and ``queueflow broker tool``).
TOOL_ALIASES: Mapping[str, str] = {
    "configs": "kafka.admin.ConfigCommand",
    "console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "features": "org.apache.kafka.tools.FeatureCommand",
    "groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "producer-perf": "org.apache.kafka.tools.ProducerPerformance",
    "share-consumer-perf": "org.apache.kafka.tools.ShareConsumerPerformance",
    "share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "storage": "kafka.tools.StorageTool",
    "topics": "org.apache.kafka.tools.TopicCommand",
}

ENV_BROKER = "QUEUEFLOW_BROKER"
ENV_CACHE_DIR = "QUEUEFLOW_CACHE_DIR"
ENV_HOME = "QUEUEFLOW_HOME"
ENV_BROKER_JVM_OPTS = "QUEUEFLOW_BROKER_JVM_OPTS"
ENV_TOOL_JVM_OPTS = "QUEUEFLOW_TOOL_JVM_OPTS"

SHARE_VERSION = "share.version"
MIN_JAVA = 17

_INSTALL_HINT = (
    "Java 17+ and Maven are the only prerequisites of the local Kafka broker. Install them, "
    "e.g. on Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless maven "
    "(macOS: brew install openjdk@17 maven), or set QUEUEFLOW_BROKER=host:port to use an "
    "existing Kafka 4.2+ cluster with share groups enabled."
)
_RESOURCES = Path(__file__).resolve().parent
_RESOLVED_MARKER = ".resolved"
_LOG_TAIL_LINES = 40

# Log4j2 configuration of short-lived tool JVMs: warnings and errors to stderr only.
_TOOLS_LOG4J2 = """\
# Written by queueflow.devtools.broker.run_kafka_tool: Kafka tools log WARN and above to stderr.
name = queueflow-kafka-tools
status = error
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
"""

_T = TypeVar("_T")


# --------------------------------------------------------------------------------------------
# Locations and prerequisites
# --------------------------------------------------------------------------------------------


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


def find_java() -> str:
    """Return the path of a Java 17+ ``java`` executable.

    ``$JAVA_HOME/bin/java`` is preferred when ``JAVA_HOME`` is set, else ``java`` on ``PATH``.

    Raises:
        BrokerError: no ``java`` was found, or it is older than Java 17 (the message says what
            to install).
    """
    java: str | None = None
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
        java = str(Path(java_home) / "bin" / "java")
    java = java or shutil.which("java")
    if java is None:
        raise BrokerError(f"`java` was not found on PATH. {_INSTALL_HINT}")
    major = _java_major(java)
    if major < MIN_JAVA:
        raise BrokerError(
            f"{java} is Java {major}; Kafka {KAFKA_VERSION} brokers need Java {MIN_JAVA}+. "
            f"Install a newer JDK/JRE or point JAVA_HOME at one. {_INSTALL_HINT}"
        )
    return java


def _java_major(java: str) -> int:
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(f"could not run `{java} -version`: {exc}. {_INSTALL_HINT}") from exc
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        raise BrokerError(f"could not parse the Java version from `{java} -version`: {text!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_412" is Java 8
        major = int(match.group(2))
    return major


def _find_mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            "`mvn` (Apache Maven) was not found on PATH; it is needed once to download the "
            f"Kafka {KAFKA_VERSION} jars. {_INSTALL_HINT}"
        )
    return mvn


def kafka_libs() -> Path:
    """Resolve the Kafka broker + tools jars with Maven and return the directory holding them.

    The jars (``kafka_2.13``, ``kafka-tools``, log4j2 and their dependencies; ~90 jars) are
    copied into ``<kafka_home()>/libs``. A marker file records success, so later calls return
    at once; concurrent callers (several processes) serialise on a lock file. The first call
    takes ~10 s with a warm ``~/.m2`` and up to a few minutes on a cold one.

    Returns:
        The absolute ``libs`` directory; use ``f"{libs}/*"`` as the Java classpath.

    Raises:
        BrokerError: ``java`` (17+) or ``mvn`` is missing, or Maven failed (the message holds
            the tail of Maven's output).
    """
    home = kafka_home()
    libs = home / "libs"
    pom_text = (_RESOURCES / "pom.xml").read_text().replace("@KAFKA_VERSION@", KAFKA_VERSION)
    digest = hashlib.sha256(pom_text.encode()).hexdigest()
    marker = home / _RESOLVED_MARKER
    if _marker_ok(marker, digest) and libs.is_dir():
        return libs

    find_java()
    mvn = _find_mvn()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _marker_ok(marker, digest) and libs.is_dir():
            return libs
        log.info("Resolving Kafka %s jars with Maven into %s (once)", KAFKA_VERSION, libs)
        pom = home / "pom.xml"
        pom.write_text(pom_text)
        tmp = home / f"libs.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp}",
        ]
        started = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, cwd=home, capture_output=True, text=True, timeout=1800, check=False
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BrokerError(f"Maven did not finish within 1800 s: {shlex.join(cmd)}") from exc
        expected = [f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-tools-{KAFKA_VERSION}.jar"]
        missing = [jar for jar in expected if not (tmp / jar).is_file()]
        if proc.returncode != 0 or missing:
            shutil.rmtree(tmp, ignore_errors=True)
            output = _tail_text(proc.stdout + proc.stderr, _LOG_TAIL_LINES)
            raise BrokerError(
                f"Maven could not resolve the Kafka {KAFKA_VERSION} jars (exit "
                f"{proc.returncode}; missing {missing or 'nothing'}). It needs network access "
                f"to Maven Central or a mirror in ~/.m2/settings.xml.\n"
                f"command: {shlex.join(cmd)}\n--- Maven output (tail) ---\n{output}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        os.replace(tmp, libs)
        marker.write_text(digest + "\n")
        log.info(
            "Resolved %d jars in %.1f s", len(list(libs.glob("*.jar"))), time.monotonic() - started
        )
    return libs


def _marker_ok(marker: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest
    except OSError:
        return False


def _tools_log4j_config() -> Path:
    path = kafka_home() / "tools-log4j2.properties"
    with contextlib.suppress(OSError):
        if path.read_text() == _TOOLS_LOG4J2:
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(_TOOLS_LOG4J2)
    os.replace(tmp, path)
    return path


def _jvm_opts(env_var: str, default: str) -> list[str]:
    return shlex.split(os.environ.get(env_var) or default)


# --------------------------------------------------------------------------------------------
# Kafka tools
# --------------------------------------------------------------------------------------------


def run_kafka_tool(
    main_class: str,
    args: Sequence[str],
    timeout_s: float | None = 120,
    *,
    jvm_opts: Sequence[str] | None = None,
    capture_output: bool = True,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a Kafka command-line tool (a ``main`` class of the Kafka jars) in its own small JVM.

    Examples: ``org.apache.kafka.tools.FeatureCommand``,
    ``org.apache.kafka.tools.consumer.group.ShareGroupCommand``,
    ``org.apache.kafka.tools.ShareConsumerPerformance``, ``kafka.admin.ConfigCommand``. The short
    names in :data:`TOOL_ALIASES` (``"features"``, ``"share-groups"``, ...) are accepted too.
    Tools log WARN and above to stderr.

    Args:
        main_class: fully qualified main class, or a key of :data:`TOOL_ALIASES`.
        args: the tool's arguments, e.g. ``["--bootstrap-server", "127.0.0.1:9092", "describe"]``.
        timeout_s: seconds before the JVM is killed; None waits forever.
        jvm_opts: JVM options; default ``$QUEUEFLOW_TOOL_JVM_OPTS`` or
            :data:`DEFAULT_TOOL_JVM_OPTS` (small heap, serial GC).
        capture_output: capture stdout/stderr as text (else they are inherited and the result's
            ``stdout``/``stderr`` are None).
        check: raise BrokerError if the tool exits non-zero.

    Returns:
        The completed process; ``returncode`` is the tool's exit status.

    Raises:
        BrokerError: Java/Maven missing (see :func:`kafka_libs`), the timeout expired (the
            message holds the output so far), or ``check`` and a non-zero exit.
    """
    java = find_java()
    libs = kafka_libs()
    main = TOOL_ALIASES.get(main_class, main_class)
    opts = (
        list(jvm_opts)
        if jvm_opts is not None
        else _jvm_opts(ENV_TOOL_JVM_OPTS, DEFAULT_TOOL_JVM_OPTS)
    )
    cmd = [
        java,
        *opts,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={_tools_log4j_config()}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]
    log.debug("running %s", shlex.join(cmd))
    try:
        proc = subprocess.run(
            cmd,
            capture_output=capture_output,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = _as_text(exc.stdout) + _as_text(exc.stderr)
        raise BrokerError(
            f"{main} did not finish within {timeout_s} s: {shlex.join([main, *args])}\n"
            f"--- output so far (tail) ---\n{_tail_text(out, _LOG_TAIL_LINES)}"
        ) from exc
    if check and proc.returncode != 0:
        out = (proc.stdout or "") + (proc.stderr or "")
        raise BrokerError(
            f"{main} exited with {proc.returncode}: {shlex.join([main, *args])}\n"
            f"--- output (tail) ---\n{_tail_text(out, _LOG_TAIL_LINES)}"
        )
    return proc


def _as_text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


# --------------------------------------------------------------------------------------------
# Probing a broker from Python (no JVM)
# --------------------------------------------------------------------------------------------


def _run_coro(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion, also from code already inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="queueflow-broker") as ex:
        return ex.submit(asyncio.run, coro).result()


def _split_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    hosts = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise BrokerError(f"bad bootstrap address {item!r}; expected host:port")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compact_string(text: str) -> bytes:
    data = text.encode()
    return _uvarint(len(data) + 1) + data


class _Reader:
    """Cursor over a Kafka protocol buffer (just what ApiVersions v3 needs)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated Kafka response")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def compact_string(self) -> str:
        length = self.uvarint() - 1
        return "" if length <= 0 else self.take(length).decode()

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


async def _api_versions_features(host: str, port: int, timeout_s: float) -> dict[str, int]:
    """Send ApiVersions v3 and return the finalized features (name -> max version level)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    try:
        client_id = b"queueflow-probe"
        header = struct.pack(">hhih", 18, 3, 1, len(client_id)) + client_id + b"\x00"
        body = _compact_string("queueflow") + _compact_string("0") + b"\x00"
        payload = header + body
        writer.write(struct.pack(">i", len(payload)) + payload)
        await asyncio.wait_for(writer.drain(), timeout_s)
        size_bytes = await asyncio.wait_for(reader.readexactly(4), timeout_s)
        data = await asyncio.wait_for(
            reader.readexactly(struct.unpack(">i", size_bytes)[0]), timeout_s
        )
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    r = _Reader(data)
    r.int32()  # correlation id (ApiVersions responses always use response header v0)
    error_code = r.int16()
    if error_code != 0:
        raise BrokerError(f"ApiVersions v3 to {host}:{port} failed with error code {error_code}")
    for _ in range(r.uvarint() - 1):  # api_keys: key, min, max, tagged fields
        r.take(6)
        r.skip_tagged_fields()
    r.int32()  # throttle_time_ms
    features: dict[str, int] = {}
    for _ in range(r.uvarint()):
        tag, size = r.uvarint(), r.uvarint()
        field = r.take(size)
        if tag == 2:  # FinalizedFeatures: [name, max_version_level, min_version_level]
            fr = _Reader(field)
            for _ in range(fr.uvarint() - 1):
                name = fr.compact_string()
                max_level = fr.int16()
                fr.int16()
                fr.skip_tagged_fields()
                features[name] = max_level
    return features


def finalized_features(bootstrap: str, timeout_s: float = 5.0) -> dict[str, int]:
    """Return the cluster's finalized feature levels, e.g. ``{"share.version": 1, ...}``.

    Uses one ApiVersions (v3) request in Python, so no JVM is started. The first reachable
    address of ``bootstrap`` answers.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout_s: seconds for connecting and for the answer, per address.

    Raises:
        BrokerError: no address answered (the message names the last error).
    """
    last: Exception | None = None
    for host, port in _split_bootstrap(bootstrap):
        try:
            return _run_coro(_api_versions_features(host, port, timeout_s))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            last = exc
    raise BrokerError(f"no answer to ApiVersions from {bootstrap}: {last!r}")


async def _broker_count(bootstrap: str, timeout_s: float) -> int:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=max(int(timeout_s * 1000), 1000),
        client_id="queueflow-probe",
    )
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
        return len(cluster.get("brokers", []))
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def _probe(bootstrap: str, timeout_s: float) -> tuple[bool, int | None, str]:
    """Return (serving, share.version level or None, a one-line description)."""
    try:
        features = finalized_features(bootstrap, timeout_s)
    except BrokerError as exc:
        return False, None, str(exc)
    level = features.get(SHARE_VERSION)
    try:
        brokers = _run_coro(_broker_count(bootstrap, timeout_s))
    except Exception as exc:
        return False, level, f"metadata request failed: {exc!r}"
    if brokers < 1:
        return False, level, "metadata lists no live broker yet"
    return True, level, f"serving; {SHARE_VERSION}={level}"


def is_serving(bootstrap: str, timeout_s: float = 5.0) -> bool:
    """Return True if ``bootstrap`` answers ApiVersions and its metadata lists a live broker.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout_s: seconds allowed for each of the two requests. Never raises.
    """
    return _probe(bootstrap, timeout_s)[0]


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout_s: float = 30.0,
) -> None:
    """Create a topic with aiokafka's admin client and wait until every partition has a leader.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        name: topic name.
        partitions: number of partitions (>= 1).
        replication_factor: replicas per partition (1 on the local broker).
        config: topic configs, e.g. ``{"retention.ms": "60000"}``.
        exist_ok: do not fail if the topic already exists.
        timeout_s: overall bound in seconds, creation plus waiting for metadata.

    Raises:
        BrokerError: the broker refused the topic or it had no leaders within ``timeout_s``.
    """
    _run_coro(
        _create_topic(bootstrap, name, partitions, replication_factor, config, exist_ok, timeout_s)
    )


async def _create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str] | None,
    exist_ok: bool,
    timeout_s: float,
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    deadline = time.monotonic() + timeout_s
    timeout_ms = max(int(timeout_s * 1000), 1000)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        topic = NewTopic(name, partitions, replication_factor, topic_configs=dict(config or {}))
        response = await asyncio.wait_for(
            admin.create_topics([topic], timeout_ms=timeout_ms), timeout_s
        )
        for err in response.to_object()["topic_errors"]:
            code = err["error_code"]
            if code == 0 or (code == 36 and exist_ok):  # 36: TOPIC_ALREADY_EXISTS
                continue
            raise BrokerError(
                f"could not create topic {name!r}: error code {code} {err.get('error_message')}"
            )
        last: Any = None
        while time.monotonic() < deadline:
            last = (await admin.describe_topics([name]))[0]
            parts = last.get("partitions", [])
            if (
                last.get("error_code") == 0
                and len(parts) >= partitions
                and all(p.get("leader", -1) >= 0 for p in parts)
            ):
                return
            await asyncio.sleep(0.1)
        raise BrokerError(f"topic {name!r} had no leader for every partition within {timeout_s} s")
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def find_free_ports(count: int = 1, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct TCP ports that were free on ``host`` a moment ago.

    The ports are found by binding to port 0; another process may take one before it is used.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _tail_file(path: Path, lines: int, start: int = 0) -> str:
    """The last ``lines`` lines of ``path`` after byte offset ``start`` (0 if the file shrank)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = start if start <= size else 0
            f.seek(max(size - 256 * 1024, start))
            return _tail_text(f.read().decode(errors="replace"), lines)
    except OSError:
        return ""


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# --------------------------------------------------------------------------------------------
# The local broker
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BrokerStatus:
    """A snapshot of a :class:`LocalBroker`.

    Attributes:
        pid: the JVM's process id, or None if not running.
        running: the JVM process is alive.
        serving: it answers Kafka requests (ApiVersions + metadata listing a live broker).
        share_version: the finalized ``share.version`` level, or None if unknown/not serving.
        bootstrap: ``"127.0.0.1:<port>"``.
        data_dir: the broker's data directory.
        log_path: the broker's log4j log file.
        formatted: the KRaft storage has been formatted.
    """

    pid: int | None
    running: bool
    serving: bool
    share_version: int | None
    bootstrap: str
    data_dir: Path
    log_path: Path
    formatted: bool


class LocalBroker:
    """A single-node KRaft Kafka broker (combined broker + controller) in a detached JVM.

    Layout of ``data_dir``: ``server.properties`` and ``log4j2.properties`` (rendered from the
    templates next to this module on every start), ``kraft-combined-logs/`` (``log.dirs``),
    ``broker.log`` (log4j), ``broker.out`` (JVM stdout/stderr), ``broker.pid`` and
    ``queueflow-broker.json`` (cluster id and ports used to format).

    The storage is formatted (with ``share.version=1``) only on the first start, so
    ``stop()``/``start()`` and ``kill()``/``start()`` keep topics, offsets and share-group state.
    The broker keeps running after this Python process exits; call :meth:`stop`.

    Args:
        data_dir: data directory (created if missing).
        port: PLAINTEXT listener port on 127.0.0.1.
        controller_port: KRaft controller listener port on 127.0.0.1. It is recorded at format
            time and must stay the same for that data directory.
        extra_config: broker configs overriding or added to ``server.properties``, e.g.
            ``{"group.share.record.lock.duration.ms": "1000"}``; applied on every start.
        jvm_opts: broker JVM options; default ``$QUEUEFLOW_BROKER_JVM_OPTS`` or
            :data:`DEFAULT_BROKER_JVM_OPTS`.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int = 9092,
        controller_port: int = 9093,
        extra_config: Mapping[str, str] | None = None,
        *,
        jvm_opts: Sequence[str] | None = None,
    ) -> None:
        if port == controller_port:
            raise BrokerError(f"port and controller_port must differ (both {port})")
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.port = int(port)
        self.controller_port = int(controller_port)
        self.extra_config: dict[str, str] = {
            str(k): str(v) for k, v in (extra_config or {}).items()
        }
        self.jvm_opts = list(jvm_opts) if jvm_opts is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offsets: tuple[int, int] = (0, 0)  # sizes of broker.log/.out at launch

    def __repr__(self) -> str:
        return f"LocalBroker(data_dir={str(self.data_dir)!r}, bootstrap={self.bootstrap!r})"

    def __enter__(self) -> LocalBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- paths -----------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use: ``"127.0.0.1:<port>"``."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The broker's log4j log file (``<data_dir>/broker.log``)."""
        return self.data_dir / "broker.log"

    @property
    def stdout_path(self) -> Path:
        """The JVM's stdout/stderr (``<data_dir>/broker.out``): crashes before logging starts."""
        return self.data_dir / "broker.out"

    @property
    def pid_path(self) -> Path:
        """The pid file (``<data_dir>/broker.pid``), present while the broker runs."""
        return self.data_dir / "broker.pid"

    @property
    def config_path(self) -> Path:
        """The rendered ``server.properties``."""
        return self.data_dir / "server.properties"

    @property
    def log_dirs(self) -> Path:
        """Kafka's ``log.dirs``: the topic data and the KRaft metadata log."""
        return self.data_dir / "kraft-combined-logs"

    @property
    def _log4j_path(self) -> Path:
        return self.data_dir / "log4j2.properties"

    @property
    def _meta_path(self) -> Path:
        return self.data_dir / "queueflow-broker.json"

    # -- state -----------------------------------------------------------------------------

    def is_formatted(self) -> bool:
        """Return True if the KRaft storage in :attr:`log_dirs` has been formatted."""
        return (self.log_dirs / "meta.properties").is_file()

    def pid(self) -> int | None:
        """Return the running broker JVM's pid, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if self._proc is not None and self._proc.pid == pid:
            if self._proc.poll() is None:  # launched by us; may not have exec'd java yet
                return pid
        elif _pid_alive(pid) and self._is_our_process(pid):
            return pid
        with contextlib.suppress(OSError):
            self.pid_path.unlink()
        return None

    def is_running(self) -> bool:
        """Return True if the broker JVM is alive (it may not be serving yet)."""
        return self.pid() is not None

    def status(self, timeout_s: float = 3.0) -> BrokerStatus:
        """Return a :class:`BrokerStatus`; probing takes at most ~2 x ``timeout_s`` seconds."""
        pid = self.pid()
        serving, level = False, None
        if pid is not None:
            serving, level, _ = _probe(self.bootstrap, timeout_s)
        return BrokerStatus(
            pid=pid,
            running=pid is not None,
            serving=serving,
            share_version=level if serving else None,
            bootstrap=self.bootstrap,
            data_dir=self.data_dir,
            log_path=self.log_path,
            formatted=self.is_formatted(),
        )

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """Return the last ``lines`` lines of the broker log and of the JVM's stdout/stderr.

        After a launch by this object, only what that run wrote is shown.
        """
        log_start, out_start = self._log_offsets
        log_text = _tail_file(self.log_path, lines, log_start) or "(nothing logged)"
        parts = [f"--- last {lines} lines of {self.log_path} ---", log_text]
        out = _tail_file(self.stdout_path, lines, out_start)
        if out.strip():
            parts += [f"--- last lines of {self.stdout_path} (JVM stdout/stderr) ---", out]
        return "\n".join(parts)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout_s: float = 90) -> None:
        """Start the broker (formatting storage on first use) and wait until it serves.

        Returns once the broker answers requests, its metadata lists it as a live broker and
        ``share.version`` >= 1 is finalized. If it is already running, only waits for that.
        Resolves the Kafka jars first if needed (see :func:`kafka_libs`; not counted in
        ``timeout_s``).

        Args:
            timeout_s: seconds from JVM launch until it must serve (typically ~10 s).

        Raises:
            BrokerError: Java/Maven missing, a port in use, formatting failed, the JVM exited,
                or it was not serving within ``timeout_s``. The message includes the last
                ~40 lines of the broker log; a JVM started by this call is killed first.
        """
        if self.pid() is not None:
            running_port = self._configured_port()
            if running_port not in (None, self.port):
                raise BrokerError(
                    f"the broker in {self.data_dir} is already running on port {running_port}, "
                    f"not {self.port}; stop it first or use port {running_port}."
                )
            log.info(
                "Kafka broker in %s is already running; waiting until it serves", self.data_dir
            )
            self._wait_serving(time.monotonic() + timeout_s, timeout_s)
            return
        java = find_java()
        libs = kafka_libs()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._check_format_ports()
        for port in (self.port, self.controller_port):
            if _port_in_use(port):
                raise BrokerError(
                    f"port {port} on 127.0.0.1 is already in use (another Kafka broker?). Stop "
                    f"it, choose other ports (--port/--controller-port), or set "
                    f"{ENV_BROKER}=host:port to use a running cluster."
                )
        self._write_configs()
        if not self.is_formatted():
            self._format()
        self._launch(java, libs)
        try:
            self._wait_serving(time.monotonic() + timeout_s, timeout_s)
        except BrokerError:
            self.kill()
            raise

    def stop(self, timeout_s: float = 30) -> None:
        """Stop the broker: SIGTERM (controlled shutdown), then SIGKILL after ``timeout_s``.

        Idempotent: does nothing if it is not running.

        Args:
            timeout_s: seconds to wait for a clean exit before SIGKILL.

        Raises:
            BrokerError: the process survived SIGKILL for 10 s (should not happen).
        """
        pid = self.pid()
        if pid is None:
            return
        log.info("Stopping Kafka broker pid %d (%s)", pid, self.data_dir)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout_s):
            log.warning("Kafka broker pid %d ignored SIGTERM for %s s; killing it", pid, timeout_s)
            self.kill()
            return
        self._forget(pid)

    def kill(self) -> None:
        """Kill the broker JVM with SIGKILL (a crash, for chaos tests); idempotent.

        The data survives; :meth:`start` recovers the logs and resumes.

        Raises:
            BrokerError: the process was still alive 10 s after SIGKILL.
        """
        pid = self.pid()
        if pid is None:
            return
        log.info("Killing Kafka broker pid %d (%s)", pid, self.data_dir)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not self._wait_exit(pid, 10):
            raise BrokerError(f"Kafka broker pid {pid} survived SIGKILL for 10 s")
        self._forget(pid)

    def wipe(self) -> None:
        """Stop the broker and delete :attr:`data_dir` (all topics and state).

        Raises:
            BrokerError: ``data_dir`` is not empty and does not look like a broker data
                directory (a safety check against deleting the wrong directory).
        """
        self.stop()
        if not self.data_dir.exists():
            return
        ours = {"server.properties", "kraft-combined-logs", "broker.log", "queueflow-broker.json"}
        entries = {p.name for p in self.data_dir.iterdir()}
        if entries and not entries & ours:
            raise BrokerError(
                f"refusing to delete {self.data_dir}: it does not look like a queueflow broker "
                f"data directory (no {', '.join(sorted(ours))})"
            )
        shutil.rmtree(self.data_dir)

    # -- internals -------------------------------------------------------------------------

    def _check_format_ports(self) -> None:
        if not self.is_formatted():
            return
        try:
            meta = json.loads(self._meta_path.read_text())
        except (OSError, ValueError):
            return
        formatted_port = meta.get("controller_port")
        if formatted_port not in (None, self.controller_port):
            raise BrokerError(
                f"{self.data_dir} was formatted with controller port {formatted_port}, which is "
                f"part of the stored KRaft quorum; start with controller_port={formatted_port} "
                f"(--controller-port {formatted_port}) or wipe it (--fresh)."
            )

    def _configured_port(self) -> int | None:
        """The PLAINTEXT port in the rendered server.properties (what a running JVM uses)."""
        try:
            text = self.config_path.read_text()
        except OSError:
            return None
        match = re.search(r"^listeners=.*PLAINTEXT://[^:,]+:(\d+)", text, re.MULTILINE)
        return int(match.group(1)) if match else None

    def _write_configs(self) -> None:
        tokens = {
            "PORT": str(self.port),
            "CONTROLLER_PORT": str(self.controller_port),
            "LOG_DIRS": str(self.log_dirs),
        }
        server = _override_properties(_render("server.properties", tokens), self.extra_config)
        self.config_path.write_text(server)
        log4j = _render("log4j2.properties", {"LOG_FILE": str(self.log_path)})
        self._log4j_path.write_text(log4j)

    def _format(self) -> None:
        cluster_id = _random_cluster_id()
        log.info("Formatting KRaft storage in %s (cluster id %s)", self.log_dirs, cluster_id)
        proc = run_kafka_tool(
            "kafka.tools.StorageTool",
            [
                "format",
                "--standalone",
                "-t",
                cluster_id,
                "-c",
                str(self.config_path),
                "--feature",
                f"{SHARE_VERSION}=1",
            ],
        )
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting KRaft storage in {self.log_dirs} failed (exit {proc.returncode}):\n"
                f"{_tail_text(proc.stdout + proc.stderr, _LOG_TAIL_LINES)}"
            )
        meta = {
            "kafka_version": KAFKA_VERSION,
            "cluster_id": cluster_id,
            "port": self.port,
            "controller_port": self.controller_port,
            "formatted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        }
        self._meta_path.write_text(json.dumps(meta, indent=2) + "\n")

    def _launch(self, java: str, libs: Path) -> None:
        opts = self.jvm_opts
        if opts is None:
            opts = _jvm_opts(ENV_BROKER_JVM_OPTS, DEFAULT_BROKER_JVM_OPTS)
        cmd = [
            java,
            *opts,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self._log4j_path}",
            "-cp",
            f"{libs}/*",
            "kafka.Kafka",
            str(self.config_path),
        ]
        log.info(
            "Starting Kafka %s broker on %s (%s)", KAFKA_VERSION, self.bootstrap, self.data_dir
        )
        self._log_offsets = (_file_size(self.log_path), _file_size(self.stdout_path))
        with open(self.stdout_path, "ab") as out:
            stamp = datetime.datetime.now().isoformat(timespec="seconds")
            out.write(f"\n=== {stamp} queueflow: {shlex.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # detached: Ctrl-C in the caller does not reach it
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")

    def _wait_serving(self, deadline: float, timeout_s: float) -> None:
        detail = "no answer yet"
        while True:
            pid = self.pid()
            if pid is None:
                code = self._proc.poll() if self._proc is not None else None
                raise BrokerError(
                    f"Kafka broker in {self.data_dir} exited (code {code}) before serving on "
                    f"{self.bootstrap}.\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"Kafka broker pid {pid} was not serving on {self.bootstrap} with "
                    f"{SHARE_VERSION}>=1 within {timeout_s} s (last probe: {detail}).\n"
                    f"{self.log_tail()}"
                )
            serving, level, detail = _probe(self.bootstrap, min(3.0, max(remaining, 0.5)))
            if serving and level is not None and level >= 1:
                return
            if serving:
                detail = f"serving, but {SHARE_VERSION} is {level} (need >= 1)"
            time.sleep(min(0.3, max(deadline - time.monotonic(), 0)))

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        return _pid_alive(pid)

    def _is_our_process(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return True  # no /proc (macOS): trust the pid file
        return "kafka.Kafka" in cmdline and str(self.config_path) in cmdline

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def _forget(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            if self.pid_path.read_text().strip() == str(pid):
                self.pid_path.unlink()
        if self._proc is not None and self._proc.pid == pid:
            self._proc = None


def _pid_alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        reaped, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it if it exited
        if reaped == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _render(template: str, tokens: Mapping[str, str]) -> str:
    text = (_RESOURCES / template).read_text()
    for key, value in tokens.items():
        text = text.replace(f"@{key}@", value)
    return text


def _override_properties(text: str, overrides: Mapping[str, str]) -> str:
    """Replace ``key=value`` lines of a properties text and append keys it lacks."""
    for key, value in overrides.items():
        if "\n" in key or "\n" in value or "=" in key:
            raise BrokerError(f"invalid broker config {key!r}={value!r}")
    remaining = dict(overrides)
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "!")) and "=" in stripped:
            key = stripped.split("=", 1)[0].strip()
            if key in remaining:
                line = f"{key}={remaining.pop(key)}"
        lines.append(line)
    if remaining:
        lines.append("")
        lines.append("# extra_config")
        lines.extend(f"{key}={value}" for key, value in remaining.items())
    return "\n".join(lines) + "\n"


def _random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (22 characters)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # as Kafka's Uuid.randomUuid(): ids never start with '-'
            return cid
