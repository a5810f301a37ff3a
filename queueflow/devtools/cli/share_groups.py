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

Where Kafka 4.3.1's tool has its own words, they are printed (docs/operations.md, "Inspecting
share groups"): a group with members refused by ``--delete`` (``GroupNotEmptyException: Share
group 'G' is not EMPTY.``), ``--reset-offsets`` (``Share group 'G' is not empty.``, on stderr
without ``Error:``) and ``--delete-offsets`` (``Error: The group is not empty.`` and the
``TOPIC STATUS`` table, as is a topic the group doesn't have); a group with no share-partitions
(``Share group 'G' has no offset information.``); an empty group's ``--state`` and ``--members``
(``Share group 'G' has no active members.`` on stderr). Unlike Kafka's tool, which exits 0 after
some of these, queueflow exits 1 whenever something was refused.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import time
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
from queueflow.devtools.cli import browse as browsing
from queueflow.devtools.cli import cli
from queueflow.devtools.cli.parked_keys import check_key_action, parked_rows, run_key_action
from queueflow.devtools.cli.redrive import redrive_text
from queueflow.engine.group import describe_holders
from queueflow.errors import ErrorCode, QueueflowError, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.structs import TopicPartition

__all__ = ["share_groups"]

_MODES = ("offsets", "members", "state")
_ACTIONS = (
    "--list",
    "--describe",
    "--delete",
    "--reset-offsets",
    "--delete-offsets",
    "--browse",
    "--redrive",
)
_SCENARIOS = ("--to-earliest", "--to-latest", "--to-datetime", "--by-duration", "--to-offset")


class _Refused(Exception):
    """A flag combination or an argument the tool refuses (exit 1, message on stderr)."""


#: Kafka's exception class and message for a group with members, in ``--delete``'s answer.
_NOT_EMPTY = "org.apache.kafka.common.errors.GroupNotEmptyException: Share group '{}' is not EMPTY."
#: Kafka's ``--delete-offsets`` status of a group with members, and of a topic it lacks.
_OFFSETS_NOT_EMPTY = "Error: The group is not empty."
_NO_SUCH_TOPIC = "Error: This server does not host this topic-partition."


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


def _heartbeat(at_ms: int | None) -> list[str]:
    """The ``LAST-HEARTBEAT`` and ``AGO`` cells: ``2026-11-27T08:20:01Z``, ``3s`` (``-`` when
    unknown); one word each, so that the columns split on spaces."""
    if not at_ms:
        return ["-", "-"]
    when = dt.datetime.fromtimestamp(at_ms / 1000, dt.timezone.utc)
    ago = max(time.time() * 1000 - at_ms, 0) / 1000
    return [f"{when:%Y-%m-%dT%H:%M:%S}Z", f"{ago:.0f}s"]


def _timeout(description: ShareGroupDescription) -> str:
    ms = description.session_timeout_ms
    return f"share.session.timeout.ms ({ms} ms)" if ms else "share.session.timeout.ms"


def holders(description: ShareGroupDescription) -> str:
    """Who holds the group non-empty and since when (last heartbeat), for messages."""
    members = [(m.member_id, m.client_id, m.last_heartbeat_ms) for m in description.members]
    return describe_holders(members, int(time.time() * 1000))


def _lapsed_note(description: ShareGroupDescription) -> str:
    """The members left out because their session lapsed with no coordinator running."""
    lapsed = description.lapsed_members
    if not lapsed:
        return ""
    members = [(m.member_id, m.client_id, m.last_heartbeat_ms) for m in lapsed]
    return (
        f"\nNot counted: {len(lapsed)} member(s) whose session lapsed while no worker of the "
        f"app runs its coordinator (their leave was lost): "
        f"{describe_holders(members, int(time.time() * 1000))}; the next coordinator expires "
        "them."
    )


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
    notes: list[str] | None = None,
) -> str:
    """``--list`` or ``--describe``: the text for stdout; Kafka's stderr lines (a group
    without members) are added to ``notes``, to be printed after it."""
    notes = [] if notes is None else notes
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
            if offsets:
                texts.append(_table(_offset_rows(d.group_id, offsets, verbose)))
                parked = parked_rows(d.group_id, offsets)  # key-ordered groups' parked keys
                if parked:
                    texts.append(_table(parked))
            else:  # Kafka's words for a group with no share-partitions
                texts.append(f"Share group '{d.group_id}' has no offset information.")
        elif mode == "members":
            out.append(describe_json(d))
            header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
            verbose_header = ["MEMBER-EPOCH", "ASSIGNORS", "RACK", "LAST-HEARTBEAT", "AGO"]
            rows: list[list[Any]] = [header + (verbose_header if verbose else [])]
            for i, m in enumerate(d.members):
                row: list[Any] = [d.group_id, m.member_id, m.host or "-", m.client_id or "-"]
                row += [len(m.assignment), _assignment(d, i)]
                more = [m.member_epoch, ",".join(m.assignors) or "-", m.rack_id or "-"]
                more += _heartbeat(m.last_heartbeat_ms)
                rows.append(row + (more if verbose else []))
            if not d.members:  # Kafka's line on stderr, then who was left out
                notes += [n + _lapsed_note(d) for n in _no_members(d.group_id, as_json)]
            else:
                texts.append(_table(rows) + _lapsed_note(d))
        else:
            out.append({k: v for k, v in describe_json(d).items() if k != "members"})
            # Kafka's columns (the epochs before #MEMBERS with --verbose), then our ASSIGNOR
            header = ["GROUP", "COORDINATOR (ID)", "STATE"]
            header += ["GROUP-EPOCH", "ASSIGNMENT-EPOCH"] if verbose else []
            header += ["#MEMBERS"] + (["ASSIGNOR"] if verbose else [])
            cells: list[Any] = [d.group_id, d.coordinator or "-", d.state]
            cells += [d.group_epoch, d.assignment_epoch] if verbose else []
            cells += [len(d.members)] + ([d.assignor] if verbose else [])
            held = f"\nHeld non-empty by: {holders(d)}" if d.members else ""
            texts.append(_table([header, cells]) + held + _lapsed_note(d))
            if not d.members:
                notes += _no_members(d.group_id, as_json)
    return json.dumps(out) if as_json else "\n\n".join(texts)


