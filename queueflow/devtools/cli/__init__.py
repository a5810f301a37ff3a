"""The ``queueflow`` command line (entry point ``queueflow = "queueflow.devtools.cli:main"``).

Each subcommand lives in its own module under ``queueflow/devtools/cli/`` and attaches itself to
:data:`cli` on import (``@cli.group()`` / ``@cli.command()``); register it by importing it at the
bottom of this file.
"""

from __future__ import annotations

from typing import Any

import click

from queueflow.errors import UnknownNameError
from queueflow.kafka.reachability import (
    capture_connect_errors,
    connection_failure,
    is_connection_error,
)
from queueflow.settings import check_environment


def _option(args: list[str], name: str) -> str | None:
    """The value of ``name`` (``--name V`` or ``--name=V``) in raw ``args``, else None."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


class QueueflowCli(click.Group):
    """The ``queueflow`` group: every subcommand runs inside one wrapper that turns a failure
    to reach the Kafka cluster (unreachable or wrong bootstrap servers, TLS or SASL failure)
    into one line on stderr, ``Error: could not connect to Kafka at HOST:PORT (queueflow
    CMD ...): HOST:PORT: <what happened>. To fix: <what to do> ...``, and exit code 1, as
    Kafka's tools (``kafka-share-groups.sh`` prints ``Error: ...`` and exits 1). aiokafka's
    own log lines about it are kept off stderr (docs/operations.md "Outages at start").
    Unknown ``QUEUEFLOW_*`` environment variables are refused first (same exit code)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["queueflow.argv"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            check_environment()  # a misspelt $QUEUEFLOW_BROKER must not start a local broker
        except UnknownNameError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(1)
        with capture_connect_errors(quiet=True) as attempts:
            try:
                return super().invoke(ctx)
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                argv: list[str] = ctx.meta.get("queueflow.argv", [])
                click.echo(f"Error: {_connection_line(argv, attempts, exc)}", err=True)
                ctx.exit(1)


def _connection_line(argv: list[str], attempts: Any, exc: BaseException) -> str:
    from queueflow.devtools.broker import bootstrap_from_env

    bootstrap = _option(argv, "--bootstrap-server") or bootstrap_from_env() or "localhost:9092"
    first_option = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    words = argv[:first_option][:2]  # the (sub)command's names
    actions = [a for a in argv if a.startswith("--") and a[2:] in _ACTIONS]
    tried = " ".join(["queueflow", *words, *actions])
    return connection_failure(
        bootstrap,
        attempts,
        exc,
        tried,
        origin="the bootstrap servers: --bootstrap-server, else $QUEUEFLOW_BROKER, else "
        "localhost:9092",
        security_protocol=_option(argv, "--security-protocol") or "PLAINTEXT",
    )


#: Flags named in the error's "what was tried".
_ACTIONS = frozenset({"list", "describe", "delete", "reset-offsets", "delete-offsets", "alter"})


@click.group(cls=QueueflowCli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="queueflow")
def cli() -> None:
    """queueflow: KIP-932 share groups (queues for Kafka) on faust-streaming + aiokafka."""


# Subcommand modules: import each one here so that it registers itself on `cli`, e.g.
# `from queueflow.devtools.cli import broker, worker, groups`.
from queueflow.devtools.cli import acls, auth, broker, configs, leader, share_groups  # noqa: E402


def main() -> None:
    """The ``queueflow`` program: queueflow's logging set-up (:func:`queueflow.logging.configure`,
    format from ``$QUEUEFLOW_LOG_FORMAT``), then :data:`cli`. In-process callers (tests with
    click's ``CliRunner``) invoke :data:`cli` and keep their own logging."""
    from queueflow import logging as qf_logging

    qf_logging.configure()
    cli()


__all__ = ["acls", "auth", "broker", "cli", "configs", "leader", "main", "share_groups"]
