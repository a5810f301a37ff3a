"""``queueflow share-groups --browse``: a share-partition's records with their share states,
acquiring nothing (docs/guide.md "Browsing"; :mod:`queueflow.member.browse`).

One row per record: partition, offset, state, delivery count, lock owner and deadline (an
Acquired record), key and a preview of the value (the first :data:`VALUE_PREVIEW` characters,
UTF-8 with non-printable characters escaped). ``--output json`` gives every field, key and value
in full (decoded as UTF-8 with backslash escapes).
"""

from __future__ import annotations

import json
from typing import Any

from queueflow.kafka.config import KafkaClientConfig
from queueflow.member.browse import BrowsedRecord, BrowseSource, browse, utc_text
from queueflow.member.browse_source import KafkaBrowseSource

__all__ = ["VALUE_PREVIEW", "browse_output", "make_browse_source"]

#: Characters of a value (and a key) the table shows.
VALUE_PREVIEW = 60
KEY_PREVIEW = 24
_HEADER = [
    "PARTITION",
    "OFFSET",
    "STATE",
    "DELIVERY-COUNT",
    "LOCK-OWNER",
    "LOCK-DEADLINE",
    "KEY",
    "VALUE",
]


def make_browse_source(bootstrap: str, timeout_ms: int) -> BrowseSource:
    """What the command browses (tests replace it)."""
    return KafkaBrowseSource(KafkaClientConfig(bootstrap, "queueflow-cli"), timeout_ms)


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "backslashreplace")


def _preview(data: bytes | None, width: int) -> str:
    """``data`` as one line of at most ``width`` characters (``-`` for none)."""
    if data is None:
        return "-"
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in _text(data))
    return text if len(text) <= width else text[: width - 1] + "…"


def _row(r: BrowsedRecord) -> list[Any]:
    held = r.state == "ACQUIRED" and not (r.member_id or "").startswith("__")
    return [
        r.partition,
        r.offset,
        r.shown_state,
        r.delivery_count,
        r.member_id if held else None,
        utc_text(r.lock_deadline_ms) if held else None,
        _preview(r.key, KEY_PREVIEW),
        _preview(r.value, VALUE_PREVIEW),
    ]


def _json(r: BrowsedRecord) -> dict[str, Any]:
    return {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "state": r.state,
        "shown_state": r.shown_state,
        "delivery_count": r.delivery_count,
        "member_id": r.member_id,
        "lock_deadline_ms": r.lock_deadline_ms,
        "timestamp": r.timestamp,
        "key": None if r.key is None else _text(r.key),
        "value": None if r.value is None else _text(r.value),
        "headers": [[name, _text(value)] for name, value in r.headers],
    }


async def browse_output(
    source: BrowseSource,
    app_id: str,
    group: str,
    topic: str,
    partition: int | None,
    from_offset: int | None,
    max_records: int,
    as_json: bool,
) -> tuple[list[list[Any]] | None, str]:
    """Browse and render: ``(table rows with the header, "")`` for text, ``(None, json)``
    for ``--output json``; a browse that finds no record gives a sentence instead of rows.

    Raises:
        ShareGroupError / ConfigurationError / TimeoutError: as
            :func:`~queueflow.member.browse.browse`.
    """
    records = await browse(
        source,
        app_id,
        group,
        topic,
        partition,
        from_offset=from_offset,
        max_records=max_records,
    )
    if as_json:
        return None, json.dumps([_json(r) for r in records])
    if not records:
        where = topic if partition is None else f"{topic}[{partition}]"
        start = "" if from_offset is None else f" from offset {from_offset}"
        return None, f"Share group '{group}' has no records of {where}{start} to browse."
    return [_HEADER, *[_row(r) for r in records]], ""
