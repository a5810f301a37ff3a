"""``queueflow share-groups --release-key K / --skip-key K``: free a parked key of a key-ordered
share group (``share.ordering=key``; docs/concepts.md "Key-ordered sharing"), and the parked
keys shown by ``--describe``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from queueflow.admin import ShareGroupAdmin, SharePartitionOffsets

__all__ = ["check_key_action", "key_action", "parked_rows"]


def check_key_action(
    group_ids: Sequence[str], topics: Sequence[str], release_key: str | None, skip_key: str | None
) -> str | None:
    """Why a ``--release-key`` / ``--skip-key`` command line is refused, else ``None``."""
    if release_key is not None and skip_key is not None:
        return "--release-key and --skip-key: give one of them"
    option = "--release-key" if release_key is not None else "--skip-key"
    if len(group_ids) != 1:
        return f"{option} takes exactly one --group"
    if len(topics) != 1 or ":" in topics[0]:
        return f"{option} takes exactly one --topic T (and --partition P for one partition)"
    return None


async def key_action(
    admin: ShareGroupAdmin,
    group: str,
    topic: str,
    release_key: str | None,
    skip_key: str | None,
    partition: int | None,
    as_json: bool,
) -> str:
    """Release or skip the key; what to print."""
    if release_key is not None:
        done = await admin.release_key(group, topic, release_key, partition)
        key, verb = release_key, "Released"
    else:
        assert skip_key is not None
        done = await admin.skip_key(group, topic, skip_key, partition)
        key, verb = skip_key, "Skipped"
    if as_json:
        return json.dumps(
            [
                {"topic": tp.topic, "partition": tp.partition, "archived": n}
                for tp, n in done.items()
            ]
        )
    lines = []
    for tp, archived in sorted(done.items()):
        more = f", {archived} waiting records archived" if skip_key is not None else ""
        lines.append(
            f"{verb} key {key!r} of share group {group!r} on {tp.topic}[{tp.partition}]{more}."
        )
    return "\n".join(lines)


def parked_rows(group: str, offsets: Sequence[SharePartitionOffsets]) -> list[list[Any]]:
    """The ``--describe`` table of parked keys (empty when none is parked)."""
    rows: list[list[Any]] = [
        [group, o.topic, o.partition, p.key, p.key_hash, p.offset, p.reason]
        for o in offsets
        for p in o.parked_keys
    ]
    header = ["GROUP", "TOPIC", "PARTITION", "PARKED-KEY", "KEY-HASH", "PARKED-AT", "REASON"]
    return [header, *rows] if rows else []


def run_key_action(admin: ShareGroupAdmin, *args: Any) -> str:
    """:func:`key_action` run to completion."""
    return asyncio.run(key_action(admin, *args))
