"""``queueflow share-groups``: list and describe an app's share groups, with the flags, columns
and exit codes of Kafka's ``kafka-share-groups.sh`` (notes §7.1), plus ``--output json``.

It reads through :class:`queueflow.admin.ShareGroupAdmin`, so it needs the app id (``--app``)
besides the bootstrap servers. Exit code 0 on success, 1 on an error (unknown group, no such
app, a flag combination Kafka's tool refuses), with the error on stderr.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from queueflow.admin import (
    DEFAULT_TIMEOUT_MS,
    ShareGroupAdmin,
    ShareGroupDescription,
    SharePartitionOffsets,
    describe_json,
)
from queueflow.devtools.broker import bootstrap_from_env
from queueflow.devtools.cli import cli
from queueflow.errors import QueueflowError
from queueflow.kafka.config import KafkaClientConfig

__all__ = ["share_groups"]

_MODES = ("offsets", "members", "state")


def _table(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as left-aligned columns, two spaces apart (as Kafka's tools print them)."""
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def _assignment(description: ShareGroupDescription, member_index: int) -> str:
    """``topic:0,1;other:2`` (Kafka's ASSIGNMENT column)."""
    by_topic: dict[str, list[int]] = {}
    for tp in description.members[member_index].assignment:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ";".join(f"{t}:{','.join(map(str, ps))}" for t, ps in sorted(by_topic.items())) or "-"


def _offset_rows(
    group: str, offsets: list[SharePartitionOffsets], verbose: bool
) -> list[list[Any]]:
    header = ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
    if verbose:
        header += ["END-OFFSET", "LOG-END-OFFSET", "AVAILABLE", "ACQUIRED", "ACKNOWLEDGED"]
        header += ["ARCHIVED"]
    rows: list[list[Any]] = [header]
    for o in offsets:
        row: list[Any] = [group, o.topic, o.partition, o.start_offset, o.lag]
        if verbose:
            row += [o.end_offset, o.log_end_offset]
            row += [o.in_flight.get(s) for s in ("AVAILABLE", "ACQUIRED", "ACKNOWLEDGED")]
            row += [o.in_flight.get("ARCHIVED")]
        rows.append(row)
    return rows


async def _run(
    admin: ShareGroupAdmin,
    action: str,
    groups: list[str] | None,
    mode: str,
    state_filter: str | None,
    verbose: bool,
    as_json: bool,
) -> str:
    if action == "list":
        states = None if state_filter in (None, "") else [state_filter or ""]
        listed = await admin.list_groups(states)
        if as_json:
            return json.dumps(describe_json(listed))
        if state_filter is None:
            return "\n".join(g.group_id for g in listed)
        return _table([["GROUP", "STATE"], *[[g.group_id, g.state] for g in listed]])
    names = groups if groups is not None else [g.group_id for g in await admin.list_groups()]
    descriptions = await admin.describe_groups(names)
    out: list[Any] = []
    texts: list[str] = []
    for d in descriptions:
        if mode == "offsets":
            offsets = await admin.list_offsets(d.group_id)
            out.append({"group": d.group_id, "offsets": describe_json(offsets)})
            texts.append(_table(_offset_rows(d.group_id, offsets, verbose)))
        elif mode == "members":
            out.append(describe_json(d))
            header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
            rows: list[list[Any]] = [header + (["MEMBER-EPOCH"] if verbose else [])]
            for i, m in enumerate(d.members):
                row: list[Any] = [d.group_id, m.member_id, m.host or "-", m.client_id or "-"]
                row += [len(m.assignment), _assignment(d, i)]
                rows.append(row + ([m.member_epoch] if verbose else []))
            if not d.members:
                texts.append(f"Share group '{d.group_id}' has no active members.")
            else:
                texts.append(_table(rows))
        else:
            out.append({k: v for k, v in describe_json(d).items() if k != "members"})
            header = ["GROUP", "COORDINATOR (ID)", "STATE", "#MEMBERS"]
            extra = ["GROUP-EPOCH", "ASSIGNMENT-EPOCH"] if verbose else []
            row = [d.group_id, "-", d.state, len(d.members)]
            row += [d.group_epoch, d.assignment_epoch] if verbose else []
            texts.append(_table([header + extra, row]))
    return json.dumps(out) if as_json else "\n\n".join(texts)


@cli.command("share-groups")
@click.option("--bootstrap-server", default=None, help="host:port [default: $QUEUEFLOW_BROKER].")
@click.option("--app", "app_id", required=True, help="The queueflow app id (the Faust app's id).")
@click.option("--list", "do_list", is_flag=True, help="List the share groups.")
@click.option("--describe", is_flag=True, help="Describe --group G or --all-groups.")
@click.option("--group", "group_ids", multiple=True, help="A share group (repeatable).")
@click.option("--all-groups", is_flag=True, help="With --describe: every share group.")
@click.option("--offsets", is_flag=True, help="With --describe: SPSO and lag (the default).")
@click.option("--members", is_flag=True, help="With --describe: members and assignments.")
@click.option(
    "--state",
    "state",
    is_flag=False,
    flag_value="",
    default=None,
    help="With --describe: group state. With --list: only groups in STATE (Empty, Stable, "
    "Dead), or every group with its state.",
)
@click.option("--verbose", is_flag=True, help="More columns.")
@click.option(
    "--timeout", "timeout_ms", type=click.IntRange(1), default=DEFAULT_TIMEOUT_MS, show_default=True
)
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def share_groups(
    bootstrap_server: str | None,
    app_id: str,
    do_list: bool,
    describe: bool,
    group_ids: tuple[str, ...],
    all_groups: bool,
    offsets: bool,
    members: bool,
    state: str | None,
    verbose: bool,
    timeout_ms: int,
    output: str,
) -> None:
    """List and describe the share groups of a queueflow app (like kafka-share-groups.sh)."""

    def refuse(message: str) -> None:
        click.echo(f"Error: {message}", err=True)
        sys.exit(1)

    if do_list == describe:
        refuse("exactly one of --list and --describe is required")
    if do_list and (group_ids or all_groups or offsets or members or verbose):
        refuse("--list takes only --state [STATE]")
    mode = "offsets"
    if describe:
        if bool(group_ids) == all_groups:
            refuse("--describe needs --group G (repeatable) or --all-groups, not both")
        flags = (offsets, members, state is not None)
        chosen = [m for m, on in zip(_MODES, flags, strict=True) if on]
        if len(chosen) > 1 or (state not in (None, "")):
            refuse("--describe takes at most one of --offsets, --members and --state (no value)")
        mode = chosen[0] if chosen else "offsets"
    bootstrap = bootstrap_server or bootstrap_from_env() or "localhost:9092"
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(bootstrap, "queueflow-cli"), timeout_ms)
    try:
        text = asyncio.run(
            _run(
                admin,
                "list" if do_list else "describe",
                list(group_ids) if group_ids else None,
                mode,
                state if do_list else None,
                verbose,
                output == "json",
            )
        )
    except (QueueflowError, TimeoutError) as exc:
        refuse(str(exc))
        return
    if text:
        click.echo(text)
