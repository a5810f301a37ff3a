"""The records of dead-letter topics (KIP-1191 ``errors.deadletterqueue.*``; docs/guide.md
"Dead-letter topics"): the headers a dead-lettered record carries, and reading them back for a
redrive. Pure; the leaders' DLQ writer and the admin's redrive use it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from queueflow.protocol.messages import AckError

__all__ = [
    "HEADER_PREFIX",
    "DeadLetterRecord",
    "SourceRecord",
    "dead_letter_record",
    "source_of",
]


#: The prefix of the dead-letter headers (the same names a share agent's ``dead_letter=`` writes).
HEADER_PREFIX: Final = "queueflow.dead_letter."


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """A source record read back by offset: raw key, value and headers (``None``: absent)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """A record to produce to a dead-letter topic."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def dead_letter_record(
    source: SourceRecord | None,
    *,
    group: str,
    topic: str,
    partition: int,
    offset: int,
    delivery_count: int,
    reason: str,
    error: AckError | None,
    copy_record: bool,
) -> DeadLetterRecord:
    """The DLQ record of the source record at ``offset``: its headers, then
    ``queueflow.dead_letter.{group,topic,partition,offset,delivery_count,reason}`` and, for a
    handler that raised, ``.exception.type`` / ``.exception.message`` (UTF-8 text); its key and
    value only with ``copy_record`` (``errors.deadletterqueue.copy.record.enable``, KIP-1191);
    without them the DLQ record has no key and an empty value (a Kafka producer needs one of
    them). ``source`` ``None``: the record is no longer in the log (retention), headers only."""
    fields = [
        ("group", group),
        ("topic", topic),
        ("partition", str(partition)),
        ("offset", str(offset)),
        ("delivery_count", str(delivery_count)),
        ("reason", reason),
    ]
    if error is not None and error.type:
        fields.append(("exception.type", error.type))
        fields.append(("exception.message", error.message))
    ours = tuple((HEADER_PREFIX + name, text.encode()) for name, text in fields)
    if source is None:
        return DeadLetterRecord(None, b"", ours)
    theirs = tuple(h for h in source.headers if not h[0].startswith(HEADER_PREFIX))
    if not copy_record or (source.key is None and source.value is None):
        return DeadLetterRecord(None, b"", theirs + ours)
    return DeadLetterRecord(source.key, source.value, theirs + ours)


def source_of(headers: Iterable[tuple[str, bytes]]) -> tuple[str, int, int] | None:
    """``(topic, partition, offset)`` named by a DLQ record's ``queueflow.dead_letter.*``
    headers, or ``None`` when they are missing or malformed (redrive)."""
    found: dict[str, str] = {}
    for name, value in headers:
        if name.startswith(HEADER_PREFIX) and value is not None:
            found[name[len(HEADER_PREFIX) :]] = bytes(value).decode("utf-8", "replace")
    try:
        return found["topic"], int(found["partition"]), int(found["offset"])
    except (KeyError, ValueError):
        return None
