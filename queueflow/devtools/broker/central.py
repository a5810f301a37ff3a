"""Downloading a manifest's jars from Maven Central over HTTP (no Maven), checksums verified.

Each jar is checked three ways before it is kept: its size, SHA-1 and SHA-256 against the
checked-in manifest (:mod:`.manifest`), and the manifest's SHA-1 against the ``.sha1`` file the
repository publishes beside the jar (https://central.sonatype.org/publish/requirements/ —
every artifact on Central carries one). A mismatch is an error naming the URL; nothing
unverified lands in the jar directory.

Requests use :mod:`urllib.request` (standard library), a timeout per request
(:data:`REQUEST_TIMEOUT_S`: connecting, or waiting for the next bytes) and up to
:data:`ATTEMPTS` tries on network errors, timeouts and HTTP 429/5xx (with ``stamina``'s
backoff). Files are written to ``<name>.part`` and renamed once verified, into a staging
directory the caller renames into place, so an interrupted download leaves no half jar and a
re-run fetches only what is missing.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

import stamina

from queueflow import __version__
from queueflow.devtools.broker.locations import ENV_MAVEN_REPOSITORY
from queueflow.devtools.broker.manifest import Artifact, file_digests
from queueflow.errors import BrokerError

__all__ = [
    "ATTEMPTS",
    "DEFAULT_REPOSITORY",
    "PARALLEL_DOWNLOADS",
    "REQUEST_TIMEOUT_S",
    "central_sha1",
    "download_artifacts",
    "repository_url",
    "verified",
]

#: Maven Central's repository root (what ``mvn`` uses by default).
DEFAULT_REPOSITORY = "https://repo.maven.apache.org/maven2"
#: Seconds one request may wait to connect, or for its next bytes, before it is retried.
REQUEST_TIMEOUT_S = 30.0
#: Tries per file (network errors, timeouts, HTTP 429 and 5xx), with exponential backoff.
ATTEMPTS = 4
#: Jars downloaded at once.
PARALLEL_DOWNLOADS = 6
#: First backoff between two tries, in seconds (doubling, at most 8 s).
RETRY_WAIT_INITIAL_S = 0.5
#: Random extra wait added to each backoff, at most this many seconds.
RETRY_WAIT_JITTER_S = 1.0
_USER_AGENT = f"queueflow/{__version__} (local Kafka broker jars; Python urllib)"


class _Transient(Exception):
    """A failure worth another try (the network, a timeout, HTTP 429/5xx)."""


def repository_url() -> str:
    """``$QUEUEFLOW_MAVEN_REPOSITORY`` (a Maven Central mirror; no trailing slash), else
    :data:`DEFAULT_REPOSITORY`."""
    return (os.environ.get(ENV_MAVEN_REPOSITORY, "").strip() or DEFAULT_REPOSITORY).rstrip("/")


def verified(path: Path, artifact: Artifact) -> bool:
    """True if the file at ``path`` exists and has ``artifact``'s size, SHA-1 and SHA-256."""
    try:
        if path.stat().st_size != artifact.size:
            return False
        return file_digests(path) == (artifact.size, artifact.sha1, artifact.sha256)
    except OSError:
        return False


