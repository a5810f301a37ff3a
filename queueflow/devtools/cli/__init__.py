"""The ``queueflow`` command line (entry point ``queueflow = "queueflow.devtools.cli:main"``).

Each subcommand lives in its own module under ``queueflow/devtools/cli/`` and attaches itself to
:data:`cli` on import (``@cli.group()`` / ``@cli.command()``); register it by importing it at the
bottom of this file.
"""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
