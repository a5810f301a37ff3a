"""Resolving the Kafka broker and tools jars with Maven into queueflow's cache (once)."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
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
#: Seconds between two progress lines while Maven downloads.
PROGRESS_EVERY_S = 3.0
#: Approximate size (bytes) of the resolved jars per release, measured once (``du -sb libs``):
#: the total a download's percentage refers to.
APPROX_LIBS_BYTES = {"4.3.1": 56_300_000, "3.9.1": 58_100_000}
#: Maven (batch mode) says each file it fetched, with its size.
_DOWNLOADED = re.compile(r"Downloaded from \S+: (\S+) \(([\d.,]+) (B|kB|KB|MB|GB)\b")
_UNITS = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000**2, "GB": 1000**3}


def kafka_libs(progress: Callable[[str], None] | None = None) -> Path:
    """Resolve the Kafka broker + tools jars with Maven and return the directory holding them.

    The jars (``kafka_2.13``, ``kafka-tools``, log4j2 and their dependencies; ~90 jars, ~56 MB)
    are copied into ``<kafka_home()>/libs``. A marker file records success, so later calls
    return at once; concurrent callers (several processes) serialise on a lock file. The first
    call takes ~10 s with a warm ``~/.m2`` and up to a few minutes on a cold one.

    Args:
        progress: where to say what it is doing, one line a call (e.g. ``print``): that it
            resolves, then every :data:`PROGRESS_EVERY_S` seconds while Maven downloads the
            files and bytes so far (and the percentage of :data:`APPROX_LIBS_BYTES`), then how
            many jars in how long. None: the ``queueflow.devtools.broker.maven`` logger (INFO).

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
    say = progress or log.info
    with open(home / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another process is resolving the Kafka {KAFKA_VERSION} jars; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if _marker_ok(marker, digest) and libs.is_dir():
            return libs
        approx = APPROX_LIBS_BYTES.get(KAFKA_VERSION)
        say(
            f"resolving the Kafka {KAFKA_VERSION} jars with Maven into {libs} (once"
            + (f"; ~{approx / 1e6:.0f} MB to download on a first run" if approx else "")
            + ")"
        )
        pom = home / "pom.xml"
        pom.write_text(pom_text)
        tmp = home / f"libs.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            mvn,
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp}",
        ]
        started = time.monotonic()
        returncode, output = _run_maven(cmd, home, say, approx)
        if returncode is None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BrokerError(
                f"Maven did not finish within {_MAVEN_TIMEOUT_S} s: {shlex.join(cmd)}"
            )
        expected = [f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-tools-{KAFKA_VERSION}.jar"]
        missing = [jar for jar in expected if not (tmp / jar).is_file()]
        if returncode != 0 or missing:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BrokerError(
                f"Maven could not resolve the Kafka {KAFKA_VERSION} jars (exit "
                f"{returncode}; missing {missing or 'nothing'}). It needs network access "
                f"to Maven Central or a mirror in ~/.m2/settings.xml.\n"
                f"command: {shlex.join(cmd)}\n--- Maven output (tail) ---\n"
                f"{tail_text(output, LOG_TAIL_LINES)}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        os.replace(tmp, libs)
        marker.write_text(digest + "\n")
        jars = list(libs.glob("*.jar"))
        size = sum(jar.stat().st_size for jar in jars)
        say(
            f"resolved {len(jars)} Kafka {KAFKA_VERSION} jars ({size / 1e6:.1f} MB) in "
            f"{time.monotonic() - started:.1f} s"
        )
    return libs


def _run_maven(
    cmd: list[str], home: Path, say: Callable[[str], None], approx: int | None
) -> tuple[int | None, str]:
    """Run Maven, saying every :data:`PROGRESS_EVERY_S` s how much it downloaded so far.

    Returns:
        (exit code, or None if it was killed after ``_MAVEN_TIMEOUT_S``; its whole output).
    """
    proc = subprocess.Popen(
        cmd,
        cwd=home,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(_MAVEN_TIMEOUT_S, expire)
    timer.daemon = True
    timer.start()
    lines: list[str] = []
    files = downloaded = 0
    next_say = time.monotonic() + PROGRESS_EVERY_S
    try:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.append(line)
                match = _DOWNLOADED.search(line)
                if match is None:
                    continue
                files += 1
                downloaded += int(float(match[2].replace(",", "")) * _UNITS[match[3]])
                if time.monotonic() >= next_say:
                    next_say = time.monotonic() + PROGRESS_EVERY_S
                    say(_download_line(files, downloaded, approx))
        code = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if files:
        say(f"  downloaded {files} files, {downloaded / 1e6:.1f} MB")
    return (None if timed_out.is_set() else code), "".join(lines)


def _download_line(files: int, downloaded: int, approx: int | None) -> str:
    """``"downloading: 41 files, 23.4 MB (~42 % of ~56 MB)"``."""
    text = f"  downloading: {files} files, {downloaded / 1e6:.1f} MB"
    if approx:
        text += f" (~{min(99, int(100 * downloaded / approx))} % of ~{approx / 1e6:.0f} MB)"
    return text


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
