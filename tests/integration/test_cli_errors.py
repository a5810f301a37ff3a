"""Every ``queueflow`` CLI command that talks to Kafka turns a connection failure into one line
on stderr naming the bootstrap servers, what was tried, what happened and what to do, and
exits 1 as Kafka's tools do (``kafka-share-groups.sh`` prints ``Error: ...`` and exits 1):
an unreachable bootstrap, a wrong one (a server that is not a Kafka client listener), and TLS or
SASL spoken to the real broker's PLAINTEXT listener (docs/operations.md "Outages at start")."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from queueflow.devtools.broker import find_free_ports

#: Each command, given a bootstrap (one CLI run takes ~1 s; the bound is generous for a busy box).
RUN_TIMEOUT_S = 60


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "queueflow", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, **(env or {})},
        check=False,
    )


def commands(bootstrap: str) -> list[list[str]]:
    """Every subcommand that connects to the cluster (``broker status`` checks reachability
    itself; ``leader`` becomes a Faust worker, which has its own start-up error)."""
    b = ["--bootstrap-server", bootstrap]
    return [
        ["share-groups", *b, "--app", "qf-cli-errors", "--list"],
        ["share-groups", *b, "--app", "qf-cli-errors", "--describe", "--group", "g", "--state"],
        ["configs", *b, "--app", "qf-cli-errors", "--group", "g", "--describe"],
        [
            "acls",
            "apply",
            *b,
            "--app",
            "qf-cli-errors",
            "--topic",
            "t",
            "--leader-principal",
            "User:l",
        ],
    ]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], server: str, cause: str) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    (line,) = lines
    assert line.startswith(f"Error: could not connect to Kafka at {server} (queueflow "), line
    assert cause in line, line
    assert "To fix: " in line and "--bootstrap-server" in line, line
    assert "Traceback" not in proc.stdout + proc.stderr
    return line


def test_unreachable_bootstrap_is_one_line_and_exit_1() -> None:
    (port,) = find_free_ports(1)  # nothing listens there
    server = f"127.0.0.1:{port}"
    lines = [
        assert_one_line_error(run_cli(*cmd), server, "the connection was refused")
        for cmd in commands(server)
    ]
    assert "(queueflow share-groups --list)" in lines[0]
    assert "(queueflow acls apply)" in lines[3]
    assert "start the broker (e.g. `queueflow broker start`)" in lines[0]


def test_bootstrap_from_the_environment_is_named() -> None:
    (port,) = find_free_ports(1)
    proc = run_cli(
        "share-groups", "--app", "x", "--list", env={"QUEUEFLOW_BROKER": f"127.0.0.1:{port}"}
    )
    assert_one_line_error(proc, f"127.0.0.1:{port}", "refused")


def test_unresolvable_host_is_one_line_and_exit_1() -> None:
    proc = run_cli(
        "share-groups", "--bootstrap-server", "no-such-host.invalid:9092", "--app", "x", "--list"
    )
    assert_one_line_error(proc, "no-such-host.invalid:9092", "the host name does not resolve")


@pytest.fixture
def not_kafka() -> Iterator[str]:
    """A server that answers like a web server and hangs up: a wrong bootstrap (some other
    service's port)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_wrong_bootstrap_is_one_line_and_exit_1(not_kafka: str) -> None:
    for cmd in commands(not_kafka):
        line = assert_one_line_error(run_cli(*cmd), not_kafka, "no Kafka answer")
        print(line)
        assert "Kafka broker's client listener" in line


def test_tls_and_sasl_against_a_plaintext_broker_are_one_line(kafka_bootstrap: str) -> None:
    """The real broker's PLAINTEXT listener spoken to with TLS, then with SASL."""
    server = kafka_bootstrap.split(",")[0]
    base = ["acls", "apply", "--bootstrap-server", server, "--app", "x", "--topic", "t"]
    base += ["--leader-principal", "User:l"]
    tls = run_cli(*base, "--security-protocol", "SSL")
    print(f"$ queueflow acls apply ... --security-protocol SSL\n{tls.stderr}")
    assert_one_line_error(tls, server, "the TLS handshake failed")
    sasl = run_cli(
        *base,
        "--security-protocol",
        "SASL_PLAINTEXT",
        "--sasl-mechanism",
        "PLAIN",
        "--sasl-username",
        "admin",
        env={"QUEUEFLOW_SASL_PASSWORD": "not-the-password"},
    )
    print(f"$ queueflow acls apply ... --security-protocol SASL_PLAINTEXT\n{sasl.stderr}")
    assert_one_line_error(sasl, server, "SASL authentication failed")


def test_right_bootstrap_still_gives_the_usual_answer(kafka_bootstrap: str) -> None:
    """A reachable cluster without the app: the existing error, not a connection error."""
    proc = run_cli(
        "share-groups", "--bootstrap-server", kafka_bootstrap, "--app", "qf-cli-no-app", "--list"
    )
    assert proc.returncode == 1
    assert "no share groups found for app 'qf-cli-no-app'" in proc.stderr
    assert "could not connect" not in proc.stderr


def test_unknown_environment_variable_is_refused_by_the_cli(kafka_bootstrap: str) -> None:
    proc = run_cli(
        "share-groups",
        "--bootstrap-server",
        kafka_bootstrap,
        "--app",
        "x",
        "--list",
        env={"QUEUEFLOW_GROUP_SHARE_DELIVERY_COUNT_LIMT": "3"},
    )
    assert proc.returncode == 1
    assert "$QUEUEFLOW_GROUP_SHARE_DELIVERY_COUNT_LIMT (did you mean" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
