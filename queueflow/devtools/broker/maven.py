"""The Kafka broker and tools jars in queueflow's cache, fetched once: over HTTP from Maven
Central for the releases with a checked-in manifest (:mod:`.manifest`, :mod:`.central`; no
Maven needed), else resolved with ``mvn``."""

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
from collections.abc import Callable, Sequence
from pathlib import Path

from queueflow.devtools.broker.central import download_artifacts, repository_url, verified
from queueflow.devtools.broker.java import find_java
from queueflow.devtools.broker.locations import (
    INSTALL_HINT,
    KAFKA_VERSION,
    kafka_home,
    kafka_version_error,
)
from queueflow.devtools.broker.logtail import LOG_TAIL_LINES, tail_text
from queueflow.devtools.broker.manifest import (
    Artifact,
    load_manifest,
    pinned_versions,
    render_pom,
)
from queueflow.errors import BrokerError

__all__ = ["kafka_libs"]

log = logging.getLogger(__name__)

_RESOLVED_MARKER = ".resolved"
#: Seconds Maven may take to resolve the jars (a cold ~/.m2 over a slow network).
_MAVEN_TIMEOUT_S = 1800
#: Seconds between two progress lines while the jars download.
PROGRESS_EVERY_S = 3.0
#: Approximate size (bytes) of the resolved jars per release, measured once (``du -sb libs``):
#: the total a Maven download's percentage refers to (a manifest knows its exact total).
APPROX_LIBS_BYTES = {"4.3.1": 56_300_000, "3.9.1": 58_100_000}
#: Maven (batch mode) says each file it fetched, with its size.
_DOWNLOADED = re.compile(r"Downloaded from \S+: (\S+) \(([\d.,]+) (B|kB|KB|MB|GB)\b")
_UNITS = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000**2, "GB": 1000**3}


