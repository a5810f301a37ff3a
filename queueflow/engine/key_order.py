"""Key-ordered sharing: which records of a share-partition may be acquired, by key
(docs/concepts.md "Key-ordered sharing"; group config ``share.ordering=key``).

KIP-932 share groups give no ordering: any Available record goes to any member. With
``share.ordering=key`` a share-partition follows the message-group rule of SQS FIFO queues
(each key is a message group):

* at most one record per key is Acquired at a time, so two members never handle the same key
  at once;
* a record is acquirable only when every earlier in-flight record of its key is Acknowledged
  or Archived, so the records of one key are handled in offset order (a RELEASEd record or
  one whose lock elapsed is its key's next record again);
* different keys are independent and spread over all members.

The leader learns keys from the log (it tails the source partition from the SPSO, see
docs/architecture.md "Key-ordered sharing"): a record is acquired only once its key is indexed
here. Keys are kept as stable 64-bit hashes (:func:`key_hash`): two keys with one hash are
simply treated as one key (more serialisation, never broken order). All records with a null
key form one key of their own (:data:`NULL_KEY_HASH`). An offset the index saw no record at
(compaction, transaction markers) belongs to no key: the engine archives it as a GAP would,
without counting it as an acquired record.

**Parking.** A record of a key that is Archived by a REJECT or by the delivery count limit
(a dead-lettered record is such a record) *parks* its key: the key's later records wait,
Available but not acquirable, until an operator releases the key (they proceed) or skips it
(:meth:`KeyOrder.skip`: its waiting records are Archived, then the key is free). A GAP never
parks. Parked keys are durable (their own state-table entry, written with the share-partition's
changes).

Pure and standard-library only: the share-partition engine
(:meth:`~queueflow.engine.partition.SharePartition.acquire`) asks :meth:`KeyOrder.select`
which offsets it may acquire; the leader feeds the index (:meth:`KeyOrder.index`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from queueflow.engine.state import RecordState

__all__ = [
    "NULL_KEY_HASH",
    "KeyOrder",
    "ParkedKey",
    "consecutive",
    "key_hash",
    "key_preview",
    "parse_key_hash",
]

_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED

#: The key (hash) of every record with a null key: they are handled one at a time, in offset
#: order, as one key (a documented choice; see docs/concepts.md "Key-ordered sharing").
NULL_KEY_HASH = int.from_bytes(
    hashlib.blake2b(b"", digest_size=8, person=b"qf-null-key").digest(), "big"
)
#: At most this many key previews are remembered for parked keys' descriptions.
_MAX_PREVIEWS = 65_536
#: At most this many characters of a key are shown.
_PREVIEW_CHARS = 100


def key_hash(key: bytes | None) -> int:
    """The stable 64-bit hash (unsigned) of a record key: BLAKE2b with 8-byte digests, the same
    on every host and Python version; :data:`NULL_KEY_HASH` for a null key."""
    if key is None:
        return NULL_KEY_HASH
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def key_preview(key: bytes | None) -> str:
    """How a key is shown: its UTF-8 text (invalid bytes escaped), cut at 100 characters;
    ``<null>`` for a null key."""
    if key is None:
        return "<null>"
    text = key.decode("utf-8", errors="backslashreplace")
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 1] + "…"


def parse_key_hash(text: str) -> int:
    """The key hash an operator names: ``hash:<16 hex digits>`` (as describe shows it, for keys
    that are not text), ``<null>`` for the null key, else the key's UTF-8 text.

    Raises:
        ValueError: a ``hash:`` form that is not 1..16 hex digits.
    """
    if text == "<null>":
        return NULL_KEY_HASH
    if text.startswith("hash:"):
        digits = text[5:]
        if not 1 <= len(digits) <= 16 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise ValueError(
                f"key {text!r}: after 'hash:' give the key's 64-bit hash as 1..16 hex digits, "
                "as the parked keys are described"
            )
        return int(digits, 16)
    return key_hash(text.encode())


def show_hash(value: int) -> str:
    """``hash:<16 hex digits>``: how a key hash is named (see :func:`parse_key_hash`)."""
    return f"hash:{value:016x}"


@dataclass(frozen=True, slots=True)
class ParkedKey:
    """A parked key of one share-partition.

    Attributes:
        key_hash: the key's 64-bit hash (:func:`key_hash`).
        offset: the record whose archiving parked it.
        reason: ``rejected`` (REJECTed) or ``delivery_limit`` (Archived at
            ``share.delivery.count.limit``, or dead-lettered).
        key: the key as shown (:func:`key_preview`), ``""`` when unknown.
    """

    key_hash: int
    offset: int
    reason: str
    key: str = ""


def consecutive(offsets: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Maximal ``(first, last)`` ranges of sorted, distinct ``offsets``."""
    first = last = -2
    for o in offsets:
        if o == last + 1:
            last = o
            continue
        if last >= 0 or first >= 0:
            yield first, last
        first = last = o
    if first >= 0:
        yield first, last


