"""What a leader remembers about records on their way to the dead-letter topic (pure).

The dead-letter headers (docs/guide.md "Dead-letter topics") name why a record was archived
(``queueflow.dead_letter.reason``) and, for a handler that raised, the exception
(``.exception.type``, ``.exception.message``). Members send the error with their RELEASE or
REJECT (:class:`~queueflow.protocol.messages.AckError`); the leader keeps the last one per
offset, in memory only: after a leader change a record's reason is inferred from its delivery
count (at the limit: ``delivery_limit``, else ``rejected``) and the exception is not known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from queueflow.engine.partition import SharePartition
from queueflow.protocol import messages as protocol
from queueflow.structs import AcknowledgeType

__all__ = [
    "REASON_DELIVERY_LIMIT",
    "REASON_REJECTED",
    "REASON_UNDECODABLE",
    "DeadLetterNote",
    "DeadLetterNotes",
    "dead_letter_reason",
]

REASON_DELIVERY_LIMIT: Final = "delivery_limit"
REASON_REJECTED: Final = "rejected"
REASON_UNDECODABLE: Final = "undecodable"

#: Past this many notes of one share-partition, those below its SPSO are dropped; past twice
#: that, the oldest offsets go (a bound on memory; a lost note only loses header detail).
_PRUNE_AT: Final = 4096

_REJECT = AcknowledgeType.REJECT
_RELEASE = AcknowledgeType.RELEASE


@dataclass(frozen=True, slots=True)
class DeadLetterNote:
    """One offset's last REJECT or failed RELEASE: ``rejected`` and the member's error."""

    rejected: bool
    error: protocol.AckError | None


def dead_letter_reason(note: DeadLetterNote | None, delivery_count: int, limit: int) -> str:
    """The ``queueflow.dead_letter.reason`` of a record archived with ``delivery_count``
    deliveries under ``share.delivery.count.limit`` = ``limit``: ``undecodable``,
    ``rejected`` or ``delivery_limit``."""
    if note is not None and note.error is not None and note.error.reason == REASON_UNDECODABLE:
        return REASON_UNDECODABLE
    if note is not None:
        return REASON_REJECTED if note.rejected else REASON_DELIVERY_LIMIT
    return REASON_DELIVERY_LIMIT if delivery_count >= limit else REASON_REJECTED


class DeadLetterNotes:
    """The last REJECT / failed RELEASE of each in-flight offset, per ``(group, partition)``
    of one leader (only for groups with a dead-letter topic)."""

    def __init__(self) -> None:
        self._notes: dict[tuple[str, int], dict[int, DeadLetterNote]] = {}

    def remember(
        self,
        group: str,
        partition: int,
        request: protocol.ShareFetchRequest,
        engine: SharePartition,
    ) -> None:
        """Note the REJECTs and RELEASEs (with their errors) of ``request``'s applied
        acknowledgements; ACCEPTed offsets are forgotten."""
        errors = request.ack_errors
        key = (group, partition)
        rejects = any(_REJECT in types for _first, _last, types in request.acks)
        if not errors and not rejects and key not in self._notes:
            return  # nothing to note, nothing to forget
        notes = self._notes.setdefault(key, {})
        for first, last, types in request.acks:
            for k, offset in enumerate(range(first, last + 1)):
                t = types[k] if len(types) > 1 else types[0]
                if t == _REJECT or (t == _RELEASE and errors):
                    error = _error_at(errors, offset)
                    if t == _REJECT or error is not None:
                        notes[offset] = DeadLetterNote(t == _REJECT, error)
                    elif offset in notes:
                        notes[offset] = DeadLetterNote(False, notes[offset].error)
                elif t != _RELEASE:
                    notes.pop(offset, None)
        if len(notes) > _PRUNE_AT:
            self._prune(notes, engine.start_offset)
        if not notes:
            del self._notes[key]

    def note(self, group: str, partition: int, offset: int) -> DeadLetterNote | None:
        """The last note of ``offset``, or ``None``."""
        notes = self._notes.get((group, partition))
        return None if notes is None else notes.get(offset)

    def forget(self, group: str, partition: int, first: int, last: int) -> None:
        """Drop the notes of ``first..last`` (written to the DLQ)."""
        notes = self._notes.get((group, partition))
        if notes is None:
            return
        if last - first < len(notes):
            for offset in range(first, last + 1):
                notes.pop(offset, None)
        else:
            for offset in [o for o in notes if first <= o <= last]:
                del notes[offset]
        if not notes:
            del self._notes[(group, partition)]

    def __len__(self) -> int:
        return sum(len(n) for n in self._notes.values())

    @staticmethod
    def _prune(notes: dict[int, DeadLetterNote], start_offset: int) -> None:
        for offset in [o for o in notes if o < start_offset]:
            del notes[offset]
        if len(notes) > 2 * _PRUNE_AT:
            for offset in sorted(notes)[: len(notes) - _PRUNE_AT]:
                del notes[offset]


def _error_at(
    errors: list[tuple[int, int, protocol.AckError]], offset: int
) -> protocol.AckError | None:
    for first, last, error in errors:
        if first <= offset <= last:
            return error
    return None