def _open(url: str) -> http.client.HTTPResponse:
    """GET ``url``; transient failures raise :class:`_Transient`, others :class:`BrokerError`."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    try:
        response: http.client.HTTPResponse = urllib.request.urlopen(
            request, timeout=REQUEST_TIMEOUT_S
        )
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 429 or exc.code >= 500:
            raise _Transient(f"HTTP {exc.code} {exc.reason}") from exc
        hint = " (not there: is the manifest's coordinate right?)" if exc.code == 404 else ""
        raise BrokerError(f"GET {url}: HTTP {exc.code} {exc.reason}{hint}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _Transient(_reason(exc)) from exc
    return response


def _reason(exc: BaseException) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return f"the host name does not resolve ({reason}): is this machine offline?"
    if isinstance(reason, ConnectionRefusedError):
        return f"connection refused ({reason}): is this machine offline, or a proxy needed?"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {REQUEST_TIMEOUT_S:.0f} s"
    return f"{type(reason).__name__}: {reason}"


def _retrying(url: str, action: Callable[[], object], stop: threading.Event) -> None:
    """Run ``action`` up to :data:`ATTEMPTS` times while it raises :class:`_Transient`."""
    try:
        for attempt in stamina.retry_context(
            on=_Transient,
            attempts=ATTEMPTS,
            timeout=None,
            wait_initial=RETRY_WAIT_INITIAL_S,
            wait_max=8.0,
            wait_jitter=RETRY_WAIT_JITTER_S,
        ):
            with attempt:
                if stop.is_set():
                    return
                action()
    except _Transient as exc:
        raise BrokerError(
            f"could not download {url} after {ATTEMPTS} tries: {exc}. The local broker "
            f"downloads its jars once from {repository_url()} (set {ENV_MAVEN_REPOSITORY} to a "
            "mirror), or set QUEUEFLOW_BROKER=host:port to use an existing Kafka cluster."
        ) from None


def central_sha1(url: str, stop: threading.Event | None = None) -> str:
    """The SHA-1 the repository publishes for ``url`` (``<url>.sha1``; first word, lowercase).

    Raises:
        BrokerError: no ``.sha1`` there (HTTP 404: the error names the URL), an unreadable
            one, or the network failed after :data:`ATTEMPTS` tries.
    """
    found: list[str] = []

    def get() -> None:
        with _open(f"{url}.sha1") as response:
            found.append(response.read(4096).decode("ascii", "replace"))

    _retrying(f"{url}.sha1", get, stop or threading.Event())
    words = found[-1].split() if found else []
    if not words or len(words[0]) != 40:
        raise BrokerError(f"{url}.sha1 holds no SHA-1: {found[-1][:100] if found else ''!r}")
    return words[0].lower()


def _download_one(
    url: str, artifact: Artifact, dest: Path, stop: threading.Event, add: Callable[[int], None]
) -> None:
    """Download ``url`` to ``dest`` (via ``dest.part``), verified against ``artifact``."""
    published = central_sha1(url, stop)
    if published != artifact.sha1:
        raise BrokerError(
            f"checksum mismatch: {url}.sha1 says {published}, the manifest says "
            f"{artifact.sha1} for {artifact.coordinate}; the manifest is stale or the "
            "repository serves another file (regenerate the manifest: python -m "
            "queueflow.devtools.broker.pin_jars <version>)"
        )
    part = dest.with_name(dest.name + ".part")

    def get() -> None:
        sha1, sha256 = hashlib.sha1(), hashlib.sha256()
        size = 0
        try:
            with _open(url) as response, open(part, "wb") as out:
                while chunk := response.read(1 << 16):
                    if stop.is_set():
                        return
                    out.write(chunk)
                    sha1.update(chunk)
                    sha256.update(chunk)
                    size += len(chunk)
                    add(len(chunk))
        except (OSError, http.client.HTTPException) as exc:
            add(-size)
            raise _Transient(_reason(exc)) from exc
        got = (size, sha1.hexdigest(), sha256.hexdigest())
        if got != (artifact.size, artifact.sha1, artifact.sha256):
            part.unlink(missing_ok=True)
            raise BrokerError(
                f"checksum mismatch: {url} gave {size} bytes, SHA-1 {got[1]}, SHA-256 "
                f"{got[2]}; the manifest says {artifact.size} bytes, SHA-1 {artifact.sha1}, "
                f"SHA-256 {artifact.sha256}. Nothing was kept; run again, and if it "
                "persists the repository (or a proxy) serves another file."
            )
        os.replace(part, dest)

    try:
        _retrying(url, get, stop)
    finally:
        part.unlink(missing_ok=True)


def download_artifacts(
    artifacts: Sequence[Artifact],
    staging: Path,
    say: Callable[[str], None],
    progress_every_s: float,
) -> tuple[int, int]:
    """Download those of ``artifacts`` not yet verified in ``staging`` into it.

    Args:
        artifacts: the jars (a manifest).
        staging: the directory to fill (created); files already there and verified stay.
        say: where progress lines go (called from this thread only): every
            ``progress_every_s`` seconds, the files and MB downloaded so far and the percentage.
        progress_every_s: seconds between two progress lines.

    Returns:
        (jars downloaded, bytes downloaded).

    Raises:
        BrokerError: a checksum mismatch, a missing file or ``.sha1`` (the message names the
            URL), or the network failed after :data:`ATTEMPTS` tries per request.
    """
    staging.mkdir(parents=True, exist_ok=True)
    todo = [a for a in artifacts if not verified(staging / a.file_name, a)]
    total = sum(a.size for a in todo)
    done_bytes = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def add(n: int) -> None:
        with lock:
            done_bytes[0] += n

    repo = repository_url()
    pool = ThreadPoolExecutor(max_workers=PARALLEL_DOWNLOADS, thread_name_prefix="jar-download")
    futures: list[Future[None]] = [
        pool.submit(_download_one, f"{repo}/{a.path}", a, staging / a.file_name, stop, add)
        for a in todo
    ]
    try:
        pending: set[Future[None]] = set(futures)
        next_say = time.monotonic() + progress_every_s
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            for future in finished:
                future.result()  # raises the first failure
            if pending and time.monotonic() >= next_say:
                next_say = time.monotonic() + progress_every_s
                files = len(futures) - len(pending)
                say(_progress_line(files, len(futures), done_bytes[0], total))
    except BrokerError:
        # Jars already on their way finish (and stay verified for a re-run); none start.
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:  # an interrupt (Ctrl-C) stops the downloads between two chunks
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
    return len(todo), total


def _progress_line(files: int, of_files: int, downloaded: int, total: int) -> str:
    """``"  downloading: 41/92 files, 23.4 MB (42 % of 56.3 MB)"``."""
    percent = min(99, int(100 * downloaded / total)) if total else 100
    return (
        f"  downloading: {files}/{of_files} files, {downloaded / 1e6:.1f} MB "
        f"({percent} % of {total / 1e6:.1f} MB)"
    )