def _no_members(group: str, as_json: bool) -> list[str]:
    """Kafka's line for a group without members (its tool prints it on stderr)."""
    return [] if as_json else [f"\nShare group '{group}' has no active members."]


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
        raise ShareGroupError(
            ErrorCode.NON_EMPTY_GROUP,
            f"Share group '{group}' is not empty.\nIt has {len(description.members)} "
            f"member(s): {holders(description)}. Stop them, or wait: a member is expired "
            f"{_timeout(description)} after its last heartbeat.",
        )
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
) -> tuple[str, bool]:
    """``--delete-offsets``: Kafka's ``TOPIC STATUS`` table (a topic the group doesn't have
    gets Kafka's error status, the others are deleted; a group with members: Kafka's
    ``Error: The group is not empty.`` for each); False if a topic was refused."""
    names = sorted(set(topic_names))
    (description,) = await admin.describe_groups([group])
    status = dict.fromkeys(names, _OFFSETS_NOT_EMPTY)
    if not description.members:
        known = [t for t in names if t in description.partitions]
        status = {t: "Successful" if t in known else _NO_SUCH_TOPIC for t in names}
        try:
            if known:
                await admin.delete_share_group_offsets(group, known)
        except ShareGroupError as exc:
            if exc.code is not ErrorCode.NON_EMPTY_GROUP:  # a member joined in between
                raise
            status = dict.fromkeys(names, _OFFSETS_NOT_EMPTY)
    ok = all(v == "Successful" for v in status.values())
    if as_json:
        return json.dumps([{"topic": t, "status": status[t]} for t in names]), ok
    table = _table([["TOPIC", "STATUS"], *[[t, status[t]] for t in names]])
    if _OFFSETS_NOT_EMPTY in status.values():
        return f"{_OFFSETS_NOT_EMPTY}\n\n{table}", False
    return table, ok


