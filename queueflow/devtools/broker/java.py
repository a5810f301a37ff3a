"""Finding a Java 17+ runtime and the JVM options of the broker and of Kafka's tools."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from queueflow.devtools.broker.locations import INSTALL_HINT, KAFKA_VERSION
from queueflow.errors import BrokerError

__all__ = ["MIN_JAVA", "find_java", "jvm_opts_from_env"]

#: The oldest Java major version Kafka 4 brokers run on.
MIN_JAVA = 17


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
        raise BrokerError(f"`java` was not found on PATH. {INSTALL_HINT}")
    major = _java_major(java)
    if major < MIN_JAVA:
        raise BrokerError(
            f"{java} is Java {major}; Kafka {KAFKA_VERSION} brokers need Java {MIN_JAVA}+. "
            f"Install a newer JDK/JRE or point JAVA_HOME at one. {INSTALL_HINT}"
        )
    return java


def _java_major(java: str) -> int:
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(f"could not run `{java} -version`: {exc}. {INSTALL_HINT}") from exc
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        raise BrokerError(f"could not parse the Java version from `{java} -version`: {text!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_412" is Java 8
        major = int(match.group(2))
    return major


def jvm_opts_from_env(env_var: str, default: str) -> list[str]:
    """JVM options from ``$env_var`` (split like a shell would), else from ``default``."""
    return shlex.split(os.environ.get(env_var) or default)
