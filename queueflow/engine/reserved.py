"""Owners of Acquired records reserved for the share-partition leader itself.

A record the leader holds on its own account is stored Acquired by a reserved owner, with a
deadline, in the same durable lock section as a member's lock (protocol/state_codec.py v3),
so a new leader keeps it across failover. Member ids starting with :data:`RESERVED_PREFIX`
are refused at join, so no member can hold or acknowledge such a record.

* :data:`DELAYED_OWNER`: a record RELEASEd with a delay (``queueflow.release(delay=...)``,
  or the group's ``share.redelivery.backoff.*`` policy) is held by it until its deadline, the
  time it becomes Available; its expiry makes it Available without counting a delivery
  (docs/concepts.md "Delayed redelivery").
* :data:`DEAD_LETTER_OWNER`: a record being written to its group's dead-letter topic
  (``errors.deadletterqueue.topic.name``, KIP-1191; docs/guide.md "Dead-letter topics"). It is
  held until the DLQ write is acknowledged by the brokers, then Archived; its lock never
  elapses (:data:`DEAD_LETTER_DEADLINE_MS`).

Reserved owners are never counted as a member's holdings (allowance, in-flight limits, fences,
release by member, abuse checks); admin views show their records by what they mean
(:func:`describe_owner`).
"""

from __future__ import annotations

import datetime
from typing import Final

__all__ = [
    "DEAD_LETTER_DEADLINE_MS",
    "DEAD_LETTER_OWNER",
    "DELAYED_OWNER",
    "RESERVED_PREFIX",
    "describe_owner",
    "is_reserved",
]

#: Member ids starting with this are the leader's own (refused at join).
RESERVED_PREFIX: Final = "__"
#: Holds a delayed record until it becomes Available (its lock deadline).
DELAYED_OWNER: Final = "__delayed__"
#: The owner of records held while they are written to the dead-letter topic.
DEAD_LETTER_OWNER: Final = "__dead_letter__"
#: The lock deadline (ms) of records held by :data:`DEAD_LETTER_OWNER`: far beyond any real
#: time, so the hold never elapses; the DLQ writer ends it (int64 as the state codec needs).
DEAD_LETTER_DEADLINE_MS: Final = 2**62


def is_reserved(member_id: str | None) -> bool:
    """True if ``member_id`` is an owner reserved for the leader (``__...``)."""
    return member_id is not None and member_id.startswith(RESERVED_PREFIX)


def describe_owner(member_id: str | None, deadline_ms: int | None) -> str | None:
    """How an admin view shows records Acquired by a reserved owner (``None``: a member's).

    >>> describe_owner("__delayed__", 1_700_000_000_000)
    'Available (delayed until 2023-11-14T22:13:20.000Z)'
    """
    if member_id == DELAYED_OWNER:
        return f"Available (delayed until {_iso(deadline_ms)})"
    if member_id == DEAD_LETTER_OWNER:
        return "Archiving (dead letter)"
    return None


def _iso(ms: int | None) -> str:
    if ms is None:
        return "?"
    when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
