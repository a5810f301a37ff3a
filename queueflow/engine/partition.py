"""The share-partition engine: KIP-932 record states for one share-partition.

A :class:`SharePartition` manages the in-flight records of one topic-partition in one share group
(KIP-932 "In-flight records"): the records from the share-partition start offset (SPSO) up to, but
not including, the share-partition end offset (SPEO). It hands Available records to consumers
under a time-limited acquisition lock, applies their acknowledgements, releases expired locks,
moves the SPSO forwards and produces the durable form of its state.

Every KIP-932 rule for one share-partition lives in this module. It is pure and synchronous: no
I/O, no Kafka, no clocks. Time is always passed in as ``now_ms`` (milliseconds); the caller
decides when to call :meth:`SharePartition.expire_locks` (see
:meth:`SharePartition.next_lock_deadline`).

Member abuse limits (docs/operations.md, "Member abuse limits") are enforced here too: the
RENEW cap (``share.record.lock.max.renewal.ms``), per-member in-flight and acquisition-rate
limits, and the fence of a member that RELEASEs without handling, with the rollback of the
delivery counts it caused.

Memory: records are kept as *runs* of consecutive offsets with equal (state, delivery count,
owner, lock deadline), in a sorted list searched with :mod:`bisect`. A batch fetched and
acknowledged together costs one run however many records it holds (KIP-932 "Batching").
"""

from __future__ import annotations

import heapq
import sys
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from queueflow.engine.key_order import KeyOrder, consecutive
from queueflow.engine.redelivery import (
    ATTEMPTS,
    DELIVERY_COUNT_MODES,
    ArchivedRange,
    backoff_ms,
    merge_archived,
    throttle_cap,
)
from queueflow.engine.reserved import (
    DEAD_LETTER_DEADLINE_MS,
    DEAD_LETTER_OWNER,
    DELAYED_OWNER,
    is_reserved,
)
from queueflow.engine.state import (
    PERSISTED_STATES,
    RecordState,
    ShareUpdate,
    StateBatch,
    merge_batches,
)
from queueflow.errors import (
    ConfigurationError,
    CorruptStateError,
    ErrorCode,
    InvalidRecordStateError,
    InvalidRequestError,
    ShareGroupError,
)
from queueflow.settings import bool_default, int_default, lookup
from queueflow.structs import AcknowledgeType

__all__ = [
    "AcknowledgeType",
    "AcknowledgementBatch",
    "AcquiredRecords",
    "ArchivedRange",
    "MemberFence",
    "RecordState",
    "RecordView",
    "RunView",
    "SharePartition",
    "SharePartitionConfig",
    "StateBatch",
]

_AVAILABLE = RecordState.AVAILABLE
_ACCEPT = AcknowledgeType.ACCEPT
_RELEASE = AcknowledgeType.RELEASE
_RENEW = AcknowledgeType.RENEW
_GAP = AcknowledgeType.GAP
_ACQUIRED = RecordState.ACQUIRED
_ACKNOWLEDGED = RecordState.ACKNOWLEDGED
_ARCHIVED = RecordState.ARCHIVED


@dataclass(frozen=True, slots=True)
class AcquiredRecords:
    """Records acquired for a consumer: ``first_offset..last_offset`` (inclusive).

    All records of the range have ``delivery_count`` (KIP-932 ShareFetch ``AcquiredRecords``).
    """

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class AcknowledgementBatch:
    """Acknowledgement of ``first_offset..last_offset`` (inclusive) by one consumer.

    ``acknowledge_types`` holds one type for the whole range, or exactly one per offset
    (``last_offset - first_offset + 1`` entries), as in KIP-932 ShareAcknowledge
    ``AcknowledgementBatches``.

    ``delay_ms`` (RELEASE only, ms, 0..``max_release_delay_ms``): the records are Available
    again only that long after the acknowledgement (docs/concepts.md "Delayed redelivery");
    0: the group's back-off policy (``share.redelivery.backoff.*``, off by default).
    ``undelivered`` (RELEASE only): the member never handed the records to a handler, so
    their delivery is given back (docs/concepts.md "Delivery counts").
    """

    first_offset: int
    last_offset: int
    acknowledge_types: tuple[AcknowledgeType, ...]
    delay_ms: int = 0
    undelivered: bool = False


@dataclass(frozen=True, slots=True)
class RecordView:
    """The state of one offset, as seen by :meth:`SharePartition.record`.

    Attributes:
        state: the record state.
        delivery_count: delivery attempts so far.
        member_id: the owning member if ``ACQUIRED``, else None.
        lock_deadline_ms: when the acquisition lock elapses (ms) if ``ACQUIRED``, else None.
    """

    state: RecordState
    delivery_count: int
    member_id: str | None
    lock_deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class RunView:
    """A maximal run of in-flight records ``first_offset..last_offset`` (inclusive) in one state.

    Attributes are as in :class:`RecordView`; see :meth:`SharePartition.in_flight`. Two adjacent
    Acquired runs may look alike: they differ in when they were acquired, which
    ``share.record.lock.max.renewal.ms`` needs (KIP-1222).
    """

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int
    member_id: str | None
    lock_deadline_ms: int | None


def _check_range(name: str, value: object, low: int | None = None, high: int | None = None) -> None:
    """Check ``value`` against the range of setting ``name`` (a KIP-932 / Kafka config name).

    The bounds come from :data:`queueflow.settings.SETTINGS` unless ``low`` / ``high`` narrow
    them (cross-setting checks).

    Raises:
        ConfigurationError: ``value`` is not an ``int`` (``bool`` excluded) or is out of range.
    """
    setting = lookup(name)
    lo = setting.minimum if low is None else low
    hi = setting.maximum if high is None else high
    shown = f"{'' if lo is None else lo}..{'' if hi is None else hi}"
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigurationError(
            f"{name} must be an integer in {shown}, got {value!r} ({type(value).__name__})"
        )
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigurationError(f"{name}={value} is out of range: allowed {shown} (inclusive)")


