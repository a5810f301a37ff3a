"""``queueflow configs``: describe and alter a share group's configs, like Kafka's
``kafka-configs.sh --entity-type groups --entity-name G`` (KIP-932 "Group configuration").

::

    queueflow configs --app A --group G --describe [--all]
    queueflow configs --app A --group G --alter --add-config k=v[,k=v] [--delete-config k[,k]]

``--entity-type groups --entity-name G`` are accepted as Kafka spells them. The output follows
Kafka's tool: ``Dynamic configs for group G are:`` (``--all``: ``All configs for group G are:``)
then one ``name=value sensitive=false synonyms={SOURCE:name=value}`` line per config, and
``Completed updating config for group G.`` after an alter. It works through
:meth:`queueflow.admin.ShareGroupAdmin.describe_group_configs` and
:meth:`~queueflow.admin.ShareGroupAdmin.alter_group_configs`, answered by the group's
coordinator, so a worker of the app must be running. A group no member has joined yet can be
configured, as with ``kafka-configs.sh``. Exit code 0 on success, 1 on an error
(unknown config, a value out of range, no answer in time, a refused flag
combination) with the error on stderr.
"""

from __future__ import annotations

import asyncio
import json
import sys

import click

from queueflow.admin import DEFAULT_TIMEOUT_MS, ConfigEntry, ShareGroupAdmin
from queueflow.devtools.broker import bootstrap_from_env
from queueflow.devtools.cli import cli
from queueflow.devtools.cli.share_groups import _Refused, make_admin
from queueflow.errors import QueueflowError

__all__ = ["configs", "parse_add_config"]


def parse_add_config(texts: tuple[str, ...]) -> dict[str, str]:
    """``--add-config`` values: ``k=v`` pairs separated by commas (repeatable), as
    ``kafka-configs.sh`` takes them.

    Raises:
        _Refused: a pair without ``=``, an empty name, or a name given twice.
    """
    out: dict[str, str] = {}
    for text in texts:
        for pair in (p for p in text.split(",") if p.strip()):
            name, sep, value = pair.partition("=")
            name = name.strip()
            if not sep or not name:
                raise _Refused(
                    f"--add-config {text!r}: expected name=value[,name=value], e.g. "
                    "share.delivery.count.limit=3"
                )
            if name in out:
                raise _Refused(f"--add-config sets {name!r} twice")
            out[name] = value.strip()
    return out


def _names(texts: tuple[str, ...]) -> list[str]:
    return [n.strip() for text in texts for n in text.split(",") if n.strip()]


def _lines(group: str, entries: list[ConfigEntry], show_all: bool) -> str:
    shown = entries if show_all else [e for e in entries if e.source == "DYNAMIC_GROUP_CONFIG"]
    title = "All" if show_all else "Dynamic"
    lines = [f"{title} configs for group {group} are:"]
    for e in shown:
        synonym = e.name if e.source != "DEFAULT_CONFIG" else e.synonym
        # a literal default (no broker-level setting) has no synonym: Kafka prints {}
        synonyms = f"{e.source}:{synonym}={e.value}" if synonym else ""
        lines.append(f"  {e.name}={e.value} sensitive=false synonyms={{{synonyms}}}")
    return "\n".join(lines)


def _json(group: str, entries: list[ConfigEntry], show_all: bool) -> str:
    shown = entries if show_all else [e for e in entries if e.source == "DYNAMIC_GROUP_CONFIG"]
    return json.dumps(
        {
            "group": group,
            "configs": [
                {"name": e.name, "value": e.value, "source": e.source, "synonym": e.synonym}
                for e in shown
            ],
        }
    )


