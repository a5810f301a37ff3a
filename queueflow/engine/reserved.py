"""Owner ids reserved for the share-partition leader itself.

A record a leader holds on its own behalf is Acquired by a reserved owner: its state is durable
through the lock section of the share-partition state (owner and deadline), so a new leader
takes it over like any other lock. Member ids starting with ``__`` are reserved for the leader;
reserved owners are not members: nothing counts their holdings as a member's.

* :data:`DEAD_LETTER_OWNER`: a record being written to its group's dead-letter topic
  (``errors.deadletterqueue.topic.name``, KIP-1191; docs/guide.md "Dead-letter topics"). It is
  held until the DLQ write is acknowledged by the brokers, then Archived; its lock never
  elapses (:data:`DEAD_LETTER_DEADLINE_MS`).
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEAD_LETTER_DEADLINE_MS", "DEAD_LETTER_OWNER", "RESERVED_PREFIX", "is_reserved"]

#: Member ids starting with this are reserved for the leader.
RESERVED_PREFIX: Final = "__"
#: The owner of records held while they are written to the dead-letter topic.
DEAD_LETTER_OWNER: Final = "__dead_letter__"
#: The lock deadline (ms) of records held by :data:`DEAD_LETTER_OWNER`: far beyond any real
#: time, so the hold never elapses; the DLQ writer ends it (int64 as the state codec needs).
DEAD_LETTER_DEADLINE_MS: Final = 2**62


def is_reserved(member_id: str | None) -> bool:
    """True if ``member_id`` is an owner reserved for the leader (starts with ``__``)."""
    return bool(member_id) and str(member_id).startswith(RESERVED_PREFIX)
