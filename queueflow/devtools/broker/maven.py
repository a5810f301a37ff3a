"""Resolving the Kafka broker and tools jars with Maven into queueflow's cache (once)."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from queueflow.devtools.broker.java import find_java
from queueflow.devtools.broker.locations import (
    INSTALL_HINT,
    KAFKA_VERSION,
    RESOURCES,
    kafka_home,
    kafka_version_error,
    uses_log4j2,
)
from queueflow.devtools.broker.logtail import LOG_TAIL_LINES, tail_text
from queueflow.errors import BrokerError

__all__ = ["kafka_libs"]

log = logging.getLogger(__name__)

_RESOLVED_MARKER = ".resolved"
#: Seconds Maven may take to resolve the jars (a cold ~/.m2 over a slow network).
_MAVEN_TIMEOUT_S = 1800


def kafka_libs() -> Path:
    """Resolve the Kafka broker + tools jars with Maven and return the directory holding them.

    The jars (``kafka_2.13``, ``kafka-tools``, log4j2 and their dependencies; ~90 jars) are
    copied into ``<kafka_home()>/libs``. A marker file records success, so later calls return
    at once; concurrent callers (several processes) serialise on a lock file. The first call
    takes ~10 s with a warm ``~/.m2`` and up to a few minutes on a cold one.

    Returns:
        The absolute ``libs`` directory; use ``f"{libs}/*"`` as the Java classpath.

    Raises:
        BrokerError: ``QUEUEFLOW_KAFKA_VERSION`` names no usable release, ``java`` (17+) or
            ``mvn`` is missing, or Maven failed (the message holds the tail of Maven's output).
    """
    problem = kafka_version_error()
    if problem is not None:
        raise BrokerError(problem)
    home = kafka_home()
    libs = home / "libs"
    pom_text = (RESOURCES / "pom.xml").read_text().replace("@KAFKA_VERSION@", KAFKA_VERSION)
    if not uses_log4j2():  # Kafka 3.x logs through its own slf4j-reload4j binding
        begin, end = pom_text.index("<!-- log4j2:begin"), pom_text.index("<!-- log4j2:end -->")
        pom_text = pom_text[:begin] + pom_text[end + len("<!-- log4j2:end -->") :]
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
                cmd, cwd=home, capture_output=True, text=True, timeout=_MAVEN_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BrokerError(
                f"Maven did not finish within {_MAVEN_TIMEOUT_S} s: {shlex.join(cmd)}"
            ) from exc
        expected = [f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-tools-{KAFKA_VERSION}.jar"]
        missing = [jar for jar in expected if not (tmp / jar).is_file()]
        if proc.returncode != 0 or missing:
            shutil.rmtree(tmp, ignore_errors=True)
            output = tail_text(proc.stdout + proc.stderr, LOG_TAIL_LINES)
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


def _find_mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            "`mvn` (Apache Maven) was not found on PATH; it is needed once to download the "
            f"Kafka {KAFKA_VERSION} jars. {INSTALL_HINT}"
        )
    return mvn


def _marker_ok(marker: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest
    except OSError:
        return False
