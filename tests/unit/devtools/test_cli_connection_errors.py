"""The ``queueflow`` CLI's one wrapper for connection failures, and the one-line explanations
of :mod:`queueflow.kafka.reachability` (the real broker: tests/integration/test_cli_errors.py)."""

from __future__ import annotations

import asyncio
import socket
import ssl

from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed
from click.testing import CliRunner

from queueflow.devtools.broker import find_free_ports
from queueflow.devtools.cli import cli
from queueflow.kafka.reachability import (
    ConnectAttempt,
    capture_connect_errors,
    connection_failure,
    is_connection_error,
)


def explain(error: BaseException | str) -> str:
    return connection_failure(
        "h:1", [ConnectAttempt("h", 1, error)], KafkaConnectionError("x"), "test"
    )


def test_each_cause_says_what_happened_and_what_to_do() -> None:
    refused = explain(ConnectionRefusedError(111, "Connect call failed ('h', 1)"))
    assert refused.startswith("could not connect to Kafka at h:1 (test): h:1: the connection was")
    assert "start the broker" in refused
    assert "does not resolve" in explain(socket.gaierror(-2, "Name or service not known"))
    tls = explain(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"))
    assert "the TLS handshake failed" in tls and "security protocol" in tls
    sasl = explain(SaslAuthenticationFailed())
    assert "SASL authentication failed" in sasl and "user name and password" in sasl
    assert "no answer in time" in explain(asyncio.TimeoutError())
    assert "client listener" in explain("Connection at h:1 closed")
    reset = connection_failure(
        "h:1", [ConnectAttempt("h", 1, ConnectionResetError())], None, "t", "", "SSL"
    )
    assert "the TLS handshake failed: the server closed the connection" in reset
    assert "\n" not in refused


def test_without_logged_attempts_the_exception_is_the_cause() -> None:
    line = connection_failure("a:1,b:2", [], KafkaConnectionError("Unable to bootstrap"), "t", "o")
    assert line.startswith("could not connect to Kafka at a:1,b:2 (t): a:1,b:2: no Kafka answer")
    assert line.endswith("(o)")


def test_connection_errors_are_recognised_through_their_causes() -> None:
    try:
        try:
            raise ConnectionRefusedError()
        except OSError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert is_connection_error(wrapped)
    assert not is_connection_error(ValueError("a bad argument"))


def test_aiokafkas_logged_causes_are_captured() -> None:
    import logging

    with capture_connect_errors(quiet=True) as attempts:
        logging.getLogger("aiokafka").error('Unable connect to "%s:%s": %s', "h", 9, "boom")
    assert attempts == [ConnectAttempt("h", 9, "boom")]


def test_every_command_gets_one_line_and_exit_1_on_a_refused_bootstrap() -> None:
    (port,) = find_free_ports(1)
    runner = CliRunner()
    for args in (
        ["share-groups", "--app", "x", "--list"],
        ["configs", "--app", "x", "--group", "g", "--describe"],
    ):
        result = runner.invoke(cli, [*args, "--bootstrap-server", f"127.0.0.1:{port}"])
        assert result.exit_code == 1, result.output
        # (in-process, queueflow's logging is not set up: its debug lines reach the output)
        [line] = [x for x in result.output.splitlines() if "[debug" not in x]
        assert line.startswith(f"Error: could not connect to Kafka at 127.0.0.1:{port} (queueflow ")
        assert "the connection was refused" in line


def test_unknown_environment_variables_stop_every_command() -> None:
    result = CliRunner().invoke(cli, ["broker", "status"], env={"QUEUEFLOW_BROKR": "h:1"})
    assert result.exit_code == 1
    assert "$QUEUEFLOW_BROKR (did you mean $QUEUEFLOW_BROKER" in result.output