def kafka_libs(
    progress: Callable[[str], None] | None = None, *, version: str = KAFKA_VERSION
) -> Path:
    """Fetch the Kafka broker + tools jars once and return the directory holding them.

    The jars (``kafka_2.13``, ``kafka-tools``, log4j2 and their dependencies; ~90 jars, ~56 MB)
    go to ``<kafka_home(version)>/libs``. For a release with a manifest
    (``manifests/kafka-<version>.txt``: 4.3.1 and 3.9.1) they are downloaded over HTTP from
    Maven Central (or ``$QUEUEFLOW_MAVEN_REPOSITORY``) and verified (size, SHA-1, SHA-256 and
    the repository's ``.sha1``; :mod:`.central`): no Maven needed. Any other release is
    resolved with ``mvn``. A marker file records success, so later calls return at once;
    concurrent callers (several processes) serialise on a lock file; an interrupted download
    resumes with the jars it had verified.

    Args:
        progress: where to say what it is doing, one line a call (e.g. ``print``): that it
            downloads, then every :data:`PROGRESS_EVERY_S` seconds the files and MB so far
            with the percentage, then how many jars in how long. None: the
            ``queueflow.devtools.broker.maven`` logger (INFO).
        version: the Kafka release (default ``$QUEUEFLOW_KAFKA_VERSION`` or 4.3.1).

    Returns:
        The absolute ``libs`` directory; use ``f"{libs}/*"`` as the Java classpath.

    Raises:
        BrokerError: ``version`` names no usable release; no Java 17+ (see
            :func:`~queueflow.devtools.broker.java.find_java`); a download failed (offline,
            a checksum mismatch: the message names the URL); or, for a release without a
            manifest, ``mvn`` is missing or failed (with the tail of its output).
    """
    problem = kafka_version_error(version)
    if problem is not None:
        raise BrokerError(problem)
    home = kafka_home(version)
    libs = home / "libs"
    pinned = load_manifest(version)
    recipe = pinned[1] if pinned is not None else render_pom(version)
    digest = hashlib.sha256(recipe.encode()).hexdigest()
    marker = home / _RESOLVED_MARKER
    if _marker_ok(marker, digest) and libs.is_dir():
        return libs

    find_java()
    mvn = _find_mvn(version) if pinned is None else ""
    home.mkdir(parents=True, exist_ok=True)
    say = progress or log.info
    with open(home / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another process is resolving the Kafka {version} jars; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if _marker_ok(marker, digest) and libs.is_dir():
            return libs
        if pinned is not None:
            _fetch_pinned(version, home, pinned[0], say)
        else:
            _resolve_with_maven(version, mvn, home, recipe, say)
        marker.write_text(digest + "\n")
    return libs


def _fetch_pinned(
    version: str, home: Path, artifacts: Sequence[Artifact], say: Callable[[str], None]
) -> None:
    """Fill ``home/libs`` with exactly ``artifacts``, downloading only what isn't there yet."""
    libs, staging = home / "libs", home / "libs.partial"
    wanted = {a.file_name for a in artifacts}
    same_names = libs.is_dir() and {p.name for p in libs.iterdir()} == wanted
    if same_names and all(verified(libs / a.file_name, a) for a in artifacts):
        return  # e.g. resolved by Maven before: the same jars, now checked
    staging.mkdir(parents=True, exist_ok=True)
    for stray in staging.iterdir():  # .part files of an interrupted run, jars of no manifest
        if stray.name not in wanted:
            stray.unlink()
    for a in artifacts:  # keep verified jars of the previous libs (a changed manifest)
        source, target = libs / a.file_name, staging / a.file_name
        if not target.exists() and verified(source, a):
            shutil.copy2(source, target)
    missing = [a for a in artifacts if not verified(staging / a.file_name, a)]
    total = sum(a.size for a in missing)
    kept = len(artifacts) - len(missing)
    repo = repository_url()
    say(
        f"downloading the Kafka {version} jars from {repo} into {libs} (once; {len(missing)} "
        f"jars, {total / 1e6:.1f} MB, checksums verified"
        + (f"; {kept} already here" if kept else "")
        + ")"
    )
    started = time.monotonic()
    count, size = download_artifacts(artifacts, staging, say, PROGRESS_EVERY_S)
    old = home / f"libs.old-{os.getpid()}"
    if libs.exists():
        os.replace(libs, old)
    os.replace(staging, libs)
    shutil.rmtree(old, ignore_errors=True)
    say(
        f"downloaded {count} Kafka {version} jars ({size / 1e6:.1f} MB) in "
        f"{time.monotonic() - started:.1f} s; {len(artifacts)} jars verified in {libs}"
    )


def _resolve_with_maven(
    version: str, mvn: str, home: Path, pom_text: str, say: Callable[[str], None]
) -> None:
    """Resolve ``version``'s jars with Maven into ``home/libs`` (a release with no manifest)."""
    libs = home / "libs"
    approx = APPROX_LIBS_BYTES.get(version)
    say(
        f"resolving the Kafka {version} jars with Maven into {libs} (once"
        + (f"; ~{approx / 1e6:.0f} MB to download on a first run" if approx else "")
        + ")"
    )
    pom = home / "pom.xml"
    pom.write_text(pom_text)
    tmp = home / f"libs.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [mvn, "-B", "-Dstyle.color=never", "-f", str(pom), "dependency:copy-dependencies"]
    cmd.append(f"-DoutputDirectory={tmp}")
    started = time.monotonic()
    returncode, output = _run_maven(cmd, home, say, approx)
    if returncode is None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BrokerError(f"Maven did not finish within {_MAVEN_TIMEOUT_S} s: {shlex.join(cmd)}")
    expected = [f"kafka_2.13-{version}.jar", f"kafka-tools-{version}.jar"]
    missing = [jar for jar in expected if not (tmp / jar).is_file()]
    if returncode != 0 or missing:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BrokerError(
            f"Maven could not resolve the Kafka {version} jars (exit "
            f"{returncode}; missing {missing or 'nothing'}). It needs network access "
            f"to Maven Central or a mirror in ~/.m2/settings.xml.\n"
            f"command: {shlex.join(cmd)}\n--- Maven output (tail) ---\n"
            f"{tail_text(output, LOG_TAIL_LINES)}"
        )
    shutil.rmtree(libs, ignore_errors=True)
    os.replace(tmp, libs)
    jars = list(libs.glob("*.jar"))
    size = sum(jar.stat().st_size for jar in jars)
    say(
        f"resolved {len(jars)} Kafka {version} jars ({size / 1e6:.1f} MB) in "
        f"{time.monotonic() - started:.1f} s"
    )


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


def _find_mvn(version: str) -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            f"Kafka {version} has no jar manifest in queueflow (pinned: "
            f"{', '.join(pinned_versions())}; "
            "those download over HTTP), so its jars are resolved with `mvn` (Apache Maven), "
            "which was not found on PATH. Install Maven, use a pinned release "
            "(QUEUEFLOW_KAFKA_VERSION), or write the manifest with `python -m "
            f"queueflow.devtools.broker.pin_jars {version}` (needs Maven once). {INSTALL_HINT}"
        )
    return mvn


def _marker_ok(marker: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest
    except OSError:
        return False