class KeyOrder:
    """The key index and parked keys of one key-ordered share-partition.

    Args:
        start: the first offset to index (the SPSO when key ordering began).
        parked: durable parked keys to start with.

    The index maps each offset from the SPSO up to :attr:`indexed_end` (exclusive) to its
    record's key hash; offsets in that range it has no entry for hold no record.
    """

    __slots__ = ("_end", "_floor", "_keys", "_parked", "_parked_dirty", "_previews", "_start")

    def __init__(self, start: int, parked: Iterable[ParkedKey] = ()) -> None:
        if start < 0:
            raise ValueError(f"start offset must be >= 0, got {start}")
        self._start = start  # entries below it are forgotten
        self._floor = start  # the lowest offset that may still have an entry
        self._end = start
        self._keys: dict[int, int] = {}
        self._previews: dict[int, str] = {}
        self._parked: dict[int, ParkedKey] = {p.key_hash: p for p in parked}
        self._parked_dirty = False

    # -- the index -------------------------------------------------------------------------
    @property
    def indexed_end(self) -> int:
        """The first offset whose key is not indexed yet (exclusive end of the index)."""
        return self._end

    @property
    def indexed_start(self) -> int:
        """The first offset the index holds (offsets below it were forgotten)."""
        return self._start

    def index(self, records: Iterable[tuple[int, bytes | None]], end: int) -> None:
        """Index ``records`` (``(offset, key)``, ascending, each at or after
        :attr:`indexed_end`) and move :attr:`indexed_end` to ``end``: offsets below ``end``
        without a record hold none (compaction, transaction markers).

        Raises:
            ValueError: a record before :attr:`indexed_end` or at or after ``end``, or ``end``
                below :attr:`indexed_end`; nothing is indexed.
        """
        items = list(records)
        if end < self._end or any(not self._end <= o < end for o, _ in items):
            raise ValueError(
                f"records {items[0][0] if items else '-'}.. with end {end} do not continue the "
                f"key index at {self._end}"
            )
        keys, previews = self._keys, self._previews
        if len(previews) > _MAX_PREVIEWS:
            previews.clear()
        for offset, key in items:
            h = key_hash(key)
            keys[offset] = h
            if h not in previews:
                previews[h] = key_preview(key)
        self._end = end

    def restart(self, start: int) -> None:
        """Forget the index and index again from ``start`` (the SPSO was reset)."""
        self._keys.clear()
        self._start = self._floor = self._end = start

    def forget_below(self, offset: int) -> None:
        """Drop the entries below ``offset`` (the SPSO moved past them)."""
        if offset <= self._start:
            return
        keys = self._keys
        for o in range(self._floor, min(offset, self._end)):
            keys.pop(o, None)
        self._start = offset
        self._floor = max(self._floor, min(offset, self._end))
        if self._end < offset:
            self._end = self._floor = offset

    def key_of(self, offset: int) -> int | None:
        """The key hash of the record at ``offset``; ``None`` if it holds no record or is not
        indexed."""
        return self._keys.get(offset)

    def preview(self, key: int) -> str:
        """How the key with hash ``key`` is shown (``hash:...`` when its text is unknown)."""
        return self._previews.get(key) or show_hash(key)

    # -- the rule --------------------------------------------------------------------------
    def select(
        self,
        runs: Iterable[tuple[int, int, RecordState]],
        speo: int,
        new_end: int,
        max_records: int,
    ) -> list[int]:
        """The offsets to acquire next, ascending, at most ``max_records``.

        Args:
            runs: the in-flight records from the SPSO as ``(first, last, state)``, ascending,
                covering SPSO..``speo``-1.
            speo: the SPEO; records from there to ``new_end`` are Available, never delivered.
            new_end: exclusive end of the new records that may enter the in-flight window
                (the log end, bounded by the in-flight limit).
            max_records: the most offsets to return (>= 0).

        A record is returned when it is Available, indexed, and its key is neither parked nor
        held by an earlier in-flight record (Available or Acquired). Holes (indexed offsets
        without a record) are returned whenever they are Available, without counting towards
        ``max_records``: the engine archives them (docs/concepts.md "Acquisition counts
        records"). Nothing at or after :attr:`indexed_end` is returned.
        """
        out: list[int] = []
        if max_records <= 0:
            return out
        blocked = set(self._parked)
        keys, end = self._keys, self._end
        taken = 0

        def visit(first: int, last: int, available: bool) -> bool:
            nonlocal taken
            for o in range(first, min(last, end - 1) + 1):
                k = keys.get(o)
                if k is None:
                    if available:
                        out.append(o)
                elif k not in blocked:
                    blocked.add(k)
                    if available:
                        out.append(o)
                        taken += 1
                        if taken >= max_records:
                            return False
            return last < end - 1

        for first, last, state in runs:
            if (state is _AVAILABLE or state is _ACQUIRED) and not visit(
                first, last, state is _AVAILABLE
            ):
                return out
        if new_end > speo:
            visit(speo, new_end - 1, True)
        return out

    # -- parking ---------------------------------------------------------------------------
    @property
    def parked(self) -> Mapping[str, ParkedKey]:
        """The parked keys, by their shown name (:meth:`preview`); a copy."""
        return {self.preview(p.key_hash): p for p in self._parked.values()}

    def parked_keys(self) -> list[ParkedKey]:
        """The parked keys, ordered by the offset that parked them."""
        return sorted(self._parked.values(), key=lambda p: p.offset)

    def is_parked(self, key: int) -> bool:
        """True if the key with hash ``key`` is parked."""
        return key in self._parked

    def on_archived(self, first: int, last: int, reason: str) -> None:
        """Records ``first..last`` were Archived from Acquired for ``reason`` (``rejected``,
        ``delivery_limit``; ``""``: a GAP, which parks nothing): park their keys."""
        if not reason:
            return
        for o in range(first, last + 1):
            k = self._keys.get(o)
            if k is not None and k not in self._parked:
                self._parked[k] = ParkedKey(k, o, reason, self.preview(k))
                self._parked_dirty = True

    def on_revived(self, first: int, last: int) -> None:
        """Records ``first..last`` came back from Archived (a fenced member's RELEASEs rolled
        back): a key they parked is free again."""
        for o in range(first, last + 1):
            k = self._keys.get(o)
            parked = self._parked.get(k) if k is not None else None
            if parked is not None and parked.offset == o:
                del self._parked[parked.key_hash]
                self._parked_dirty = True

    def release(self, key: int) -> ParkedKey | None:
        """Free a parked key: its waiting records proceed. Returns what was parked, or
        ``None`` if the key was not parked (nothing changes)."""
        parked = self._parked.pop(key, None)
        if parked is not None:
            self._parked_dirty = True
        return parked

    def waiting(
        self, key: int, runs: Iterable[tuple[int, int, RecordState]], speo: int, limit: int
    ) -> list[int]:
        """The waiting records of the key with hash ``key``: Available in-flight ones among
        ``runs`` (``(first, last, state)``), and the indexed ones from ``speo`` up to ``limit``
        (exclusive; the in-flight limit): what skipping it archives."""
        keys = self._keys
        out = [
            o
            for first, last, state in runs
            if state is _AVAILABLE
            for o in range(first, last + 1)
            if keys.get(o) == key
        ]
        out += [o for o in range(speo, min(limit, self._end)) if keys.get(o) == key]
        return out

    def clear_parked(self) -> None:
        """Forget every parked key (the SPSO was reset: every in-flight record is discarded)."""
        if self._parked:
            self._parked.clear()
            self._parked_dirty = True

    def take_parked_changes(self) -> list[ParkedKey] | None:
        """The parked keys (as :meth:`parked_keys`) if they changed since the last call, else
        ``None``: what to write durably."""
        if not self._parked_dirty:
            return None
        self._parked_dirty = False
        return self.parked_keys()
