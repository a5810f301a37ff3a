"""Running Kafka's Java command-line tools (FeatureCommand, ShareGroupCommand, ...)."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from queueflow.devtools.broker.java import find_java, jvm_opts_from_env
from queueflow.devtools.broker.locations import ENV_TOOL_JVM_OPTS, kafka_home, uses_log4j2
from queueflow.devtools.broker.logtail import LOG_TAIL_LINES, as_text, tail_text
from queueflow.devtools.broker.maven import kafka_libs
from queueflow.errors import BrokerError

__all__ = [
    "ADMIN_TOOLS",
    "DEFAULT_TOOL_JVM_OPTS",
    "TOOL_ALIASES",
    "kafka_tool_argv",
    "log4j_option",
    "run_kafka_tool",
]

log = logging.getLogger(__name__)

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

#: The admin commands among them: they finish on their own and report errors as an
#: ``Error: ...`` line (mostly with exit status 0).
ADMIN_TOOLS: frozenset[str] = frozenset(
    TOOL_ALIASES[name] for name in ("configs", "features", "groups", "share-groups", "topics")
)

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

# The same for Kafka 3.x tools (log4j 1, reload4j).
_TOOLS_LOG4J = """\
# Written by queueflow.devtools.broker.run_kafka_tool: Kafka tools log WARN and above to stderr.
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


def log4j_option(path: Path) -> str:
    """The JVM option pointing the Kafka release in use at the logging configuration ``path``
    (log4j2 for Kafka 4.x, log4j 1 for 3.x)."""
    if uses_log4j2():
        return f"-Dlog4j2.configurationFile={path}"
    return f"-Dlog4j.configuration=file:{path}"


def kafka_tool_argv(
    main_class: str, args: Sequence[str], *, jvm_opts: Sequence[str] | None = None
) -> list[str]:
    """The command line :func:`run_kafka_tool` runs, for a tool started in the background
    (``subprocess.Popen``), e.g. a console share consumer that stays in its group.

    Args:
        main_class: fully qualified main class, or a key of :data:`TOOL_ALIASES`.
        args: the tool's arguments.
        jvm_opts: JVM options (default as for :func:`run_kafka_tool`).

    Raises:
        BrokerError: Java/Maven missing (see :func:`kafka_libs`).
    """
    java = find_java()
    libs = kafka_libs()
    main = TOOL_ALIASES.get(main_class, main_class)
    opts = (
        list(jvm_opts)
        if jvm_opts is not None
        else jvm_opts_from_env(ENV_TOOL_JVM_OPTS, DEFAULT_TOOL_JVM_OPTS)
    )
    return [
        java,
        *opts,
        "-Djava.awt.headless=true",
        log4j_option(_tools_log4j_config()),
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


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
    cmd = kafka_tool_argv(main_class, args, jvm_opts=jvm_opts)
    main = TOOL_ALIASES.get(main_class, main_class)
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
        out = as_text(exc.stdout) + as_text(exc.stderr)
        raise BrokerError(
            f"{main} did not finish within {timeout_s} s: {shlex.join([main, *args])}\n"
            f"--- output so far (tail) ---\n{tail_text(out, LOG_TAIL_LINES)}"
        ) from exc
    if check and proc.returncode != 0:
        out = (proc.stdout or "") + (proc.stderr or "")
        raise BrokerError(
            f"{main} exited with {proc.returncode}: {shlex.join([main, *args])}\n"
            f"--- output (tail) ---\n{tail_text(out, LOG_TAIL_LINES)}"
        )
    return proc


def _tools_log4j_config() -> Path:
    text = _TOOLS_LOG4J2 if uses_log4j2() else _TOOLS_LOG4J
    path = kafka_home() / ("tools-log4j2.properties" if uses_log4j2() else "tools-log4j.properties")
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
