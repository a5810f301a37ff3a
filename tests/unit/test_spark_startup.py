"""Spark on a busy machine (queueflow.spark.startup), brokerless: where the driver binds, which
errors are worth starting a query again for, and the bounded retry of a query that stopped at its
start ("Python worker failed to connect back")."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from structlog.testing import capture_logs

from queueflow.spark.startup import (
    LOOPBACK,
    PYTHON_WORKER_CONF,
    QueryStartError,
    bind_choice,
    host_name_is_loopback,
    is_retryable_start_error,
    start_query,
)

CONNECT_BACK = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "org.apache.spark.SparkException: Python worker failed to connect back.\n"
    "Caused by: java.net.SocketTimeoutException: Timed out while waiting for the Python worker "
    "to connect back"
)

LOCAL = {"spark.driver.bindAddress": LOOPBACK, "spark.driver.host": LOOPBACK}


def choose(master: str, **kw: Any) -> Any:
    args: dict[str, Any] = {"env": {}, "conf": {}, "host_name": "vm", "loopback_host": True}
    return bind_choice(master, **(args | kw))


@pytest.mark.parametrize(
    ("master", "loopback_host", "bound"),
    [
        ("local[2]", True, True),
        ("local", False, True),  # executors in this JVM: loopback whatever the host name
        ("spark://127.0.0.1:7077", True, True),
        ("spark://localhost:7077", False, True),
        ("spark://vm:7077", True, True),  # the host name is loopback: so is the master
        ("spark://vm:7077", False, False),  # vm has an outside address: workers may be remote
        ("spark://10.1.2.3:7077", True, False),
        ("spark://127.0.0.1:7077,10.1.2.3:7077", True, False),
        ("yarn", True, False),
        ("k8s://https://10.0.0.1:6443", True, False),
    ],
)
def test_bind_choice_binds_locally_when_the_executors_run_here(
    master: str, loopback_host: bool, bound: bool
) -> None:
    choice = choose(master, loopback_host=loopback_host)
    assert dict(choice.conf) == (LOCAL if bound else {})
    assert dict(choice.env) == ({"SPARK_LOCAL_IP": LOOPBACK} if bound else {})
    assert choice.reason


@pytest.mark.parametrize(
    ("env", "conf"),
    [
        ({"SPARK_LOCAL_IP": "10.0.0.5"}, {}),
        ({}, {"spark.driver.host": "driver.example"}),
        ({}, {"spark.driver.bindAddress": "0.0.0.0"}),
    ],
)
def test_bind_choice_keeps_what_the_user_chose(env: dict[str, str], conf: dict[str, str]) -> None:
    choice = choose("local[2]", env=env, conf=conf)
    assert not choice.conf and not choice.env
    assert "set" in choice.reason


def test_host_name_is_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    def resolve(addresses: list[str]) -> Any:
        def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addresses]

        return getaddrinfo

    monkeypatch.setattr(socket, "getaddrinfo", resolve(["127.0.0.1"]))
    assert host_name_is_loopback("vm")
    monkeypatch.setattr(socket, "getaddrinfo", resolve(["127.0.1.1", "::1"]))
    assert host_name_is_loopback("vm")
    monkeypatch.setattr(socket, "getaddrinfo", resolve(["127.0.0.1", "192.0.2.2"]))
    assert not host_name_is_loopback("vm")

    def unresolvable(*args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror("Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    assert host_name_is_loopback("nowhere")


def test_python_worker_handshake_is_longer_than_sparks_default() -> None:
    # Spark's default is 15s: a worker slowed down by the load failed its handshake.
    assert PYTHON_WORKER_CONF == {"spark.python.authenticate.socketTimeout": "120s"}


def test_retryable_start_errors() -> None:
    assert is_retryable_start_error(CONNECT_BACK)
    assert is_retryable_start_error(RuntimeError("Python daemon failed to launch worker"))
    assert not is_retryable_start_error("ConfigurationError: unknown topic 'jobs'")
    assert not is_retryable_start_error(None)


class FakeQuery:
    """A StreamingQuery that stops with ``error``, or starts (status, then progress)."""

    def __init__(self, error: str | None, initializing_polls: int = 1) -> None:
        self.error = error
        self.polls = 0
        self.initializing_polls = initializing_polls

    @property
    def isActive(self) -> bool:
        self.polls += 1
        return self.error is None or self.polls <= 1

    def exception(self) -> Any:
        return RuntimeError(self.error) if self.error else None

    @property
    def lastProgress(self) -> Any:
        return None

    @property
    def status(self) -> dict[str, Any]:
        initializing = self.polls <= self.initializing_polls
        return {"message": "Initializing sources" if initializing else "Waiting for next trigger"}


def starter(errors: list[str | None], **kw: Any) -> tuple[Any, list[FakeQuery]]:
    started: list[FakeQuery] = []

    def start() -> FakeQuery:
        query = FakeQuery(errors[len(started)], **kw)
        started.append(query)
        return query

    return start, started


def test_start_query_starts_again_after_a_python_worker_did_not_connect_back() -> None:
    start, started = starter([CONNECT_BACK, CONNECT_BACK, None])
    with capture_logs() as logs:
        query = start_query(start, name="spark-stats", wait_initial_s=0, poll_s=0)
    assert query is started[-1] and len(started) == 3
    failed = [e for e in logs if e["event"] == "spark_query_start_failed"]
    assert [(e["attempt"], e["retry"]) for e in failed] == [(1, True), (2, True)]
    assert failed[0]["query"] == "spark-stats"
    assert "Python worker failed to connect back" in failed[0]["error"]


def test_start_query_gives_up_after_its_attempts() -> None:
    start, started = starter([CONNECT_BACK] * 3)
    with capture_logs() as logs, pytest.raises(QueryStartError, match="attempt 3 of 3"):
        start_query(start, name="q", attempts=3, wait_initial_s=0, poll_s=0)
    assert len(started) == 3
    retries = [e["retry"] for e in logs if e["event"] == "spark_query_start_failed"]
    assert retries == [True, True, False]


def test_start_query_does_not_retry_other_errors() -> None:
    start, started = starter(["ConfigurationError: unknown topic 'jobs' on 127.0.0.1:9092", None])
    with pytest.raises(QueryStartError, match="unknown topic") as raised:
        start_query(start, name="q", wait_initial_s=0, poll_s=0)
    assert len(started) == 1
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_start_query_returns_a_query_still_initializing_at_its_deadline() -> None:
    start, started = starter([None], initializing_polls=10**9)
    assert start_query(start, name="q", ready_timeout_s=0.05, poll_s=0.01) is started[0]


def test_start_query_needs_an_attempt() -> None:
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        start_query(lambda: None, name="q", attempts=0)