async def _describe(admin: ShareGroupAdmin, group: str, show_all: bool, as_json: bool) -> str:
    entries = await admin.describe_group_configs(group)
    if as_json:
        return _json(group, entries, show_all)
    if not show_all and not any(e.source == "DYNAMIC_GROUP_CONFIG" for e in entries):
        try:
            exists = group in {g.group_id for g in await admin.list_groups()}
        except QueueflowError:  # no group table yet: no group
            exists = False
        if not exists:  # Kafka 4.3.1's words
            return f"The group '{group}' doesn't exist and doesn't have dynamic config."
    return _lines(group, entries, show_all)


async def _alter(
    admin: ShareGroupAdmin, group: str, add: dict[str, str], delete: list[str], as_json: bool
) -> str:
    entries = await admin.alter_group_configs(group, add, delete)
    if as_json:
        return _json(group, entries, True)
    return f"Completed updating config for group {group}."


@cli.command("configs")
@click.option("--bootstrap-server", default=None, help="host:port [default: $QUEUEFLOW_BROKER].")
@click.option("--app", "app_id", required=True, help="The queueflow app id (the Faust app's id).")
@click.option("--group", default=None, help="The share group.")
@click.option(
    "--entity-type",
    type=click.Choice(["groups"]),
    default=None,
    help="As kafka-configs.sh: only groups.",
)
@click.option("--entity-name", default=None, help="As kafka-configs.sh: the share group.")
@click.option("--describe", is_flag=True, help="Show the group's configs set with --alter.")
@click.option("--all", "show_all", is_flag=True, help="With --describe: every config and source.")
@click.option("--alter", is_flag=True, help="Set (--add-config) and delete (--delete-config).")
@click.option(
    "--add-config",
    "add_config",
    multiple=True,
    metavar="k=v[,k=v]",
    help="With --alter: configs to set, e.g. share.delivery.count.limit=3.",
)
@click.option(
    "--delete-config",
    "delete_config",
    multiple=True,
    metavar="k[,k]",
    help="With --alter: configs to return to their default.",
)
@click.option(
    "--timeout", "timeout_ms", type=click.IntRange(1), default=DEFAULT_TIMEOUT_MS, show_default=True
)
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def configs(
    bootstrap_server: str | None,
    app_id: str,
    group: str | None,
    entity_type: str | None,
    entity_name: str | None,
    describe: bool,
    show_all: bool,
    alter: bool,
    add_config: tuple[str, ...],
    delete_config: tuple[str, ...],
    timeout_ms: int,
    output: str,
) -> None:
    """Describe or alter the configs of a share group (like kafka-configs.sh --entity-type
    groups): share.auto.offset.reset, share.record.lock.duration.ms,
    share.delivery.count.limit, share.partition.max.record.locks, share.session.timeout.ms,
    share.heartbeat.interval.ms."""

    def refuse(message: str) -> None:
        click.echo(f"Error: {message}", err=True)
        sys.exit(1)

    if describe == alter:
        refuse("Command must include exactly one action: --describe, --alter.")
    if group is not None and entity_name is not None and group != entity_name:
        refuse("--group and --entity-name name different groups; give one")
    name = group or entity_name
    if not name:
        refuse("give the share group: --group G (or --entity-type groups --entity-name G)")
        return
    if show_all and not describe:
        refuse("--all may be used with --describe only")
    if (add_config or delete_config) and not alter:
        refuse("--add-config and --delete-config may be used with --alter only")
    if alter and not (add_config or delete_config):
        refuse("--alter needs --add-config k=v[,k=v] and/or --delete-config k[,k]")
    try:
        add = parse_add_config(add_config)
    except _Refused as exc:
        refuse(str(exc))
        return
    bootstrap = bootstrap_server or bootstrap_from_env() or "localhost:9092"
    admin = make_admin(app_id, bootstrap, timeout_ms)
    as_json = output == "json"
    try:
        if describe:
            text = asyncio.run(_describe(admin, name, show_all, as_json))
        else:
            text = asyncio.run(_alter(admin, name, add, _names(delete_config), as_json))
    except (QueueflowError, TimeoutError) as exc:
        refuse(str(exc))
        return
    click.echo(text)
