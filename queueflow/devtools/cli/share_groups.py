"""``queueflow share-groups``: list, describe, reset and delete an app's share groups, with the
flags, columns and exit codes of Kafka's ``kafka-share-groups.sh`` (KIP-932 "Command-line tools"),
plus
``--output json``.

It works through :class:`queueflow.admin.ShareGroupAdmin`, so it needs the app id (``--app``)
besides the bootstrap servers; the write actions (``--reset-offsets --execute``,
``--delete-offsets``, ``--delete``) need a running worker of the app (its coordinator and
leaders apply them). Exit code 0 on success, 1 on an error (unknown group, a group with members,
no such app, no answer in time) and on a flag combination Kafka's tool refuses, with the error on
stderr: Kafka's tool exits 1 for both (``CommandLineUtils.printUsageAndExit``), not click's
usage-error code 2.

``--reset-offsets`` takes Kafka's ``--to-earliest``, ``--to-latest`` and ``--to-datetime``, plus
``--by-duration`` and ``--to-offset`` as ``kafka-consumer-groups.sh`` has them (Kafka 4.3's
``kafka-share-groups.sh`` lacks those two).
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
    OffsetSpec,
    ShareGroupAdmin,
    ShareGroupDescription,
    SharePartitionOffsets,
    describe_json,
)
from queueflow.devtools.broker import bootstrap_from_env
from queueflow.devtools.cli import cli
from queueflow.devtools.cli.redrive import redrive_text
from queueflow.errors import ErrorCode, QueueflowError, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.structs import TopicPartition

__all__ = ["share_groups"]

_MODES = ("offsets", "members", "state")
_ACTIONS = ("--list", "--describe", "--delete", "--reset-offsets", "--delete-offsets", "--redrive")
_SCENARIOS = ("--to-earliest", "--to-latest", "--to-datetime", "--by-duration", "--to-offset")


class _Refused(Exception):
    """A flag combination or an argument the tool refuses (exit 1, message on stderr)."""


def make_admin(app_id: str, bootstrap: str, timeout_ms: int) -> ShareGroupAdmin:
    """The admin the command uses (tests replace it)."""
    return ShareGroupAdmin(app_id, KafkaClientConfig(bootstrap, "queueflow-cli"), timeout_ms)


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
        header += ["ARCHIVED", "LEADER"]
    # Records held while they are written to the dead-letter topic (shown when there are any).
    archiving = verbose and any(o.in_flight.get("ARCHIVING") for o in offsets)
    if archiving:
        header.insert(-1, "ARCHIVING")
    rows: list[list[Any]] = [header]
    for o in offsets:
        row: list[Any] = [group, o.topic, o.partition, o.start_offset, o.lag]
        if verbose:
            row += [o.end_offset, o.log_end_offset]
            row += [o.in_flight.get(s) for s in ("AVAILABLE", "ACQUIRED", "ACKNOWLEDGED")]
            row += [o.in_flight.get("ARCHIVED"), o.leader]
            if archiving:
                row.insert(-1, o.in_flight.get("ARCHIVING", 0))
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
            verbose_header = ["MEMBER-EPOCH", "ASSIGNORS", "RACK"]
            rows: list[list[Any]] = [header + (verbose_header if verbose else [])]
            for i, m in enumerate(d.members):
                row: list[Any] = [d.group_id, m.member_id, m.host or "-", m.client_id or "-"]
                row += [len(m.assignment), _assignment(d, i)]
                more = [m.member_epoch, ",".join(m.assignors) or "-", m.rack_id or "-"]
                rows.append(row + (more if verbose else []))
            if not d.members:
                texts.append(f"Share group '{d.group_id}' has no active members.")
            else:
                texts.append(_table(rows))
        else:
            out.append({k: v for k, v in describe_json(d).items() if k != "members"})
            header = ["GROUP", "COORDINATOR (ID)", "STATE", "#MEMBERS"]
            extra = ["GROUP-EPOCH", "ASSIGNMENT-EPOCH", "ASSIGNOR"] if verbose else []
            row = [d.group_id, d.coordinator or "-", d.state, len(d.members)]
            row += [d.group_epoch, d.assignment_epoch, d.assignor] if verbose else []
            texts.append(_table([header + extra, row]))
    return json.dumps(out) if as_json else "\n\n".join(texts)


def _topic_partitions(spec: str) -> tuple[str, list[int] | None]:
    """``topic`` or ``topic:0,1,2`` (Kafka's ``--topic`` format for ``--reset-offsets``)."""
    topic, sep, parts = spec.partition(":")
    if not topic:
        raise _Refused(f"--topic {spec!r}: expected topic or topic:0,1,2")
    if not sep:
        return topic, None
    try:
        partitions = sorted({int(p) for p in parts.split(",")})
    except ValueError:
        raise _Refused(
            f"--topic {spec!r}: partitions must be numbers, e.g. {topic}:0,1,2"
        ) from None
    if not partitions or partitions[0] < 0:
        raise _Refused(f"--topic {spec!r}: partitions must be numbers >= 0")
    return topic, partitions


async def _reset(
    admin: ShareGroupAdmin,
    group: str,
    topic_specs: list[str],
    spec: OffsetSpec,
    execute: bool,
    as_json: bool,
) -> str:
    """``--reset-offsets``: the plan (``--dry-run``) or the reset (``--execute``)."""
    (description,) = await admin.describe_groups([group])
    if description.members:
        raise ShareGroupError(ErrorCode.NON_EMPTY_GROUP, f"Share group '{group}' is not empty.")
    counts = description.partitions
    targets: list[TopicPartition] = []
    for topic, partitions in (
        [_topic_partitions(t) for t in topic_specs]
        if topic_specs
        else [(t, None) for t in sorted(counts)]
    ):
        if topic not in counts:
            raise ShareGroupError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"share group {group!r} has no share-partitions of topic {topic!r} (its topics: "
                f"{', '.join(sorted(counts)) or 'none'})",
            )
        for p in partitions if partitions is not None else range(counts[topic]):
            if p >= counts[topic]:
                raise ShareGroupError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} has no partition {p} (partitions 0..{counts[topic] - 1})",
                )
            targets.append(TopicPartition(topic, p))
    offsets = await admin.resolve_offsets(targets, spec)
    if execute:
        offsets = await admin.alter_share_group_offsets(group, offsets)
    rows = [[group, tp.topic, tp.partition, o] for tp, o in sorted(offsets.items())]
    if as_json:
        keys = ("group", "topic", "partition", "new_offset")
        return json.dumps([dict(zip(keys, row, strict=True)) for row in rows])
    return _table([["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], *rows])


async def _delete_offsets(
    admin: ShareGroupAdmin, group: str, topic_names: list[str], as_json: bool
) -> str:
    """``--delete-offsets``: Kafka's ``TOPIC STATUS`` table."""
    await admin.delete_share_group_offsets(group, topic_names)
    names = sorted(set(topic_names))
    if as_json:
        return json.dumps([{"topic": t, "status": "Successful"} for t in names])
    return _table([["TOPIC", "STATUS"], *[[t, "Successful"] for t in names]])


async def _delete(
    admin: ShareGroupAdmin, groups: list[str] | None, as_json: bool
) -> tuple[str, bool]:
    """``--delete``: Kafka's messages; False if a group could not be deleted."""
    names = groups if groups is not None else [g.group_id for g in await admin.list_groups()]
    results = await admin.delete_share_groups(names)
    failed = {g: e for g, e in results.items() if e is not None}
    if as_json:
        out = {
            g: None if e is None else {"error": e.code.value, "message": e.message}
            for g, e in results.items()
        }
        return json.dumps(out), not failed
    done = [g for g, e in results.items() if e is None]
    quoted = ", ".join(f"'{g}'" for g in done)
    if not failed:
        return f"Deletion of requested share groups ({quoted}) was successful.", True
    lines = ["Deletion of some share groups failed:"]
    lines += [f"* Group '{g}' could not be deleted due to: {e}" for g, e in failed.items()]
    if done:
        lines += ["", f"These share groups were deleted successfully: {quoted}"]
    return "\n".join(lines), False


def _scenario(
    earliest: bool, latest: bool, datetime: str | None, duration: str | None, offset: int | None
) -> OffsetSpec:
    if earliest:
        return OffsetSpec.earliest()
    if latest:
        return OffsetSpec.latest()
    if datetime is not None:
        return OffsetSpec.at(datetime)
    if duration is not None:
        return OffsetSpec.ago(duration)
    assert offset is not None
    return OffsetSpec.exact(offset)


@cli.command("share-groups")
@click.option("--bootstrap-server", default=None, help="host:port [default: $QUEUEFLOW_BROKER].")
@click.option("--app", "app_id", required=True, help="The queueflow app id (the Faust app's id).")
@click.option("--list", "do_list", is_flag=True, help="List the share groups.")
@click.option("--describe", is_flag=True, help="Describe --group G or --all-groups.")
@click.option(
    "--reset-offsets",
    is_flag=True,
    help="Reset the start offsets of an empty group: --group G, --topic T[:P,P] or --all-topics, "
    "one of --to-earliest/--to-latest/--to-datetime/--by-duration/--to-offset, and --dry-run "
    "or --execute.",
)
@click.option(
    "--delete-offsets", is_flag=True, help="Delete the offsets of --topic T of an empty --group G."
)
@click.option(
    "--delete", is_flag=True, help="Delete empty share groups (--group G or --all-groups)."
)
@click.option(
    "--redrive",
    is_flag=True,
    help="Move the records of --group G's dead-letter topic back to their source topics "
    "(or --to TOPIC); --dry-run only counts them.",
)
@click.option("--to", "redrive_to", default=None, help="With --redrive: the destination topic.")
@click.option("--group", "group_ids", multiple=True, help="A share group (repeatable).")
@click.option("--all-groups", is_flag=True, help="With --describe or --delete: every share group.")
@click.option(
    "--topic",
    "topic_specs",
    multiple=True,
    help="With --reset-offsets: topic or topic:0,1,2; with --delete-offsets: a topic (repeatable).",
)
@click.option("--all-topics", is_flag=True, help="With --reset-offsets: every topic of the group.")
@click.option("--to-earliest", is_flag=True, help="Reset to the log start offset.")
@click.option("--to-latest", is_flag=True, help="Reset to the log end offset.")
@click.option(
    "--to-datetime",
    metavar="YYYY-MM-DDThh:mm:ss.sss",
    default=None,
    help="Reset to the first offset at or after this time (UTC unless it has a zone).",
)
@click.option(
    "--by-duration",
    metavar="PnDTnHnMnS",
    default=None,
    help="Reset to the first offset at or after now minus this ISO-8601 duration.",
)
@click.option(
    "--to-offset",
    type=int,
    default=None,
    help="Reset to this offset (clamped to the log start and end).",
)
@click.option(
    "--dry-run", is_flag=True, help="With --reset-offsets or --redrive: only show the plan."
)
@click.option("--execute", is_flag=True, help="With --reset-offsets: reset.")
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
    reset_offsets: bool,
    delete_offsets: bool,
    delete: bool,
    redrive: bool,
    redrive_to: str | None,
    group_ids: tuple[str, ...],
    all_groups: bool,
    topic_specs: tuple[str, ...],
    all_topics: bool,
    to_earliest: bool,
    to_latest: bool,
    to_datetime: str | None,
    by_duration: str | None,
    to_offset: int | None,
    dry_run: bool,
    execute: bool,
    offsets: bool,
    members: bool,
    state: str | None,
    verbose: bool,
    timeout_ms: int,
    output: str,
) -> None:
    """List, describe, reset and delete the share groups of a queueflow app (like
    kafka-share-groups.sh)."""

    def refuse(message: str) -> None:
        click.echo(f"Error: {message}", err=True)
        sys.exit(1)

    actions = (do_list, describe, delete, reset_offsets, delete_offsets, redrive)
    if sum(actions) != 1:
        refuse(f"Command must include exactly one action: {', '.join(_ACTIONS)}.")
    scenarios = (
        to_earliest,
        to_latest,
        to_datetime is not None,
        by_duration is not None,
        to_offset is not None,
    )
    reset_only = [name for name, on in zip(_SCENARIOS, scenarios, strict=True) if on] + [
        n
        for n, on in (("--all-topics", all_topics), ("--dry-run", dry_run), ("--execute", execute))
        if on
    ]
    if redrive and reset_only and reset_only != ["--dry-run"]:
        refuse(f"{reset_only[0]} may be used with --reset-offsets only")
    if redrive and len(group_ids) != 1:
        refuse("--redrive takes exactly one --group")
    if redrive_to is not None and not redrive:
        refuse("--to may be used with --redrive only")
    if reset_only and not (reset_offsets or redrive):
        refuse(f"{reset_only[0]} may be used with --reset-offsets only")
    if topic_specs and not (reset_offsets or delete_offsets):
        refuse("--topic may be used with --reset-offsets or --delete-offsets only")
    describe_only = [n for n, on in (("--offsets", offsets), ("--members", members)) if on]
    if (describe_only or verbose) and not describe:
        refuse(f"{(describe_only or ['--verbose'])[0]} may be used with --describe only")
    if state is not None and not (describe or do_list):
        refuse("--state may be used with --describe or --list only")
    if all_groups and not (describe or delete):
        refuse("--all-groups may be used with --describe or --delete only")
    if do_list and group_ids:
        refuse("--list takes only --state [STATE]")
    mode = "offsets"
    if (describe or delete) and bool(group_ids) == all_groups:
        action = "--describe" if describe else "--delete"
        refuse(f"{action} needs --group G (repeatable) or --all-groups, not both")
    if describe:
        flags = (offsets, members, state is not None)
        chosen = [m for m, on in zip(_MODES, flags, strict=True) if on]
        if len(chosen) > 1 or (state not in (None, "")):
            refuse("--describe takes at most one of --offsets, --members and --state (no value)")
        mode = chosen[0] if chosen else "offsets"
    if reset_offsets or delete_offsets:
        action = "--reset-offsets" if reset_offsets else "--delete-offsets"
        if len(group_ids) != 1:
            refuse(f"{action} takes exactly one --group")
    if reset_offsets:
        if bool(topic_specs) == all_topics:
            refuse("Option --reset-offsets takes either --topic or --all-topics, not both.")
        if sum(scenarios) != 1:
            refuse(f"Option --reset-offsets takes exactly one of {', '.join(_SCENARIOS)}.")
        if dry_run == execute:
            refuse("Option --reset-offsets takes either --dry-run or --execute, not both.")
    if delete_offsets and not topic_specs:
        refuse("Option --delete-offsets needs --topic (repeatable).")
    try:
        for topic_spec in topic_specs if reset_offsets else ():
            _topic_partitions(topic_spec)
        spec = (
            _scenario(to_earliest, to_latest, to_datetime, by_duration, to_offset)
            if reset_offsets
            else None
        )
    except (_Refused, QueueflowError) as exc:
        refuse(str(exc))
        return
    bootstrap = bootstrap_server or bootstrap_from_env() or "localhost:9092"
    admin = make_admin(app_id, bootstrap, timeout_ms)
    as_json = output == "json"
    ok = True
    try:
        if redrive:
            text = asyncio.run(redrive_text(admin, group_ids[0], redrive_to, dry_run, as_json))
        elif spec is not None:
            text = asyncio.run(
                _reset(admin, group_ids[0], list(topic_specs), spec, execute, as_json)
            )
        elif delete_offsets:
            text = asyncio.run(_delete_offsets(admin, group_ids[0], list(topic_specs), as_json))
        elif delete:
            text, ok = asyncio.run(_delete(admin, list(group_ids) or None, as_json))
        else:
            text = asyncio.run(
                _run(
                    admin,
                    "list" if do_list else "describe",
                    list(group_ids) if group_ids else None,
                    mode,
                    state if do_list else None,
                    verbose,
                    as_json,
                )
            )
    except ShareGroupError as exc:
        # Kafka's wording for the refusals it has its own message for
        refuse(
            exc.message
            if exc.code is ErrorCode.NON_EMPTY_GROUP and exc.message.startswith("Share group")
            else str(exc)
        )
        return
    except (_Refused, QueueflowError, TimeoutError) as exc:
        refuse(str(exc))
        return
    if text:
        click.echo(text)
    if not ok:
        sys.exit(1)
