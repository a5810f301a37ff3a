"""``queueflow leader``: run a leader-only worker (share-group coordinator and share-partition
leaders) for the given topics, as a Faust worker."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from queueflow.devtools.broker import bootstrap_from_env
from queueflow.devtools.cli import cli


@cli.command()
@click.option("--app", "app_id", required=True, help="App id; members use the same id.")
@click.option("--topic", "topics", multiple=True, required=True, help="Source topic (repeatable).")
@click.option(
    "--broker",
    default=None,
    help="Faust broker URL [default: kafka://$QUEUEFLOW_BROKER or localhost:9092].",
)
@click.option(
    "--datadir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Faust data directory (RocksDB state) [default: ./.queueflow/<app>-leader].",
)
@click.option("--web-port", type=click.IntRange(1, 65535), default=6066, show_default=True)
@click.option(
    "-l",
    "--loglevel",
    default="info",
    show_default=True,
    type=click.Choice(["crit", "error", "warn", "info", "debug"]),
)
def leader(
    app_id: str,
    topics: tuple[str, ...],
    broker: str | None,
    datadir: Path | None,
    web_port: int,
    loglevel: str,
) -> None:
    """Lead the share groups of APP on TOPICs (replaces this process with a Faust worker).

    A new share group starts at share.auto.offset.reset. With `latest` (the default, as Kafka's)
    it skips the records produced before its first fetch, and the leader logs how many
    (share_partition_started_past_records); to have them, set
    QUEUEFLOW_SHARE_AUTO_OFFSET_RESET=earliest or the group config share.auto.offset.reset.
    """
    broker = broker or f"kafka://{bootstrap_from_env() or 'localhost:9092'}"
    datadir = datadir or Path(".queueflow") / f"{app_id}-leader"
    env = dict(
        os.environ,
        QUEUEFLOW_APP_ID=app_id,
        QUEUEFLOW_TOPICS=",".join(topics),
        QUEUEFLOW_BROKER_URL=broker,
    )
    argv = [
        sys.executable,
        "-m",
        "faust",
        "-A",
        "queueflow.devtools.standalone",
        "--datadir",
        str(datadir),
        "worker",
        "-l",
        loglevel,
        "--web-port",
        str(web_port),
    ]
    os.execve(sys.executable, argv, env)