@dataclass(frozen=True, slots=True)
class SharePartitionConfig:
    """Limits of one share-partition (the ``group.share.*`` broker configs
    of KIP-932 "Broker configuration"; KIP-932 "In-flight records").

    Defaults and allowed ranges are those of :data:`queueflow.settings.SETTINGS` (the names below);
    the ranges quoted here are today's values there.

    Attributes:
        max_in_flight_records: ``group.share.partition.max.record.locks``; SPEO - SPSO never
            exceeds it. Allowed 100..10000, default 2000.
        delivery_count_limit: ``group.share.delivery.count.limit``; a record whose delivery fails
            this many times is archived. Allowed 2..10, default 5.
        record_lock_duration_ms: ``group.share.record.lock.duration.ms``; acquisition lock
            duration in ms. Allowed 1000..3600000 and within
            ``min_record_lock_duration_ms..max_record_lock_duration_ms``, default 30000.
        max_record_lock_duration_ms: ``group.share.max.record.lock.duration.ms``; upper bound (ms)
            for the lock duration and for a lock duration a consumer asks for. Allowed
            30000..3600000, default 60000.
        min_record_lock_duration_ms: ``group.share.min.record.lock.duration.ms``; lower bound (ms)
            for the lock duration and for a lock duration a consumer asks for. Allowed
            1000..30000, default 1000 (Kafka's is 15000).
        renew_enabled: ``share.renew.acknowledge.enable``; when False a RENEW (KIP-1222) is
            refused. Default True.
        max_renewal_ms: ``share.record.lock.max.renewal.ms``; the longest (ms) a record stays
            Acquired by one member through RENEWs, from its acquisition. Default 900000.
        member_max_in_flight_records: ``share.member.max.in.flight.records``; the most records
            one member holds Acquired here (an acquisition beyond it gets fewer or none).
            Default 1000.
        member_max_acquisition_rate: ``share.member.max.acquisition.rate``; records per second
            one member may acquire here (token bucket of one second's worth); 0: unlimited.
            Default 20000.
        release_abuse_records / release_abuse_ratio_percent / release_abuse_window_ms:
            ``share.member.release.abuse.*``; a member that RELEASEs at least that many
            redelivered records (or lets that many locks run out at ``max_renewal_ms``) within
            the window (ms), those being at least that percent of its acknowledged records, is
            fenced from this share-partition for the window (see
            :meth:`SharePartition.acknowledge`). Defaults 200, 90, 60000; records 0: never.
        release_by_lock_end: ``queueflow.processing.guarantee=exactly_once``: a release by
            member (:meth:`SharePartition.release_member`, a fence) leaves the member's
            records Acquired until their own lock deadlines, so they are released by
            :meth:`SharePartition.expire_locks`, which the leader calls with the time up to
            which the member's transactional acknowledgements are known. A member can't know
            that it was removed or fenced, and commits acknowledgements until its own lock
            deadlines: ending its locks sooner would release records whose acknowledgement
            (and results) may still commit. A removed or fenced member may still acknowledge
            the records it holds (docs/architecture.md "Exactly-once: transactional
            acknowledgements"). Default False.
        redelivery_backoff_ms / redelivery_backoff_multiplier / redelivery_backoff_max_ms:
            the group configs ``share.redelivery.backoff.ms`` (0: off, the default),
            ``.multiplier`` (>= 1, default 2.0) and ``.max.ms`` (default 60000): a RELEASE
            without its own delay makes the record Available again only
            :func:`~queueflow.engine.redelivery.backoff_ms` later.
        max_release_delay_ms: ``queueflow.redelivery.max.delay.ms``; the longest delay a
            RELEASE may ask for (default 12 h).
        delivery_count_mode: ``share.delivery.count.mode``: ``acquisitions`` (KIP-932: every
            acquisition counts) or ``attempts`` (a delivery ended by a lock expiry or the
            member's release doesn't count).
        throttle_delivery: ``queueflow.delivery.throttle.enable``; records past half the
            delivery count limit are acquired in smaller batches, the last attempt alone
            (:func:`~queueflow.engine.redelivery.throttle_cap`). Default False (see the
            setting's documentation for why).
        dead_letter: the group has a dead-letter topic (``errors.deadletterqueue.topic.name``,
            KIP-1191): a record that would be Archived (REJECT, the delivery count limit, a
            lock expiry or restore at the limit; not a GAP) is held Acquired by
            :data:`~queueflow.engine.reserved.DEAD_LETTER_OWNER` instead, until the leader has
            written it to the DLQ and calls :meth:`SharePartition.archive_dead_letters`.
            Default False.

    Raises:
        ConfigurationError: on construction (see :meth:`validate`).
    """

    # Field order is positional API (``SharePartitionConfig(100, 2, 1000, 30000)``): add at the end.
    max_in_flight_records: int = int_default("group.share.partition.max.record.locks")
    delivery_count_limit: int = int_default("group.share.delivery.count.limit")
    record_lock_duration_ms: int = int_default("group.share.record.lock.duration.ms")
    max_record_lock_duration_ms: int = int_default("group.share.max.record.lock.duration.ms")
    min_record_lock_duration_ms: int = int_default("group.share.min.record.lock.duration.ms")
    renew_enabled: bool = bool_default("share.renew.acknowledge.enable")
    max_renewal_ms: int = int_default("share.record.lock.max.renewal.ms")
    member_max_in_flight_records: int = int_default("share.member.max.in.flight.records")
    member_max_acquisition_rate: int = int_default("share.member.max.acquisition.rate")
    release_abuse_records: int = int_default("share.member.release.abuse.records")
    release_abuse_ratio_percent: int = int_default("share.member.release.abuse.ratio.percent")
    release_abuse_window_ms: int = int_default("share.member.release.abuse.window.ms")
    release_by_lock_end: bool = False
    redelivery_backoff_ms: int = 0
    redelivery_backoff_multiplier: float = 2.0
    redelivery_backoff_max_ms: int = 60000
    max_release_delay_ms: int = int_default("queueflow.redelivery.max.delay.ms")
    delivery_count_mode: str = "acquisitions"
    throttle_delivery: bool = bool_default("queueflow.delivery.throttle.enable")
    dead_letter: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every setting against its allowed range in :data:`queueflow.settings.SETTINGS`.

        Raises:
            ConfigurationError: naming the KIP-932/Kafka setting, the value and the allowed range.
        """
        # A group's own share.partition.max.record.locks / share.delivery.count.limit (KIP-1240)
        # may go up to the broker-level maximum of its bound.
        _check_range(
            "group.share.partition.max.record.locks",
            self.max_in_flight_records,
            high=lookup("group.share.max.partition.max.record.locks").maximum,
        )
        _check_range(
            "group.share.delivery.count.limit",
            self.delivery_count_limit,
            high=lookup("group.share.max.delivery.count.limit").maximum,
        )
        _check_range("group.share.record.lock.duration.ms", self.record_lock_duration_ms)
        _check_range("group.share.max.record.lock.duration.ms", self.max_record_lock_duration_ms)
        _check_range("group.share.min.record.lock.duration.ms", self.min_record_lock_duration_ms)
        _check_range("share.record.lock.max.renewal.ms", self.max_renewal_ms)
        _check_range("share.member.max.in.flight.records", self.member_max_in_flight_records)
        _check_range("share.member.max.acquisition.rate", self.member_max_acquisition_rate)
        _check_range("share.member.release.abuse.records", self.release_abuse_records)
        _check_range("share.member.release.abuse.ratio.percent", self.release_abuse_ratio_percent)
        _check_range("share.member.release.abuse.window.ms", self.release_abuse_window_ms)
        _check_range("queueflow.redelivery.max.delay.ms", self.max_release_delay_ms)
        self._validate_redelivery()
        low, high = self.min_record_lock_duration_ms, self.max_record_lock_duration_ms
        if low > high:
            raise ConfigurationError(
                f"group.share.min.record.lock.duration.ms={low} exceeds "
                f"group.share.max.record.lock.duration.ms={high}"
            )
        if not low <= self.record_lock_duration_ms <= high:
            raise ConfigurationError(
                f"group.share.record.lock.duration.ms={self.record_lock_duration_ms} is out of "
                f"range: allowed {low}..{high} (it must lie within "
                "group.share.min.record.lock.duration.ms..group.share.max.record.lock.duration.ms)"
            )

    def _validate_redelivery(self) -> None:
        """Check the back-off policy and ``delivery_count_mode``."""
        top = self.max_release_delay_ms
        for name, value in (
            ("share.redelivery.backoff.ms", self.redelivery_backoff_ms),
            ("share.redelivery.backoff.max.ms", self.redelivery_backoff_max_ms),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
                raise ConfigurationError(
                    f"{name}={value!r} is out of range: allowed 0..{top} ms "
                    "(queueflow.redelivery.max.delay.ms)"
                )
        multiplier = self.redelivery_backoff_multiplier
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
            raise ConfigurationError(
                f"share.redelivery.backoff.multiplier={multiplier!r} must be a number >= 1"
            )
        if not 1.0 <= float(multiplier) <= 1000.0:
            raise ConfigurationError(
                f"share.redelivery.backoff.multiplier={multiplier!r} is out of range: "
                "allowed 1..1000"
            )
        if self.delivery_count_mode not in DELIVERY_COUNT_MODES:
            raise ConfigurationError(
                f"share.delivery.count.mode={self.delivery_count_mode!r}; use "
                + " or ".join(DELIVERY_COUNT_MODES)
            )


@dataclass(slots=True, eq=False)
class _Run:
    """Consecutive records ``first..last`` with equal state, count, owner and lock deadline.

    ``acquired``: when the current acquisition began (ms, Acquired only; the RENEW cap counts
    from it; not durable)."""

    first: int
    last: int
    state: RecordState
    count: int
    member: str | None
    deadline: int | None
    acquired: int | None = None


@dataclass(slots=True, eq=False)
class _MemberUse:
    """What one member does in one share-partition: the token bucket of its acquisitions, its
    RELEASEd and handled (ACCEPT/REJECT) records over the current and previous window, and the
    ranges it RELEASEd (``(ms, first, last)``, at most :data:`_MAX_RELEASE_RANGES`) and
    Archived by a RELEASE at the limit, which a fence rolls back."""

    tokens: float
    tokens_ms: int
    window_start: int
    released: int = 0
    handled: int = 0
    prev_released: int = 0
    prev_handled: int = 0
    fenced_until: int | None = None
    releases: deque[tuple[int, int, int]] = field(default_factory=deque)
    archived: deque[tuple[int, int, int]] = field(default_factory=deque)


#: At most this many RELEASEd ranges are remembered per member and share-partition.
_MAX_RELEASE_RANGES = 4096


def _remember(
    into: deque[tuple[int, int, int]], ranges: list[tuple[int, int]], now_ms: int, since_ms: int
) -> None:
    """Append ``ranges`` at ``now_ms``; drop entries from before ``since_ms`` and the oldest
    beyond :data:`_MAX_RELEASE_RANGES`."""
    while into and into[0][0] < since_ms:
        into.popleft()
    for first, last in ranges:
        into.append((now_ms, first, last))
    while len(into) > _MAX_RELEASE_RANGES:
        into.popleft()


@dataclass(frozen=True, slots=True)
class MemberFence:
    """A member fenced from a share-partition for RELEASing records without handling them
    (``share.member.release.abuse.*``; see :meth:`SharePartition.acknowledge`).

    Attributes:
        member_id: the member.
        released: records it RELEASEd in the window (weighted, rounded down).
        handled: records it ACCEPTed or REJECTed in the window (weighted, rounded down).
        restored: in-flight records whose delivery counts its RELEASEs had raised, rolled back.
        returned: records it held, made Available again without counting that delivery.
        until_ms: when the fence ends (ms).
    """

    member_id: str
    released: int
    handled: int
    restored: int
    returned: int
    until_ms: int


@dataclass(slots=True, eq=False)
class _LockGroup:
    """The records Acquired with one lock deadline: how many, and the ranges they were acquired
    in (a superset of where they still are, used by :meth:`SharePartition.expire_locks`)."""

    count: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)


def _run_first(run: _Run) -> int:
    return run.first


def _same(a: _Run, b: _Run) -> bool:
    return (
        a.state is b.state
        and a.count == b.count
        and a.member == b.member
        and a.deadline == b.deadline
        and a.acquired == b.acquired
    )


# A transformation of one run: returns the new (state, count, member, deadline), or None to keep it.
_Transform = Callable[[_Run], tuple[RecordState, int, str | None, int | None] | None]


def _accept(r: _Run) -> tuple[RecordState, int, None, None]:
    return (_ACKNOWLEDGED, r.count, None, None)


def _archive(r: _Run) -> tuple[RecordState, int, None, None]:
    return (_ARCHIVED, r.count, None, None)


class SharePartition:
    """The in-flight records of one share-partition and every KIP-932 rule that governs them.

    Args:
        config: limits (see :class:`SharePartitionConfig`).
        start_offset: initial SPSO (>= 0); the SPEO starts equal to it.

    Raises:
        InvalidRequestError: ``start_offset`` is negative.

    KIP-932 "In-flight records", "Record delivery and acknowledgement", "Managing the SPSO and
    SPEO" and "Managing durable share-partition state".
    """

    __slots__ = (
        "_archived_log",
        "_archived_total",
        "_config",
        "_dirty",
        "_end",
        "_fences",
        "_heap",
        "_held",
        "_hint",
        "_holes",
        "_holes_read_to",
        "_key_order",
        "_locks",
        "_n_acquired",
        "_n_available",
        "_reason",
        "_reset_pending",
        "_runs",
        "_start",
        "_taken_start",
        "_use",
    )

    def __init__(self, config: SharePartitionConfig, start_offset: int) -> None:
        if start_offset < 0:
            raise InvalidRequestError(f"start offset must be >= 0, got {start_offset}")
        self._config = config
        self._start = start_offset  # SPSO
        self._end = start_offset  # SPEO (exclusive)
        # Runs cover [SPSO, SPEO) exactly, in offset order, without gaps.
        self._runs: list[_Run] = []
        self._n_acquired = 0
        self._n_available = 0
        # No in-flight record below this offset is Available (where acquire starts looking).
        self._hint = start_offset
        # Lock deadline (ms) -> records Acquired with it; a heap of deadlines, lazily cleaned.
        self._locks: dict[int, _LockGroup] = {}
        self._heap: list[int] = []
        # Durability: offset intervals changed since the last take_changes().
        self._dirty: list[tuple[int, int]] = []
        self._taken_start = start_offset
        self._reset_pending = False
        # Records moved to Archived by this object (REJECT, GAP, the delivery count limit).
        self._archived_total = 0
        # Archive transitions since take_archived(), and the reason the current change gives.
        self._archived_log: list[ArchivedRange] = []
        self._reason = "delivery_limit"
        # Member -> records it holds Acquired here; member -> its use (rate, releases, fence).
        self._held: dict[str, int] = {}
        self._use: dict[str, _MemberUse] = {}
        self._fences: list[MemberFence] = []
        # share.ordering=key (queueflow.engine.key_order).
        self._key_order: KeyOrder | None = None
        # Known offset ranges without a record at or after the SPEO (mark_holes), sorted and
        # disjoint: entered as Archived when the SPEO reaches them. Not durable.
        self._holes: deque[tuple[int, int]] = deque()
        # The log was read for holes up to here (exclusive; mark_holes' read_to).
        self._holes_read_to = start_offset

    # ----------------------------------------------------------------------------------------
    # Views
    # ----------------------------------------------------------------------------------------

    @property
    def config(self) -> SharePartitionConfig:
        """The limits this share-partition enforces."""
        return self._config

    def reconfigure(self, config: SharePartitionConfig) -> None:
        """Enforce ``config`` from now on (a share group's configs changed: docs/operations.md
        "Group configs").

        Nothing already in flight changes: a new lock duration applies to the next
        acquisitions, a new delivery count limit when a record is next released or its lock
        expires (a record Available with a count at or past a lowered limit is delivered once
        more, then Archived), a lower ``max_in_flight_records`` stops new records from being
        acquired until the in-flight window shrinks below it.
        """
        self._config = config

    @property
    def key_order(self) -> KeyOrder | None:
        """The key order this share-partition acquires by (``share.ordering=key``), else None."""
        return self._key_order

    def order_by_key(self, key_order: KeyOrder | None) -> None:
        """Acquire by ``key_order`` from now on (docs/concepts.md "Key-ordered sharing"), or in
        offset order again (``None``). Nothing in flight changes."""
        self._key_order = key_order

    @property
    def start_offset(self) -> int:
        """The share-partition start offset (SPSO): the first in-flight offset."""
        return self._start

    @property
    def end_offset(self) -> int:
        """The share-partition end offset (SPEO), exclusive: the first offset not yet in flight."""
        return self._end

    @property
    def acquired_count(self) -> int:
        """Number of in-flight records in the ``ACQUIRED`` state."""
        return self._n_acquired

    @property
    def available_count(self) -> int:
        """Number of in-flight records (SPSO..SPEO-1) in the ``AVAILABLE`` state."""
        return self._n_available

    @property
    def in_flight_count(self) -> int:
        """Number of in-flight records: SPEO - SPSO."""
        return self._end - self._start

    @property
    def archived_total(self) -> int:
        """Records this object moved to ``ARCHIVED`` since it was created or restored (REJECT,
        GAP, or a release or lock expiry at ``delivery_count_limit``): a monotonic count for
        metrics; records restored as Archived are not counted."""
        return self._archived_total

    @property
    def delayed_count(self) -> int:
        """Records held by :data:`~queueflow.engine.reserved.DELAYED_OWNER` until their delay
        ends (counted in :attr:`acquired_count` too; Available to no one until then)."""
        return self._held.get(DELAYED_OWNER, 0)

    def take_archived(self) -> list[ArchivedRange]:
        """The records moved to Archived since the previous call (REJECT, or a RELEASE, lock
        expiry or member release at the delivery count limit; not GAP offsets, which hold no
        record), adjacent ranges of one count and reason merged; each is returned once."""
        archived, self._archived_log = self._archived_log, []
        return merge_archived(archived) if archived else []

    @property
    def run_count(self) -> int:
        """Number of runs the in-flight records are stored as (a memory measure)."""
        return len(self._runs)

    def record(self, offset: int) -> RecordView:
        """The state of the record at ``offset``.

        Offsets below the SPSO are reported as ``ARCHIVED`` with delivery count 0 (KIP-932 "All
        records before the SPSO are in Archived state"; their state is no longer tracked).
        Offsets at or after the SPEO are ``AVAILABLE`` with count 0 ("All records after the SPEO
        are in Available state, but not yet being delivered to consumers").
        """
        if offset < self._start:
            return RecordView(_ARCHIVED, 0, None, None)
        if offset >= self._end:
            return RecordView(_AVAILABLE, 0, None, None)
        r = self._runs[self._index(offset)]
        return RecordView(r.state, r.count, r.member, r.deadline)

    def in_flight(self) -> Iterator[RunView]:
        """Maximal runs of in-flight records, in offset order, covering SPSO..SPEO-1 exactly."""
        for r in list(self._runs):
            yield RunView(r.first, r.last, r.state, r.count, r.member, r.deadline)

    def next_lock_deadline(self) -> int | None:
        """The earliest acquisition lock deadline (ms), or None if no record is ``ACQUIRED``.

        Call :meth:`expire_locks` with ``now_ms`` at or after it.
        """
        heap = self._heap
        while heap and heap[0] not in self._locks:
            heapq.heappop(heap)
        return heap[0] if heap else None

    # ----------------------------------------------------------------------------------------
    # Acquire (KIP-932 "Record delivery and acknowledgement": Available -> Acquired)
    # ----------------------------------------------------------------------------------------

    def acquire(
        self,
        member_id: str,
        max_records: int,
        log_end_offset: int,
        now_ms: int,
        lock_duration_ms: int | None = None,
    ) -> list[AcquiredRecords]:
        """Acquire up to ``max_records`` Available records for ``member_id``.

        Walks from the SPSO: first in-flight records that are Available again (released or
        timed out), then new records from the SPEO up to ``log_end_offset``. Never acquires
        Acquired, Acknowledged or Archived records, and never lets SPEO - SPSO exceed
        ``max_in_flight_records``. Each acquired record's delivery count goes up by 1 and it is
        locked for the member until ``now_ms + lock_duration_ms``.

        Args:
            member_id: the acquiring share-group member (non-empty).
            max_records: the most records to acquire (>= 1).
            log_end_offset: exclusive end of the records in the log; a value below the SPEO
                means "no new records".
            now_ms: the current time in ms.
            lock_duration_ms: the consumer's own lock duration in ms,
                ``min_record_lock_duration_ms..max_record_lock_duration_ms``; None for
                ``record_lock_duration_ms``.

        A member acquires at most ``member_max_in_flight_records`` held at once here and
        ``member_max_acquisition_rate`` records per second (a token bucket of one second's
        worth): beyond them it gets fewer records or none, without an error (as Kafka bounds a
        fetch by ``share.fetch.max.records`` and the share-partition's record locks).

        Returns:
            Acquired ranges of equal delivery count, in increasing offset order (maybe empty).

        Raises:
            InvalidRequestError: empty member id, ``max_records < 1`` or a lock duration out of
                range. Nothing changes.
            ShareGroupError: ``FENCED_MEMBER_EPOCH`` while the member is fenced from this
                share-partition for releasing records without handling them.

        KIP-932 "Record delivery and acknowledgement", "In-flight records", "Batching".
        """
        if not member_id:
            raise InvalidRequestError("member id must be a non-empty string")
        if max_records < 1:
            raise InvalidRequestError(f"max records must be >= 1, got {max_records}")
        cfg = self._config
        member = sys.intern(member_id)
        deadline = now_ms + self._lock_duration(lock_duration_ms)
        self._check_fence(member, now_ms)
        remaining = self.allowance(member, max_records, now_ms)
        if remaining < 1:
            return []
        ranges: list[tuple[int, int, int]] = []  # (first, last, delivery count)
        runs = self._runs
        if self._key_order is not None:  # share.ordering=key: by key (engine.key_order)
            ranges = self._acquire_by_key(member, remaining, log_end_offset, now_ms, deadline)
            remaining = 0

        # KIP-932 "Record delivery and acknowledgement": the leader "starts at the SPSO and finds
        # Available records"; each moves to Acquired and its delivery count is bumped.
        throttled: int | None = None  # the delivery count of a throttled batch
        if self._n_available and remaining > 0:
            lock = self._lock_group(deadline)
            to_see = self._n_available
            lo = hi = -1
            i = self._index(max(self._hint, self._start))
            while i < len(runs) and remaining > 0 and to_see > 0:
                r = runs[i]
                if r.state is _AVAILABLE:
                    # Throttled delivery (docs/concepts.md): records past half the delivery
                    # count limit go in smaller batches of their own, the last attempt alone.
                    cap = (
                        throttle_cap(r.count + 1, cfg.delivery_count_limit, max_records)
                        if cfg.throttle_delivery
                        else max_records
                    )
                    if throttled is None and cap < max_records:
                        if ranges:
                            break
                        throttled, remaining = r.count, min(remaining, cap)
                    elif throttled is not None and r.count != throttled:
                        break
                    n = r.last - r.first + 1
                    to_see -= n
                    if n > remaining:
                        self._split_at(r.first + remaining)
                        n = remaining
                    self._retag(r, _ACQUIRED, r.count + 1, member, deadline)
                    r.acquired = now_ms
                    ranges.append((r.first, r.last, r.count))
                    lock.ranges.append((r.first, r.last))
                    self._mark_dirty(r.first, r.last)
                    remaining -= n
                    if lo < 0:
                        lo = i
                    hi = i
                i += 1
            # Every Available record before runs[i] has just been acquired.
            self._hint = runs[i].first if i < len(runs) else self._end
            if lo >= 0:
                self._merge_window(lo - 1, hi + 1)
            self._drop_if_unused(deadline)

        # Then new records from the SPEO. KIP-932 "In-flight records": the distance between the
        # SPSO and SPEO is bounded by group.share.partition.max.record.locks.
        if remaining > 0 and throttled is None and self._holes:
            limit = min(max(log_end_offset, self._end), self._start + cfg.max_in_flight_records)
            ranges += self._acquire_past_holes(member, remaining, limit, now_ms, deadline)
        elif remaining > 0 and throttled is None:
            stop = min(
                max(log_end_offset, self._end),
                self._start + cfg.max_in_flight_records,
                self._end + remaining,
            )
            if stop > self._end:
                first, last = self._end, stop - 1
                lock = self._lock_group(deadline)
                run = _Run(first, last, _AVAILABLE, 0, None, None)
                self._n_available += last - first + 1
                runs.append(run)
                self._end = stop
                # "The first time a record is acquired, its delivery count is 1."
                self._retag(run, _ACQUIRED, 1, member, deadline)
                run.acquired = now_ms
                ranges.append((first, last, 1))
                lock.ranges.append((first, last))
                self._mark_dirty(first, last)
                self._merge_window(len(runs) - 2, len(runs) - 1)

        if ranges and cfg.member_max_acquisition_rate > 0:
            self._spend(member, sum(last - first + 1 for first, last, _ in ranges))
        # Returned ranges are in increasing offset order (KIP-932 "Ordering").
        out: list[AcquiredRecords] = []
        for first, last, count in ranges:
            if out and out[-1].last_offset + 1 == first and out[-1].delivery_count == count:
                out[-1] = AcquiredRecords(out[-1].first_offset, last, count)
            else:
                out.append(AcquiredRecords(first, last, count))
        return out

    def _acquire_past_holes(
        self, member: str, remaining: int, limit: int, now_ms: int, deadline: int
    ) -> list[tuple[int, int, int]]:
        """New records from the SPEO up to ``limit`` (exclusive), ``remaining`` at most, the
        known holes among them entered as Archived without counting (:meth:`mark_holes`):
        the acquisitions as ``(first, last, 1)``."""
        out: list[tuple[int, int, int]] = []
        holes = self._holes
        while self._end < limit:
            pos = self._end
            while holes and holes[0][1] < pos:
                holes.popleft()
            if holes and holes[0][0] <= pos:  # a hole at the SPEO: in flight as Archived
                self._enter_hole(min(holes[0][1], limit - 1))
                continue
            if remaining <= 0:
                break
            stop = min(limit, pos + remaining, holes[0][0] if holes else limit)
            lock = self._lock_group(deadline)
            run = _Run(pos, stop - 1, _AVAILABLE, 0, None, None)
            self._n_available += stop - pos
            self._runs.append(run)
            self._end = stop
            self._retag(run, _ACQUIRED, 1, member, deadline)
            run.acquired = now_ms
            out.append((pos, stop - 1, 1))
            lock.ranges.append((pos, stop - 1))
            self._mark_dirty(pos, stop - 1)
            self._merge_window(len(self._runs) - 2, len(self._runs) - 1)
            remaining -= stop - pos
        self._advance()
        return out

    def _enter_hole(self, last: int) -> None:
        """Move the SPEO to ``last + 1`` over offsets that hold no record: Archived (as a GAP,
        delivery count 0)."""
        first = self._end
        self._runs.append(_Run(first, last, _ARCHIVED, 0, None, None))
        self._end = last + 1
        self._archived_total += last - first + 1
        self._mark_dirty(first, last)
        self._merge_window(len(self._runs) - 2, len(self._runs) - 1)

    @property
    def holes_read_to(self) -> int:
        """Offsets below this (and at or after the SPSO) were read for holes
        (:meth:`mark_holes`); the SPSO when none were."""
        return max(self._holes_read_to, self._start)

    def mark_holes(self, holes: Iterable[tuple[int, int]], read_to: int | None = None) -> int:
        """Offsets known to hold no record (compaction, transaction markers; with
        ``read_committed`` aborted records too), so that acquiring counts records, not offsets
        (docs/concepts.md "Acquisition counts records").

        Available in-flight offsets among ``holes`` are Archived as a GAP would (no delivery
        counted, no dead-letter record, no key parked); Acquired ones are left to their members
        (who acknowledge them as GAP). Holes at or after the SPEO are remembered and entered as
        Archived when the SPEO reaches them (:meth:`acquire`); those starting at the SPEO are
        entered now, within ``max_in_flight_records``. Then the SPSO advances. The remembered
        holes are not durable (a new leader learns them again).

        Args:
            holes: inclusive ``(first, last)`` ranges, ascending and disjoint; parts below the
                SPSO are ignored.
            read_to: the log was read up to here (exclusive): :attr:`holes_read_to`.

        Returns:
            The offsets Archived now.

        Raises:
            InvalidRequestError: a range with ``first > last`` or a negative offset, or ranges
                out of order; nothing changes.
        """
        ranges = list(holes)
        prev = -1
        for first, last in ranges:
            if first < 0 or first > last or first <= prev:
                raise InvalidRequestError(
                    f"holes must be ascending, disjoint (first, last) ranges of offsets >= 0; "
                    f"got {ranges[:8]}"
                )
            prev = last
        if read_to is not None and read_to > self._holes_read_to:
            self._holes_read_to = read_to
        archived_before = self._archived_total
        saved, self._reason = self._reason, "gap"
        try:
            for first, last in ranges:
                first = max(first, self._start)
                hi = min(last, self._end - 1)
                if first <= hi and self._n_available:
                    self._apply(first, hi, lambda r: _archive(r) if r.state is _AVAILABLE else None)
                if last >= self._end:
                    self._remember_hole(max(first, self._end), last)
        finally:
            self._reason = saved
        holes = self._holes
        while True:  # holes at the SPEO: in flight now (the SPSO passes them if it can)
            while holes and holes[0][1] < self._end:
                holes.popleft()
            limit = self._start + self._config.max_in_flight_records
            if not holes or holes[0][0] > self._end or self._end >= limit:
                break
            self._enter_hole(min(holes[0][1], limit - 1))
            self._advance()
        self._advance()
        return self._archived_total - archived_before

    def forget_holes(self) -> None:
        """Forget the holes remembered ahead of the SPEO and how far the log was read for them
        (the reader's isolation level changed: an aborted record is a hole under
        ``read_committed`` only). Holes already Archived stay so."""
        self._holes.clear()
        self._holes_read_to = self._start

    def _remember_hole(self, first: int, last: int) -> None:
        holes = self._holes
        if holes and first <= holes[-1][1] + 1:
            if first >= holes[-1][0]:
                holes[-1] = (holes[-1][0], max(last, holes[-1][1]))
                return
            merged = sorted([*holes, (first, last)])
            holes.clear()
            for lo, hi in merged:
                if holes and lo <= holes[-1][1] + 1:
                    holes[-1] = (holes[-1][0], max(hi, holes[-1][1]))
                else:
                    holes.append((lo, hi))
            return
        holes.append((first, last))

    def _acquire_by_key(
        self, member: str, remaining: int, log_end_offset: int, now_ms: int, deadline: int
    ) -> list[tuple[int, int, int]]:
        """Acquire what the key order allows (:meth:`KeyOrder.select
        <queueflow.engine.key_order.KeyOrder.select>`), up to ``remaining`` records: the
        acquisitions as ``(first, last, delivery count)``. New records enter the in-flight
        window up to the last one acquired (those skipped over stay Available)."""
        keys = self._key_order
        assert keys is not None
        keys.forget_below(self._start)
        runs = self._runs
        new_end = min(
            max(log_end_offset, self._end), self._start + self._config.max_in_flight_records
        )
        offsets = keys.select(
            ((r.first, r.last, r.state) for r in runs), self._end, new_end, remaining
        )
        if not offsets:
            return []
        top = offsets[-1] + 1
        if top > self._end:
            runs.append(_Run(self._end, top - 1, _AVAILABLE, 0, None, None))
            self._n_available += top - self._end
            self._end = top
            self._merge_window(len(runs) - 2, len(runs) - 1)
        # Offsets the key index saw no record at: Archived as a GAP would, not acquired.
        holes = [o for o in offsets if keys.key_of(o) is None]
        if holes:
            offsets = [o for o in offsets if keys.key_of(o) is not None]
            saved, self._reason = self._reason, "gap"
            try:
                for first, last in consecutive(holes):
                    self._apply(first, last, _archive)
            finally:
                self._reason = saved
        lock = self._lock_group(deadline)
        out: list[tuple[int, int, int]] = []
        for first, last in consecutive(offsets):
            i = self._split_at(first)
            j = self._split_at(last + 1)
            for k in range(i, j):
                r = runs[k]
                self._retag(r, _ACQUIRED, r.count + 1, member, deadline)
                r.acquired = now_ms
                out.append((r.first, r.last, r.count))
            lock.ranges.append((first, last))
            self._mark_dirty(first, last)
            self._merge_window(i - 1, j)
        self._drop_if_unused(deadline)
        if holes:
            self._advance()
        return out

    def archive_available(self, offsets: Iterable[int]) -> int:
        """Archive the Available records among ``offsets`` (an operator skipped their parked
        key: docs/concepts.md "Key-ordered sharing"), then advance the SPSO. The SPEO moves up
        to the last of them first, within ``max_in_flight_records`` (those skipped over are
        Available, never delivered); offsets below the SPSO, beyond that limit or in another
        state are left alone. Returns how many were Archived."""
        wanted = sorted(set(offsets))
        top = min(wanted[-1] + 1, self._start + self._config.max_in_flight_records) if wanted else 0
        if top > self._end:
            self._runs.append(_Run(self._end, top - 1, _AVAILABLE, 0, None, None))
            self._n_available += top - self._end
            self._end = top
            self._merge_window(len(self._runs) - 2, len(self._runs) - 1)
        n = 0
        for first, last in consecutive(wanted):
            first, last = max(first, self._start), min(last, self._end - 1)
            if first <= last:
                n += self._apply(
                    first, last, lambda r: _archive(r) if r.state is _AVAILABLE else None
                )
        self._advance()
        return n

    def allowance(self, member_id: str, max_records: int, now_ms: int) -> int:
        """How many of ``max_records`` ``member_id`` may acquire now: bounded by
        ``member_max_in_flight_records`` minus what it holds, and by its token bucket of
        ``member_max_acquisition_rate`` records per second (refilled to ``now_ms``). Read-only
        apart from the refill."""
        cfg = self._config
        allowed = min(max_records, cfg.member_max_in_flight_records - self._held.get(member_id, 0))
        rate = cfg.member_max_acquisition_rate
        if rate > 0 and allowed > 0:
            use = self._member_use(member_id, now_ms)
            elapsed = max(0, now_ms - use.tokens_ms)
            use.tokens = min(float(rate), use.tokens + elapsed * rate / 1000.0)
            use.tokens_ms = max(use.tokens_ms, now_ms)
            allowed = min(allowed, int(use.tokens))
        return max(allowed, 0)

    def held_by(self, member_id: str) -> int:
        """Records ``member_id`` holds Acquired in this share-partition."""
        return self._held.get(member_id, 0)

    def _spend(self, member: str, n: int) -> None:
        """Take ``n`` acquired records from ``member``'s token bucket."""
        if n > 0:
            use = self._use.get(member)
            if use is not None:
                use.tokens = max(0.0, use.tokens - n)

    def _member_use(self, member: str, now_ms: int) -> _MemberUse:
        use = self._use.get(member)
        if use is None:
            if len(self._use) >= 1024:
                self._prune_use(now_ms)
            rate = float(self._config.member_max_acquisition_rate)
            use = self._use[member] = _MemberUse(rate, now_ms, now_ms)
        return use

    def _prune_use(self, now_ms: int) -> None:
        """Forget members that hold nothing, aren't fenced and did nothing for two windows."""
        stale = now_ms - 2 * self._config.release_abuse_window_ms
        for member, use in list(self._use.items()):
            if (
                not self._held.get(member)
                and (use.fenced_until is None or use.fenced_until <= now_ms)
                and use.window_start <= stale
                and use.tokens_ms <= now_ms - 1000
            ):
                del self._use[member]

    def _check_fence(self, member: str, now_ms: int) -> None:
        """Raise ``FENCED_MEMBER_EPOCH`` while ``member`` is fenced from this share-partition."""
        use = self._use.get(member)
        if use is None or use.fenced_until is None:
            return
        if now_ms >= use.fenced_until:
            use.fenced_until = None
            return
        raise ShareGroupError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member {member!r} is fenced from this share-partition until "
            f"{use.fenced_until} ms for RELEASing records without handling them "
            "(share.member.release.abuse.records / .ratio.percent / .window.ms); "
            "acknowledge records with ACCEPT or REJECT once handled",
        )

    def _lock_duration(self, lock_duration_ms: int | None) -> int:
        """A consumer's own lock duration (ms), checked; the group's when ``None``."""
        cfg = self._config
        if lock_duration_ms is None:
            return cfg.record_lock_duration_ms
        if not (
            cfg.min_record_lock_duration_ms <= lock_duration_ms <= cfg.max_record_lock_duration_ms
        ):
            raise InvalidRequestError(
                f"lock duration {lock_duration_ms} ms is out of range: allowed "
                f"{cfg.min_record_lock_duration_ms}..{cfg.max_record_lock_duration_ms} ms "
                "(group.share.min.record.lock.duration.ms..group.share.max.record.lock.duration.ms)"
            )
        return lock_duration_ms

    # ----------------------------------------------------------------------------------------
    # Acknowledge (KIP-932 "Record delivery and acknowledgement": Acquired -> ...)
    # ----------------------------------------------------------------------------------------

    def acknowledge(
        self,
        member_id: str,
        batches: Sequence[AcknowledgementBatch],
        now_ms: int,
        lock_duration_ms: int | None = None,
    ) -> MemberFence | None:
        """Apply a consumer's acknowledgements atomically, then advance the SPSO.

        ``ACCEPT`` -> Acknowledged; ``REJECT`` -> Archived; ``GAP`` -> Archived (no record at that
        offset); ``RELEASE`` -> Available, or Archived once the delivery count has reached
        ``delivery_count_limit``; the acquisition lock is cleared. A RELEASE batch's
        ``delay_ms`` (or the group's back-off policy) holds the records by
        :data:`~queueflow.engine.reserved.DELAYED_OWNER` until then instead; ``undelivered``
        gives the delivery back (count - 1, never Archived). ``RENEW`` (KIP-1222) keeps
        the record Acquired by the member, with the same delivery count, and moves its lock
        deadline to ``now_ms + lock_duration_ms``.

        Args:
            member_id: the acknowledging member.
            batches: ordered, non-overlapping batches below the SPEO. Offsets below the SPSO
                (finished by another member after this one's lock elapsed) are skipped, as
                Kafka 4.3's broker skips them: no error, nothing changes for them.
            now_ms: the current time in ms (acknowledgements are accepted until the lock is
                expired by :meth:`expire_locks`; RENEW counts its new lock from it).
            lock_duration_ms: the lock a RENEW grants, in ms; ``None`` is the group's
                ``group.share.record.lock.duration.ms``.

        Raises:
            InvalidRequestError: batches unordered or overlapping, ``first_offset >
                last_offset``, a bad number of acknowledge types or an unknown type, offsets
                outside SPSO..SPEO-1, a RENEW lock duration out of range, a RENEW while
                ``renew_enabled`` is False (``share.renew.acknowledge.enable=false``), or a
                ``delay_ms`` / ``undelivered`` on another type than RELEASE or a delay out of
                ``0..max_release_delay_ms``.
            InvalidRecordStateError: an offset is not Acquired by ``member_id``, or a RENEW
                can't extend a lock any more: the record has been Acquired for
                ``share.record.lock.max.renewal.ms`` since its acquisition (Kafka answers a
                refused RENEW with ``INVALID_RECORD_STATE`` too).
            ShareGroupError: ``FENCED_MEMBER_EPOCH`` while the member is fenced from this
                share-partition (see below).
            On any error nothing changes.

        Returns:
            ``None``; or, when this request makes the member one that RELEASEs without handling
            (at least ``release_abuse_records`` records RELEASEd on their second delivery or
            later in the last ``release_abuse_window_ms``, and those RELEASEs at least
            ``release_abuse_ratio_percent`` of what it acknowledged then), the
            :class:`MemberFence`: the member is refused here
            for the window, the delivery counts its RELEASEs raised on in-flight records are
            rolled back (records it Archived at the limit that are still in flight come back),
            and the records it holds become Available without that delivery counting. KIP-932
            counts every RELEASE as a delivery; the rollback keeps a member from Archiving
            healthy records by acquiring and releasing them in a loop.

        KIP-932 "Client programming interface": "the share-partition leader guarantees that
        acknowledgements for the records in a batch are performed atomically". RENEW:
        KIP-1222.
        """
        member = sys.intern(member_id)
        if not self._config.release_by_lock_end:  # else: settling what it holds is allowed
            self._check_fence(member, now_ms)
        opts: list[tuple[int, bool]] = []  # (delay_ms, undelivered) of each plan segment
        plan = self._validate_acks(member_id, batches, opts)
        renew_deadline: int | None = None
        released: list[tuple[int, int]] = []
        handled = 0
        renews = False
        for (first, last, ack), (_delay, undelivered) in zip(plan, opts, strict=True):
            if ack is _RELEASE:
                if not undelivered:  # a delivery given back is no RELEASE without handling
                    released.append((first, last))
            elif ack is _RENEW:
                renews = True
            elif ack is not _GAP:
                handled += last - first + 1
        if renews:
            if not self._config.renew_enabled:
                raise InvalidRequestError(
                    "RENEW is disabled for this share group (share.renew.acknowledge.enable="
                    "false): acknowledge with ACCEPT, RELEASE or REJECT before the lock elapses"
                )
            renew_deadline = now_ms + self._lock_duration(lock_duration_ms)
            self._check_renewals(plan)
        # Everything is valid: apply. Nothing below can fail. Other locks elapse only through
        # expire_locks(); see its docstring.
        # Decided before applying: the RELEASEs that make it abusive must not Archive anything.
        abusive = self._tally(
            member, self._redelivered(released) if released else 0, handled, now_ms
        )
        archived: list[tuple[int, int]] = []
        for (first, last, ack), (delay_ms, undelivered) in zip(plan, opts, strict=True):
            if ack is _RENEW:
                assert renew_deadline is not None
                self._renew(first, last, renew_deadline)
            elif ack is _RELEASE:
                if abusive is None:
                    release = self._release_ack(now_ms, delay_ms, undelivered, archived)
                    self._apply(first, last, release)
            else:
                self._reason = "rejected" if ack is AcknowledgeType.REJECT else "gap"
                self._apply(first, last, self._ack_transform(ack, archived))
                self._reason = "delivery_limit"
        self._advance()
        if abusive is not None:  # its RELEASEs above stay held and are returned uncounted
            return self._fence(member, self._use[member], abusive[0], abusive[1], now_ms)
        if released:
            use = self._use.get(member)
            if use is not None:
                since = now_ms - 2 * self._config.release_abuse_window_ms
                _remember(use.releases, released, now_ms, since)
                _remember(use.archived, archived, now_ms, since)
        return None

    def _check_renewals(self, plan: list[tuple[int, int, AcknowledgeType]]) -> None:
        """Refuse a RENEW of records whose lock already reaches ``max_renewal_ms`` past their
        acquisition (``share.record.lock.max.renewal.ms``)."""
        capped = self._capped(plan)
        if capped:
            shown = ", ".join(f"{lo}..{hi}" for lo, hi in capped[:8])
            raise InvalidRecordStateError(
                f"RENEW refused for records {shown}: they have been Acquired for "
                f"share.record.lock.max.renewal.ms={self._config.max_renewal_ms} ms since "
                "their acquisition, the most a lock may be renewed; acknowledge them with "
                "ACCEPT, RELEASE or REJECT before the lock elapses"
            )

    def _capped(self, plan: Iterable[tuple[int, int, AcknowledgeType]]) -> list[tuple[int, int]]:
        """The Acquired offsets of ``plan``'s RENEWs whose lock can't be renewed any more."""
        cap = self._config.max_renewal_ms
        runs = self._runs
        out: list[tuple[int, int]] = []
        for first, last, ack in plan:
            if ack is not AcknowledgeType.RENEW:
                continue
            first, last = max(first, self._start), min(last, self._end - 1)
            i = self._index(first) if first <= last else len(runs)
            while i < len(runs) and runs[i].first <= last:
                r = runs[i]
                i += 1
                if r.state is not _ACQUIRED or r.acquired is None or r.deadline is None:
                    continue
                if r.acquired + cap <= r.deadline:
                    out.append((max(r.first, first), min(r.last, last)))
        return out

    def _renew(self, first: int, last: int, deadline: int) -> None:
        """Move the locks of ``first..last`` (Acquired by one member, validated) to ``deadline``,
        or to ``max_renewal_ms`` after a record's acquisition if that is sooner. The new deadline
        is durable (a new leader keeps it)."""
        cap = self._config.max_renewal_ms

        def transform(r: _Run) -> tuple[RecordState, int, str | None, int | None]:
            start = r.acquired if r.acquired is not None else deadline
            d = min(deadline, start + cap)
            self._lock_group(d).ranges.append((r.first, r.last))
            return (_ACQUIRED, r.count, r.member, d)

        self._apply(first, last, transform)

    def _redelivered(self, ranges: list[tuple[int, int]]) -> int:
        """How many records of ``ranges`` (Acquired, validated) are on their second delivery or
        later: RELEASEs of those make a loop. Releasing first deliveries (what a member does
        with the records it has not started on, at close or revocation) is not counted."""
        runs = self._runs
        n = 0
        for first, last in ranges:
            i = self._index(first)
            while i < len(runs) and runs[i].first <= last:
                r = runs[i]
                i += 1
                if r.count >= 2:
                    n += min(r.last, last) - max(r.first, first) + 1
        return n

    def _tally(
        self, member: str, released: int, handled: int, now_ms: int
    ) -> tuple[int, int] | None:
        """Add a request's RELEASEd and handled records to ``member``'s window; return its
        (RELEASEd, handled) records in the window when that makes it a member that RELEASEs
        without handling (see :meth:`acknowledge`), else ``None``."""
        cfg = self._config
        if cfg.release_abuse_records <= 0 or not (released or handled):
            return None
        use = self._member_use(member, now_ms)
        window = cfg.release_abuse_window_ms
        if now_ms >= use.window_start + 2 * window:
            use.prev_released = use.prev_handled = use.released = use.handled = 0
            use.window_start = now_ms
        elif now_ms >= use.window_start + window:
            use.prev_released, use.prev_handled = use.released, use.handled
            use.released = use.handled = 0
            use.window_start += window
        use.released += released
        use.handled += handled
        weight = max(0.0, 1.0 - (now_ms - use.window_start) / window)
        total_released = use.released + use.prev_released * weight
        total_handled = use.handled + use.prev_handled * weight
        if total_released < cfg.release_abuse_records:
            return None
        if total_released * 100 < cfg.release_abuse_ratio_percent * (
            total_released + total_handled
        ):
            return None
        return int(total_released), int(total_handled)

    def _fence(
        self, member: str, use: _MemberUse, released: int, handled: int, now_ms: int
    ) -> MemberFence:
        """Fence ``member`` here for the window and undo the delivery counts its RELEASEs and
        its held records added (see :meth:`acknowledge`)."""
        until = now_ms + self._config.release_abuse_window_ms
        use.fenced_until = until
        use.released = use.handled = use.prev_released = use.prev_handled = 0
        use.window_start = now_ms
        returned = 0
        if self._held.get(member) and self._config.release_by_lock_end:
            returned = self.held_by(member)  # released by expire_locks at their deadlines
        elif self._held.get(member):
            # Its current deliveries don't count either: the records were never handled.
            returned = self._apply(
                self._start,
                self._end - 1,
                lambda r: (
                    (_AVAILABLE, max(r.count - 1, 0), None, None)
                    if r.state is _ACQUIRED and r.member == member
                    else None
                ),
            )
        touched: set[int] = set()

        def revive(r: _Run) -> tuple[RecordState, int, str | None, int | None] | None:
            # Archived at the limit by its RELEASE: Available again (the count is undone below).
            # (or held for the DLQ: it comes back before the DLQ writer archives it)
            back = r.state is _ARCHIVED or r.member == DEAD_LETTER_OWNER
            return (_AVAILABLE, r.count, None, None) if back else None

        def undo(r: _Run) -> tuple[RecordState, int, str | None, int | None] | None:
            floor = 1 if r.state is _ACQUIRED else 0
            if r.state is _ACKNOWLEDGED or r.state is _ARCHIVED or r.count <= floor:
                return None
            touched.update(range(r.first, r.last + 1))
            return (r.state, r.count - 1, r.member, r.deadline)

        for ranges, transform in ((use.archived, revive), (use.releases, undo)):
            for _t, first, last in ranges:
                first, last = max(first, self._start), min(last, self._end - 1)
                if first <= last:
                    self._apply(first, last, transform)
            ranges.clear()
        return MemberFence(member, released, handled, len(touched), returned, until)

    def _validate_acks(
        self,
        member_id: str,
        batches: Sequence[AcknowledgementBatch],
        opts: list[tuple[int, bool]] | None = None,
    ) -> list[tuple[int, int, AcknowledgeType]]:
        """Check a whole ShareAcknowledge request; return (first, last, type) segments (and
        append each segment's ``(delay_ms, undelivered)`` to ``opts``)."""
        plan: list[tuple[int, int, AcknowledgeType]] = []
        prev_last: int | None = None
        for b in batches:
            first, last = b.first_offset, b.last_offset
            if first > last:
                raise InvalidRequestError(f"acknowledgement batch {first}..{last}: first > last")
            if prev_last is not None and first <= prev_last:
                raise InvalidRequestError(
                    f"acknowledgement batch {first}..{last} overlaps or precedes the previous "
                    f"batch ending at {prev_last}; batches must be ordered and non-overlapping"
                )
            prev_last = last
            if first < 0 or last >= self._end:
                raise InvalidRequestError(
                    f"acknowledgement batch {first}..{last} is outside the in-flight records "
                    f"{self._start}..{self._end - 1}"
                )
            types = b.acknowledge_types
            if len(types) != 1 and len(types) != last - first + 1:
                raise InvalidRequestError(
                    f"acknowledgement batch {first}..{last} has {len(types)} acknowledge types; "
                    f"expected 1 or {last - first + 1} (one per offset)"
                )
            if first < self._start:
                # Finished already (another member's delivery after this one's lock elapsed):
                # skipped, as Kafka 4.3's SharePartition skips offsets below its start offset.
                if last < self._start:
                    continue
                types = types if len(types) == 1 else types[self._start - first :]
                first = self._start
            try:
                acks = [AcknowledgeType(t) for t in types]
            except (ValueError, TypeError) as exc:
                raise InvalidRequestError(
                    f"acknowledgement batch {first}..{last}: unknown acknowledge type ({exc})"
                ) from None
            self._check_release_options(b, acks)
            segments = len(plan)
            if len(acks) == 1:
                plan.append((first, last, acks[0]))
            else:
                seg_start = first
                for k in range(1, len(acks) + 1):
                    if k == len(acks) or acks[k] is not acks[k - 1]:
                        plan.append((seg_start, first + k - 1, acks[k - 1]))
                        seg_start = first + k
            if opts is not None:
                opts.extend([(b.delay_ms, b.undelivered)] * (len(plan) - segments))
        # KIP-932 ShareAcknowledge INVALID_RECORD_STATE: only the member holding the acquisition
        # lock can acknowledge a record.
        runs = self._runs
        for first, last, _ in plan:
            i = self._index(first)
            while i < len(runs) and runs[i].first <= last:
                r = runs[i]
                if r.state is not _ACQUIRED or r.member != member_id:
                    lo, hi = max(r.first, first), min(r.last, last)
                    held = "Acquired by another member" if r.state is _ACQUIRED else r.state.name
                    raise InvalidRecordStateError(
                        f"records {lo}..{hi} are not Acquired by member {member_id!r} "
                        f"(they are {held}); the lock may have expired or the records were "
                        "acknowledged already"
                    )
                i += 1
        return plan

    def _check_release_options(self, b: AcknowledgementBatch, acks: list[AcknowledgeType]) -> None:
        """Refuse a delay or ``undelivered`` on anything but RELEASE, and a delay out of
        ``0..max_release_delay_ms`` (docs/concepts.md "Delayed redelivery")."""
        delay, undelivered = b.delay_ms, b.undelivered
        if not delay and not undelivered:
            return
        where = f"acknowledgement batch {b.first_offset}..{b.last_offset}"
        top = self._config.max_release_delay_ms
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise InvalidRequestError(
                f"{where}: release delay {delay!r} ms is not allowed: give 0..{top} ms "
                "(queueflow.redelivery.max.delay.ms)"
            )
        if delay > top:
            raise InvalidRequestError(
                f"{where}: release delay {delay} ms is above the maximum of {top} ms "
                "(queueflow.redelivery.max.delay.ms); release with a shorter delay"
            )
        other = sorted({a.name for a in acks if a is not _RELEASE})
        if other:
            what = "a delay" if delay else "undelivered"
            raise InvalidRequestError(
                f"{where}: {what} applies to RELEASE only, not to {', '.join(other)}; "
                "acknowledge those without it"
            )

    def stale_acknowledgements(
        self, member_id: str, batches: Sequence[AcknowledgementBatch]
    ) -> list[tuple[int, int]]:
        """The offsets of ``batches`` that ``member_id`` can no longer acknowledge: not Acquired
        by it (Available, Acknowledged, Archived or Acquired by another member), negative, or
        at/after the SPEO (offsets below the SPSO are skipped, not stale). Inclusive ranges in
        offset order, merged where adjacent.

        A refused request (see :meth:`acknowledge`) names these in its answer, so the member
        can send the rest of its outcomes again without them instead of losing all of them
        (queueflow's ``ShareFetchResponse.ack_stale``; KIP-932 itself only returns the error).
        Read-only; batches need not be ordered.
        """
        stale: list[tuple[int, int]] = []

        def add(lo: int, hi: int) -> None:
            if stale and stale[-1][1] + 1 >= lo:
                stale[-1] = (stale[-1][0], max(stale[-1][1], hi))
            else:
                stale.append((lo, hi))

        runs = self._runs
        for b in sorted(batches, key=lambda b: b.first_offset):
            first, last = b.first_offset, b.last_offset
            if first < 0:
                add(first, min(last, -1))
            first = max(first, self._start)  # below the SPSO: skipped, not stale (as Kafka)
            hi = min(last, self._end - 1)
            i = self._index(first) if first <= hi else len(runs)
            while i < len(runs) and runs[i].first <= hi:
                r = runs[i]
                if r.state is not _ACQUIRED or r.member != member_id:
                    add(max(r.first, first), min(r.last, hi))
                i += 1
            if last >= self._end:
                add(max(first, self._end), last)
        renews = [
            (b.first_offset, b.last_offset, AcknowledgeType.RENEW)
            for b in batches
            if AcknowledgeType.RENEW in b.acknowledge_types
        ]
        if not renews:
            return stale
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(stale + self._capped(renews)):
            if merged and merged[-1][1] + 1 >= lo:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        return merged

    def _ack_transform(self, ack: AcknowledgeType, archived: list[tuple[int, int]]) -> _Transform:
        if ack is _ACCEPT:
            return _accept
        if ack is _RELEASE:

            def release(r: _Run) -> tuple[RecordState, int, str | None, int | None]:
                new = self._release_transform(r)
                if new[0] is _ARCHIVED or new[2] == DEAD_LETTER_OWNER:
                    archived.append((r.first, r.last))
                return new

            return release
        # GAP: the offset holds no record (KIP-932 "unmaterialized record batch" gaps) ->
        # Archived. REJECT: "rejected by consumer as unprocessable" -> Archived (or the DLQ).
        return _archive if ack is _GAP else self._archive_target

    def _release_ack(
        self, now_ms: int, delay_ms: int, undelivered: bool, archived: list[tuple[int, int]]
    ) -> _Transform:
        """A member's RELEASE: its delivery given back (``undelivered``), Archived at the
        limit, held by :data:`DELAYED_OWNER` for ``delay_ms`` (0: the group's back-off
        policy), or Available."""
        cfg = self._config

        def release(r: _Run) -> tuple[RecordState, int, str | None, int | None]:
            if undelivered:  # never handed to a handler: that delivery doesn't count
                return (_AVAILABLE, max(r.count - 1, 0), None, None)
            new = self._release_transform(r)
            if new[0] is _ARCHIVED or new[2] == DEAD_LETTER_OWNER:
                archived.append((r.first, r.last))
                return new
            delay = delay_ms or backoff_ms(
                r.count,
                cfg.redelivery_backoff_ms,
                cfg.redelivery_backoff_multiplier,
                cfg.redelivery_backoff_max_ms,
            )
            if delay <= 0:
                return new
            until = now_ms + delay
            self._lock_group(until).ranges.append((r.first, r.last))
            return (_ACQUIRED, r.count, DELAYED_OWNER, until)

        return release

    def _lapse_transform(self, r: _Run) -> tuple[RecordState, int, str | None, int | None]:
        """A delivery that ended without an acknowledgement (lock expiry, member released):
        as a RELEASE, or with ``share.delivery.count.mode=attempts`` given back."""
        if self._config.delivery_count_mode == ATTEMPTS:
            return (_AVAILABLE, max(r.count - 1, 0), None, None)
        return self._release_transform(r)

    def _release_transform(self, r: _Run) -> tuple[RecordState, int, str | None, int | None]:
        # KIP-932 state diagram: a failed delivery attempt (released, or lock elapsed) goes back to
        # Available "if (delivery count < group.share.delivery.count.limit)", else Archived.
        if r.count >= self._config.delivery_count_limit:
            return self._archive_target(r)
        return (_AVAILABLE, r.count, None, None)

    def _archive_target(self, r: _Run) -> tuple[RecordState, int, str | None, int | None]:
        """Where a record being Archived goes: Archived, or with ``config.dead_letter`` held by
        :data:`~queueflow.engine.reserved.DEAD_LETTER_OWNER` until it is in the DLQ."""
        if self._config.dead_letter:
            self._lock_group(DEAD_LETTER_DEADLINE_MS)  # one group; it never elapses
            return (_ACQUIRED, r.count, DEAD_LETTER_OWNER, DEAD_LETTER_DEADLINE_MS)
        return (_ARCHIVED, r.count, None, None)

    # ----------------------------------------------------------------------------------------
    # Releases: member gone, lock elapsed (KIP-932 "Record delivery and acknowledgement")
    # ----------------------------------------------------------------------------------------

    def release_member(self, member_id: str, now_ms: int) -> int:
        """Release every record Acquired by ``member_id``, as if it had acknowledged ``RELEASE``.

        Used when a member leaves or is removed from the share group. Records go back to
        Available, or to Archived at the delivery count limit (with
        ``delivery_count_mode="attempts"``: Available, that delivery given back); then the SPSO
        advances.

        With ``config.release_by_lock_end`` the records stay Acquired until their own lock
        deadlines instead: :meth:`expire_locks` releases them, and the member may acknowledge
        them until then.

        Args:
            member_id: the member.
            now_ms: the current time in ms (unused; kept for the callers' symmetry).

        Returns:
            The number of records released (Available or Archived), or with
            ``release_by_lock_end`` the number it still holds.

        KIP-932 "Record delivery and acknowledgement"; "Client programming interface":
        ``close()`` "releases any remaining acquired records". Cost: O(runs).
        """
        if not self._n_acquired:
            return 0
        if self._config.release_by_lock_end:
            return self.held_by(member_id)
        targets = [
            (r.first, r.last) for r in self._runs if r.state is _ACQUIRED and r.member == member_id
        ]

        def transform(r: _Run) -> tuple[RecordState, int, str | None, int | None] | None:
            if r.state is _ACQUIRED and r.member == member_id:
                return self._lapse_transform(r)
            return None

        released = 0
        for first, last in targets:
            released += self._apply(first, last, transform)
        self._advance()
        return released

    def expire_locks(self, now_ms: int) -> int:
        """Release every Acquired record whose lock deadline is at or before ``now_ms``.

        Records go back to Available, or to Archived at the delivery count limit; then the SPSO
        advances. Cost: O(expired runs + log runs); O(1) when nothing has expired.

        Args:
            now_ms: the current time in ms.

        A lock that elapses at ``max_renewal_ms`` after its acquisition (the member RENEWed it
        as long as it may and never settled the record) counts as a RELEASE without handling
        by that member (see :meth:`acknowledge`); a member fenced for it is reported by
        :meth:`take_fences`.

        Returns:
            The number of records whose lock elapsed.

        KIP-932 "Record delivery and acknowledgement": "acquisition lock elapsed".
        """
        heap = self._heap
        expired = 0
        cap = self._config.max_renewal_ms
        # Member -> ranges whose lock ran out at the renewal cap, and those of them Archived.
        capped: dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
        while heap and heap[0] <= now_ms:
            deadline = heapq.heappop(heap)
            group = self._locks.get(deadline)
            if group is None:
                continue  # stale heap entry: every record with this deadline was settled

            def transform(
                r: _Run, d: int = deadline
            ) -> tuple[RecordState, int, str | None, int | None] | None:
                if r.state is not _ACQUIRED or r.deadline != d:
                    return None
                if r.member == DELAYED_OWNER:  # a delay ended: Available, no delivery counted
                    return (_AVAILABLE, r.count, None, None)
                new = self._lapse_transform(r)
                if r.acquired is not None and r.member and d >= r.acquired + cap:
                    held, archived = capped.setdefault(r.member, ([], []))
                    held.append((r.first, r.last))
                    if new[0] is _ARCHIVED or new[2] == DEAD_LETTER_OWNER:
                        archived.append((r.first, r.last))
                return new

            for first, last in list(group.ranges):
                first = max(first, self._start)
                last = min(last, self._end - 1)
                if first <= last:
                    expired += self._apply(first, last, transform)
            self._locks.pop(deadline, None)  # already gone when its count reached 0
        if expired:
            self._advance()
        for member, (held, archived) in capped.items():
            self._held_to_cap(member, held, archived, now_ms)
        return expired

    def _held_to_cap(
        self,
        member: str,
        held: list[tuple[int, int]],
        archived: list[tuple[int, int]],
        now_ms: int,
    ) -> None:
        """Count locks of ``member`` that ran out at the renewal cap as RELEASEs without
        handling; fence it when that makes it abusive (reported by :meth:`take_fences`)."""
        n = sum(last - first + 1 for first, last in held)
        abusive = self._tally(member, n, 0, now_ms)
        use = self._use.get(member)
        if use is None:
            return
        since = now_ms - 2 * self._config.release_abuse_window_ms
        _remember(use.releases, held, now_ms, since)
        _remember(use.archived, archived, now_ms, since)
        if abusive is not None:
            self._fences.append(self._fence(member, use, abusive[0], abusive[1], now_ms))

    def take_fences(self) -> list[MemberFence]:
        """Members fenced since the last call by :meth:`expire_locks` (a member that let locks
        run out at ``max_renewal_ms`` in bulk); :meth:`acknowledge` returns its own."""
        fences, self._fences = self._fences, []
        return fences

    # ----------------------------------------------------------------------------------------
    # Dead-letter topics (KIP-1191; docs/guide.md "Dead-letter topics")
    # ----------------------------------------------------------------------------------------

    def dead_letters(self) -> list[RunView]:
        """The runs held by :data:`~queueflow.engine.reserved.DEAD_LETTER_OWNER` (records to
        write to the group's dead-letter topic), in offset order; O(1) when there are none."""
        if not self._held.get(DEAD_LETTER_OWNER):
            return []
        return [
            RunView(r.first, r.last, r.state, r.count, r.member, r.deadline)
            for r in self._runs
            if r.state is _ACQUIRED and r.member == DEAD_LETTER_OWNER
        ]

    def archive_dead_letters(self, first: int, last: int) -> int:
        """Archive the records of ``first..last`` held by
        :data:`~queueflow.engine.reserved.DEAD_LETTER_OWNER` (they are in the dead-letter topic
        now), then advance the SPSO. Other offsets, and offsets outside SPSO..SPEO-1, are left
        alone. Returns the records Archived."""
        first, last = max(first, self._start), min(last, self._end - 1)
        if first > last or not self._held.get(DEAD_LETTER_OWNER):
            return 0

        def transform(r: _Run) -> tuple[RecordState, int, None, None] | None:
            if r.state is _ACQUIRED and r.member == DEAD_LETTER_OWNER:
                return (_ARCHIVED, r.count, None, None)
            return None

        n = self._apply(first, last, transform)
        self._advance()
        return n

    # ----------------------------------------------------------------------------------------
    # Admin reset (KIP-932 "Managing the SPSO and SPEO")
    # ----------------------------------------------------------------------------------------

    def reset_start_offset(self, offset: int) -> None:
        """Reset the SPSO to ``offset``, discarding all in-flight state and delivery counts.

        Afterwards SPSO = SPEO = ``offset``; the next :meth:`take_changes` is a full replacement
        (``ShareUpdate.reset=True``).

        Args:
            offset: the new SPSO (>= 0).

        Raises:
            InvalidRequestError: ``offset`` is negative, or a record is Acquired (the share group
                must be empty). Nothing changes.

        KIP-932 "Managing the SPSO and SPEO": resetting is for "an empty share group with no
        active members" and "discards all of the in-flight record state and delivery counts".
        """
        if offset < 0:
            raise InvalidRequestError(f"start offset must be >= 0, got {offset}")
        dead = self._held.get(DEAD_LETTER_OWNER, 0)
        if dead:
            raise InvalidRequestError(
                f"cannot reset the start offset: {dead} records are being written to the "
                "dead-letter topic (errors.deadletterqueue.topic.name); make the topic writable "
                "and wait until they are in it (see the leader's dead_letter_write_failed log)"
            )
        held = self._n_acquired - self.delayed_count  # delayed records are discarded too
        if held:
            raise InvalidRequestError(
                f"cannot reset the start offset: {held} records are Acquired by "
                "members; the share group must be empty (stop its consumers or wait for their "
                "locks to elapse)"
            )
        self._runs.clear()
        self._locks.clear()
        self._heap.clear()
        self._held.clear()
        self._n_acquired = 0
        self._dirty.clear()
        for use in self._use.values():  # those offsets mean other records from now on
            use.releases.clear()
            use.archived.clear()
        self._n_available = 0
        self._start = self._end = self._hint = self._holes_read_to = offset
        self._holes.clear()  # read again from the new SPSO
        self._reset_pending = True
        if self._key_order is not None:  # the in-flight records (and what they parked) are gone
            self._key_order.clear_parked()
            self._key_order.restart(offset)

    # ----------------------------------------------------------------------------------------
    # Durability (KIP-932 "Managing durable share-partition state")
    # ----------------------------------------------------------------------------------------

    def snapshot(self) -> tuple[int, tuple[StateBatch, ...]]:
        """The durable form of the whole state: ``(SPSO, batches)``.

        Batches hold Acknowledged and Archived runs, Available runs with a non-zero delivery
        count, and Acquired runs with their lock (owner and deadline), so a new leader keeps
        the locks its predecessor granted (queueflow's extension: KIP-932 does not persist
        Acquired). Available records with count 0 are omitted. Adjacent equal batches are
        merged.

        KIP-932 "Managing durable share-partition state".
        """
        return self._start, self._persisted(self._start, self._end - 1)

    def take_changes(self) -> ShareUpdate | None:
        """The durable change since the previous call, or None if nothing changed.

        Returns:
            ``ShareUpdate(start_offset=SPSO, batches=...)`` whose batches are the durable form
            (as in :meth:`snapshot`) of every in-flight offset changed since the previous call.
            After :meth:`reset_start_offset` it is a full replacement with ``reset=True``.
            Applying the updates in order to the previous durable state (see
            ``queueflow.engine.state.replay``) gives :meth:`snapshot`.

        KIP-932 "Managing durable share-partition state" (a ShareUpdate).
        """
        if self._reset_pending:
            update = ShareUpdate(self._start, self.snapshot()[1], reset=True)
        elif not self._dirty and self._start == self._taken_start:
            return None
        else:
            batches: list[StateBatch] = []
            for first, last in self._merged_dirty():
                first = max(first, self._start)
                last = min(last, self._end - 1)
                if first <= last:
                    batches.extend(self._persisted(first, last))
            update = ShareUpdate(self._start, merge_batches(batches))
        self._dirty.clear()
        self._taken_start = self._start
        self._reset_pending = False
        return update

    @classmethod
    def restore(
        cls, config: SharePartitionConfig, start_offset: int, batches: Iterable[StateBatch]
    ) -> SharePartition:
        """Rebuild a share-partition from durable state, e.g. on a new leader.

        Args:
            config: limits.
            start_offset: the durable SPSO (>= 0).
            batches: ordered, non-overlapping durable batches (states Available, Acknowledged,
                Archived, or Acquired with a lock); parts below ``start_offset`` are ignored.
                Offsets between batches are Available with delivery count 0.

        Returns:
            A share-partition with SPSO = ``start_offset`` (advanced past any Acknowledged or
            Archived prefix) and SPEO = max(``start_offset``, last batch end + 1). Acquired
            batches come back Acquired by their member until their lock deadline, even one
            already past (the next :meth:`expire_locks` releases it), so a takeover redelivers
            nothing that is still locked. There are no pending changes (apart from an SPSO
            advanced past a finished prefix).

        Raises:
            CorruptStateError: a batch is unordered, overlapping, has a negative delivery count,
                or is Acquired without a lock (or in another state with one).
            InvalidRequestError: ``start_offset`` is negative.

        KIP-932 "Managing durable share-partition state" (which persists no Acquired state;
        queueflow persists the lock, see :meth:`snapshot`).
        """
        sp = cls(config, start_offset)
        runs = sp._runs
        end = start_offset
        prev_last = -1
        for b in batches:
            if b.first_offset > b.last_offset or b.first_offset <= prev_last:
                raise CorruptStateError(
                    f"cannot restore batch {b.first_offset}..{b.last_offset}: batches must be "
                    "ordered and non-overlapping with first <= last"
                )
            locked = b.state is _ACQUIRED
            if (
                (b.state not in PERSISTED_STATES and not locked)
                or b.delivery_count < 0
                or locked != (bool(b.member_id) and b.lock_deadline_ms is not None)
            ):
                raise CorruptStateError(
                    f"cannot restore batch {b.first_offset}..{b.last_offset}: state "
                    f"{b.state!r} / delivery count {b.delivery_count} / lock "
                    f"{b.member_id!r} until {b.lock_deadline_ms!r} is not a durable state"
                )
            prev_last = b.last_offset
            if b.last_offset < start_offset:
                continue
            first = max(b.first_offset, start_offset)
            if first > end:  # offsets between batches are Available, never delivered
                runs.append(_Run(end, first - 1, _AVAILABLE, 0, None, None))
            state = RecordState(b.state)
            member_id, deadline_ms = b.member_id, b.lock_deadline_ms
            if state is _AVAILABLE and b.delivery_count >= config.delivery_count_limit:
                # Acquired at the limit when the old leader stopped (the bump is persisted at
                # acquisition): that delivery attempt ended without an acknowledgement, exactly
                # like a lock expiry, so the record is Archived rather than delivered again
                # (or held for the dead-letter topic first).
                state = RecordState.ARCHIVED
                if config.dead_letter:
                    state, member_id, deadline_ms = (
                        _ACQUIRED,
                        DEAD_LETTER_OWNER,
                        DEAD_LETTER_DEADLINE_MS,
                    )
                    locked = True
                sp._mark_dirty(first, b.last_offset)
                sp._archived_log.append(
                    ArchivedRange(first, b.last_offset, b.delivery_count, "delivery_limit")
                )
            if locked:
                assert member_id is not None and deadline_ms is not None
                member, deadline = sys.intern(member_id), deadline_ms
                sp._lock_group(deadline).ranges.append((first, b.last_offset))
                # The acquisition time isn't durable: the RENEW cap counts from the restored
                # lock's start (one lock duration before its deadline).
                acquired = (
                    None if is_reserved(member) else deadline - config.record_lock_duration_ms
                )
                runs.append(
                    _Run(first, b.last_offset, state, b.delivery_count, member, deadline, acquired)
                )
            else:
                runs.append(_Run(first, b.last_offset, state, b.delivery_count, None, None))
            end = b.last_offset + 1
        sp._end = end
        for r in runs:
            if r.state is _AVAILABLE:
                sp._n_available += r.last - r.first + 1
            elif r.state is _ACQUIRED:
                assert r.deadline is not None
                assert r.member is not None
                sp._n_acquired += r.last - r.first + 1
                sp._locks[r.deadline].count += r.last - r.first + 1
                sp._held[r.member] = sp._held.get(r.member, 0) + r.last - r.first + 1
        sp._merge_window(0, len(runs) - 1)
        archived_at_limit = bool(sp._dirty)
        sp._advance()
        if not archived_at_limit:
            sp._dirty.clear()
        return sp

    # ----------------------------------------------------------------------------------------
    # Internals
    # ----------------------------------------------------------------------------------------

    def _index(self, offset: int) -> int:
        """Index of the run holding ``offset`` (SPSO <= offset < SPEO)."""
        return bisect_right(self._runs, offset, key=_run_first) - 1

    def _split_at(self, offset: int) -> int:
        """Make ``offset`` the first offset of a run; return that run's index.

        ``offset`` must be in SPSO..SPEO; for the SPEO the result is ``len(runs)``.
        """
        runs = self._runs
        if offset >= self._end:
            return len(runs)
        i = self._index(offset)
        r = runs[i]
        if r.first == offset:
            return i
        right = _Run(offset, r.last, r.state, r.count, r.member, r.deadline, r.acquired)
        if right.last == offset:
            right.last = offset  # share one int object for single-record runs
        r.last = offset - 1
        if r.last == r.first:
            r.last = r.first
        runs.insert(i + 1, right)
        return i + 1

    def _merge_window(self, lo: int, hi: int) -> None:
        """Merge adjacent equal runs among indices ``lo..hi`` (inclusive, clamped)."""
        runs = self._runs
        lo = max(lo, 0)
        hi = min(hi, len(runs) - 1)
        if hi <= lo:
            return
        merged: list[_Run] = [runs[lo]]
        for k in range(lo + 1, hi + 1):
            r = runs[k]
            p = merged[-1]
            if _same(p, r):
                p.last = r.last
            else:
                merged.append(r)
        if len(merged) != hi - lo + 1:
            runs[lo : hi + 1] = merged

    def _apply(self, first: int, last: int, transform: _Transform, persisted: bool = True) -> int:
        """Apply ``transform`` to every run in ``first..last``; return the records changed.
        ``persisted=False``: the change doesn't show in durable state (no delta for it)."""
        runs = self._runs
        i = self._split_at(first)
        j = self._split_at(last + 1)
        changed = 0
        for k in range(i, j):
            r = runs[k]
            new = transform(r)
            if new is not None:
                self._retag(r, *new)
                changed += r.last - r.first + 1
        if changed and persisted:
            self._mark_dirty(first, last)
        self._merge_window(i - 1, j)
        return changed

    def _retag(
        self,
        r: _Run,
        state: RecordState,
        count: int,
        member: str | None,
        deadline: int | None,
    ) -> None:
        """Change one run, keeping the per-state counters and lock groups in step."""
        n = r.last - r.first + 1
        # The new state first: a RENEW to an unchanged deadline keeps the run in its lock
        # group, which must not be emptied (and dropped) on the way.
        if state is _ACQUIRED:
            assert deadline is not None and member is not None
            self._n_acquired += n
            self._locks[deadline].count += n
            self._held[member] = self._held.get(member, 0) + n
        elif state is _AVAILABLE:
            self._n_available += n
            if r.first < self._hint:
                self._hint = r.first
        if r.state is _ACQUIRED:
            self._n_acquired -= n
            assert r.deadline is not None and r.member is not None
            left = self._held[r.member] - n
            if left:
                self._held[r.member] = left
            else:
                del self._held[r.member]
            group = self._locks[r.deadline]
            group.count -= n
            if group.count == 0:
                del self._locks[r.deadline]
        elif r.state is _AVAILABLE:
            self._n_available -= n
        if state is _ARCHIVED and r.state is not _ARCHIVED:
            self._archived_total += n
            if self._reason != "gap":  # a GAP offset holds no record
                self._archived_log.append(ArchivedRange(r.first, r.last, count, self._reason))
        if self._key_order is not None:  # a REJECTed or dead-lettered record parks its key
            if state is _ARCHIVED and r.state is _ACQUIRED:
                reason = "" if self._reason == "gap" else self._reason
                self._key_order.on_archived(r.first, r.last, reason)
            elif state is _AVAILABLE and r.state is _ARCHIVED:
                self._key_order.on_revived(r.first, r.last)
        r.state = state
        r.count = count
        r.member = member
        r.deadline = deadline
        if state is not _ACQUIRED or (member is not None and is_reserved(member)):
            r.acquired = None

    def _lock_group(self, deadline: int) -> _LockGroup:
        group = self._locks.get(deadline)
        if group is None:
            group = self._locks[deadline] = _LockGroup()
            heapq.heappush(self._heap, deadline)
            if len(self._heap) > 2 * len(self._locks) + 64:  # drop stale heap entries
                self._heap = list(self._locks)
                heapq.heapify(self._heap)
        return group

    def _drop_if_unused(self, deadline: int) -> None:
        group = self._locks.get(deadline)
        if group is not None and group.count == 0:
            del self._locks[deadline]

    def _advance(self) -> None:
        """Move the SPSO past the prefix of Acknowledged and Archived records.

        KIP-932 state diagram: Acknowledged -> Archived when "SPSO moves past record"; records
        before the SPSO are no longer in flight.
        """
        runs = self._runs
        k = 0
        while k < len(runs) and (runs[k].state is _ACKNOWLEDGED or runs[k].state is _ARCHIVED):
            k += 1
        if k:
            del runs[:k]
            self._start = runs[0].first if runs else self._end

    def _mark_dirty(self, first: int, last: int) -> None:
        dirty = self._dirty
        if dirty:
            pf, pl = dirty[-1]
            if first <= pl + 1 and last >= pf - 1:
                dirty[-1] = (min(pf, first), max(pl, last))
                return
        dirty.append((first, last))
        if len(dirty) > 4096:
            self._dirty = self._merged_dirty()

    def _merged_dirty(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for first, last in sorted(self._dirty):
            if out and first <= out[-1][1] + 1:
                if last > out[-1][1]:
                    out[-1] = (out[-1][0], last)
            else:
                out.append((first, last))
        return out

    def _persisted(self, first: int, last: int) -> tuple[StateBatch, ...]:
        """Durable batches for the in-flight offsets ``first..last`` (see :meth:`snapshot`)."""
        runs = self._runs
        if first > last or not runs:
            return ()
        out: list[StateBatch] = []
        i = self._index(first)
        while i < len(runs) and runs[i].first <= last:
            r = runs[i]
            i += 1
            if r.state is _AVAILABLE and r.count == 0:
                continue
            out.append(
                StateBatch(
                    max(r.first, first), min(r.last, last), r.state, r.count, r.member, r.deadline
                )
            )
        return merge_batches(out)

    def __repr__(self) -> str:
        return (
            f"SharePartition(spso={self._start}, speo={self._end}, runs={len(self._runs)}, "
            f"acquired={self._n_acquired}, available={self._n_available})"
        )
