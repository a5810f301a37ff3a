"""Starting Spark on a busy machine: where the driver binds, the Python worker settings, and a
bounded retry of a streaming query that failed to start.

Spark starts a fresh Python process for a Python data source's streaming runner (on the
driver, one per query) and waits a fixed 10 s for it to connect back (``PythonWorkerFactory``;
no setting changes that window). On a loaded machine the interpreter's start can take longer,
and the query stops at once with ``Python worker failed to connect back``. Nothing was acquired
yet, so starting the query again (same checkpoint) is safe: :func:`start_query` does, a bounded
number of times, and logs each retry.

Where the driver binds: when the host name resolves to a loopback address, Spark picks the
first non-loopback interface instead (``Your hostname, ... resolves to a loopback address``);
a local run then listens on, and connects through, an outside address. :func:`bind_choice`
binds the driver to 127.0.0.1 whenever the executors run on this machine (a ``local[...]``
master, or a standalone master on a loopback address) and the user set none of
``SPARK_LOCAL_IP``, ``spark.driver.bindAddress`` or ``spark.driver.host``.

Spark's settings: https://spark.apache.org/docs/latest/configuration.html (Networking, Python).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import stamina
import structlog

from queueflow.errors import QueueflowError

__all__ = [
    "LOOPBACK",
    "PYTHON_WORKER_CONF",
    "BindChoice",
    "QueryStartError",
    "bind_choice",
    "host_name_is_loopback",
    "is_retryable_start_error",
    "start_query",
]

log = structlog.get_logger("queueflow.spark.startup")

LOOPBACK = "127.0.0.1"

#: Python worker settings for a loaded machine. ``spark.python.authenticate.socketTimeout``
#: (default 15s) bounds the secret handshake of every Python worker and daemon once it has
#: connected; a worker slowed down by the load must not fail there either.
PYTHON_WORKER_CONF: Mapping[str, str] = {"spark.python.authenticate.socketTimeout": "120s"}

#: Errors of a Python worker that did not start in time (Spark's ``PythonWorkerFactory``).
RETRYABLE_START_ERRORS = (
    "Python worker failed to connect back",
    "Timed out while waiting for the Python worker to connect back",
    "Python daemon failed to launch worker",
)

#: The status messages of a query whose sources are not set up yet.
_INITIALIZING = ("Initializing StreamExecution", "Initializing sources")


class QueryStartError(QueueflowError):
    """A streaming query stopped at its start (after every attempt, if it was retryable)."""


class _RetryableStart(QueryStartError):
    """A Python worker did not connect back in time: worth starting again."""


@dataclass(frozen=True)
class BindChoice:
    """Where the driver binds.

    Attributes:
        conf: Spark settings to add (empty: Spark's own choice).
        env: environment variables to set before the JVM starts (``SPARK_LOCAL_IP``).
        reason: why, for the log and the docs.
    """

    conf: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name_is_loopback(host_name: str | None = None) -> bool:
    """True when ``host_name`` (default: this machine's) resolves to loopback addresses only,
    or does not resolve at all (Spark then falls back to an interface address as well)."""
    name = host_name or socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return True
    return all(_is_loopback(str(info[4][0])) for info in infos)


def _master_is_local(master: str, host_name: str, loopback_host: bool) -> bool:
    """True when the executors of ``master`` run on this machine and reach it on loopback."""
    if master == "local" or master.startswith("local["):
        return True
    if not master.startswith("spark://"):
        return False  # yarn, k8s, ...: the executors are elsewhere
    hosts = [urlsplit(f"//{part}").hostname or "" for part in master[8:].split(",")]
    return all(_is_loopback(h) or (loopback_host and h == host_name) for h in hosts)


def bind_choice(
    master: str,
    *,
    env: Mapping[str, str],
    conf: Mapping[str, str],
    host_name: str,
    loopback_host: bool,
) -> BindChoice:
    """Decide where the driver binds (pure: the caller resolves the host name).

    Args:
        master: Spark's master URL (``local[2]``, ``spark://127.0.0.1:7077``, ``yarn``, ...).
        env: the process environment (``SPARK_LOCAL_IP`` set there wins).
        conf: the Spark settings given so far (``spark.driver.bindAddress`` or
            ``spark.driver.host`` set there win).
        host_name: this machine's host name.
        loopback_host: whether ``host_name`` resolves to loopback only
            (:func:`host_name_is_loopback`).

    Returns:
        127.0.0.1 for the driver (``spark.driver.bindAddress``, ``spark.driver.host`` and
        ``SPARK_LOCAL_IP``) when the executors run on this machine and nothing was chosen;
        else nothing (Spark's choice).
    """
    if env.get("SPARK_LOCAL_IP"):
        return BindChoice(reason="SPARK_LOCAL_IP is set")
    if conf.get("spark.driver.bindAddress") or conf.get("spark.driver.host"):
        return BindChoice(reason="spark.driver.bindAddress/spark.driver.host are set")
    if not _master_is_local(master, host_name, loopback_host):
        return BindChoice(reason=f"executors of {master} may run on other hosts")
    why = f"host name {host_name!r} resolves to loopback" if loopback_host else "local master"
    return BindChoice(
        conf={"spark.driver.bindAddress": LOOPBACK, "spark.driver.host": LOOPBACK},
        env={"SPARK_LOCAL_IP": LOOPBACK},
        reason=f"{why}; executors of {master} run on this machine",
    )


def is_retryable_start_error(error: BaseException | str | None) -> bool:
    """True for a Python worker that did not connect back in time (worth starting again)."""
    return error is not None and any(text in str(error) for text in RETRYABLE_START_ERRORS)


def _started(query: Any) -> bool:
    """The query's sources are set up (its runner connected) or it reported progress."""
    if query.lastProgress is not None:
        return True
    message = str((query.status or {}).get("message", ""))
    return not message.startswith(_INITIALIZING)


def _wait_started(query: Any, timeout_s: float, poll_s: float) -> BaseException | None:
    """Wait until ``query`` started (None) or stopped (its exception, or a QueryStartError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not query.isActive:
            error = query.exception()
            return error if error is not None else QueryStartError("the query stopped")
        if _started(query) or time.monotonic() >= deadline:
            # Still initializing at the deadline: a slow start, not a failed one.
            return None
        time.sleep(poll_s)


def start_query(
    start: Callable[[], Any],
    *,
    name: str,
    attempts: int = 4,
    ready_timeout_s: float = 120.0,
    wait_initial_s: float = 2.0,
    poll_s: float = 0.2,
) -> Any:
    """Start a streaming query, and start it again (bounded) when it stops at its start
    because a Python worker did not connect back in time.

    Args:
        start: starts the query and returns the :class:`pyspark.sql.streaming.StreamingQuery`
            (``df.writeStream....start()``); called once per attempt, so the same checkpoint
            is used each time.
        name: the query's name, for the log.
        attempts: the most starts (>= 1).
        ready_timeout_s: how long (s) an attempt waits for the query's sources to be set up;
            a query still initializing then is returned as it is.
        wait_initial_s: the back-off (s) before the second start (doubling, jittered).
        poll_s: how often (s) the query's status is read.

    Returns:
        The running query.

    Raises:
        QueryStartError: it stopped at its start on every attempt (the message has the last
            error), or stopped at its start for another reason (not retried).
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in stamina.retry_context(
        on=_RetryableStart,
        attempts=attempts,
        timeout=None,
        wait_initial=wait_initial_s,
        wait_max=30.0,
        wait_jitter=wait_initial_s / 2,
    ):
        with attempt:
            query = start()
            error = _wait_started(query, ready_timeout_s, poll_s)
            if error is None:
                return query
            text = str(error).strip()
            lines = text.splitlines() or [type(error).__name__]
            detail = next((ln for ln in lines if is_retryable_start_error(ln)), lines[0])[:300]
            retryable = is_retryable_start_error(text)
            log.warning(
                "spark_query_start_failed",
                query=name,
                attempt=attempt.num,
                attempts=attempts,
                error=detail,
                retry=retryable and attempt.num < attempts,
            )
            raise (_RetryableStart if retryable else QueryStartError)(
                f"streaming query {name!r} stopped at its start (attempt {attempt.num} of "
                f"{attempts}): {detail}"
            ) from error
    raise AssertionError("unreachable")  # pragma: no cover (retry_context raises or returns)