async def _delete(
    admin: ShareGroupAdmin, groups: list[str] | None, as_json: bool
) -> tuple[str, bool]:
    """``--delete``: Kafka's messages; False if a group could not be deleted."""
    names = groups if groups is not None else [g.group_id for g in await admin.list_groups()]
    results = await admin.delete_share_groups(names)
    failed: dict[str, Any] = {g: e for g, e in results.items() if e is not None}
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
    lines = ["Error: Deletion of some share groups failed:"]
    lines += [
        f"* Group '{g}' could not be deleted due to: "
        + (_NOT_EMPTY.format(g) if e.code is ErrorCode.NON_EMPTY_GROUP else str(e))
        for g, e in failed.items()
    ]
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
    "--browse",
    is_flag=True,
    help="Show the records of --topic T of --group G with their share states, delivery counts "
    "and locks, acquiring nothing (--partition, --from-offset, --max-records).",
)
@click.option(
    "--from-offset",
    type=int,
    default=None,
    help="With --browse: the first offset [default: the share-partition start offset].",
)
@click.option(
    "--max-records",
    type=int,
    default=None,
    help="With --browse: the most records per partition [default: 100].",
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
    help="With --reset-offsets: topic or topic:0,1,2; with --delete-offsets: a topic "
    "(repeatable); with --browse: the topic.",
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
@click.option(
    "--release-key",
    metavar="KEY",
    default=None,
    help="Release a parked key of a key-ordered --group G on --topic T (its waiting records "
    "proceed); KEY is the key's text, <null>, or hash:<hex> as --describe shows it.",
)
@click.option(
    "--skip-key",
    metavar="KEY",
    default=None,
    help="Skip a parked key: archive its waiting records, then free it (as --release-key).",
)
@click.option(
    "--partition",
    type=click.IntRange(0),
    default=None,
    help="With --browse, --release-key or --skip-key: one partition [default: every "
    "partition of T].",
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
    browse: bool,
    partition: int | None,
    from_offset: int | None,
    max_records: int | None,
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
    release_key: str | None,
    skip_key: str | None,
    verbose: bool,
    timeout_ms: int,
    output: str,
) -> None:
    """List, describe, reset and delete the share groups of a queueflow app (like
    kafka-share-groups.sh)."""

    def refuse(message: str) -> None:
        click.echo(f"Error: {message}", err=True)
        sys.exit(1)

    actions = (do_list, describe, delete, reset_offsets, delete_offsets, browse, redrive)
    if release_key is not None or skip_key is not None:  # key-ordered groups: a parked key
        problem = check_key_action(group_ids, topic_specs, release_key, skip_key)
        if problem is not None or any(actions):
            refuse(problem or "--release-key/--skip-key is an action of its own")
        admin = make_admin(
            app_id, bootstrap_server or bootstrap_from_env() or "localhost:9092", timeout_ms
        )
        try:
            click.echo(
                run_key_action(
                    admin,
                    group_ids[0],
                    topic_specs[0],
                    release_key,
                    skip_key,
                    partition,
                    output == "json",
                )
            )
        except (QueueflowError, TimeoutError) as exc:
            refuse(str(exc))
        return
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
    if topic_specs and not (reset_offsets or delete_offsets or browse):
        refuse("--topic may be used with --reset-offsets, --delete-offsets or --browse only")
    browse_only = [
        name
        for name, value in (
            ("--partition", partition),
            ("--from-offset", from_offset),
            ("--max-records", max_records),
        )
        if value is not None
    ]
    if browse_only and not browse:
        where = "--browse, --release-key or --skip-key" if partition is not None else "--browse"
        refuse(f"{browse_only[0]} may be used with {where} only")
    if browse and (len(group_ids) != 1 or len(topic_specs) != 1):
        refuse("--browse takes exactly one --group and one --topic")
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
    as_json = output == "json"
    if browse:
        _browse(
            app_id,
            bootstrap,
            timeout_ms,
            group_ids[0],
            topic_specs[0],
            partition,
            from_offset,
            max_records,
            as_json,
        )
        return
    admin = make_admin(app_id, bootstrap, timeout_ms)
    ok = True
    notes: list[str] = []  # Kafka's stderr lines, after the output
    try:
        if redrive:
            text = asyncio.run(redrive_text(admin, group_ids[0], redrive_to, dry_run, as_json))
        elif spec is not None:
            text = asyncio.run(
                _reset(admin, group_ids[0], list(topic_specs), spec, execute, as_json)
            )
        elif delete_offsets:
            text, ok = asyncio.run(_delete_offsets(admin, group_ids[0], list(topic_specs), as_json))
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
                    notes,
                )
            )
    except ShareGroupError as exc:
        if exc.code is ErrorCode.NON_EMPTY_GROUP and exc.message.startswith("Share group"):
            # Kafka's words, as its tool prints them (stderr, no "Error:")
            click.echo(exc.message, err=True)
            sys.exit(1)
        refuse(str(exc))
        return
    except (_Refused, QueueflowError, TimeoutError) as exc:
        refuse(str(exc))
        return
    if text:
        click.echo(text)
    for note in notes:
        click.echo(note, err=True)
    if not ok:
        sys.exit(1)


def _browse(
    app_id: str,
    bootstrap: str,
    timeout_ms: int,
    group: str,
    topic: str,
    partition: int | None,
    from_offset: int | None,
    max_records: int | None,
    as_json: bool,
) -> None:
    """``--browse``: print the records (:mod:`queueflow.devtools.cli.browse`); exit 1 with the
    error on stderr for an unknown group, topic or partition, or a bad argument."""
    source = browsing.make_browse_source(bootstrap, timeout_ms)
    try:
        rows, text = asyncio.run(
            browsing.browse_output(
                source,
                app_id,
                group,
                topic,
                partition,
                from_offset,
                100 if max_records is None else max_records,
                as_json,
            )
        )
    except (QueueflowError, TimeoutError) as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    click.echo(_table(rows) if rows is not None else text)
