"""What a share agent runs and how: the handler types and :class:`ShareAgentOptions`.

The options of ``@app.share_agent`` (:meth:`queueflow.App.share_agent`,
:meth:`queueflow.faust_app.ShareGroups.share_agent`) and of :class:`~queueflow.ShareAgent` are
this one dataclass, checked here and nowhere else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from queueflow.errors import ConfigurationError
from queueflow.member.key_ordering import check_ordering
from queueflow.settings import ShareGroupSettings
from queueflow.structs import ShareRecord

__all__ = [
    "PROCESSING_GUARANTEES",
    "BatchHandler",
    "Decoder",
    "GeneratorHandler",
    "Handler",
    "RecordHandler",
    "ShareAgentOptions",
]

#: ``async def handler(record) -> ACCEPT | RELEASE | REJECT | None``.
RecordHandler = Callable[[ShareRecord], Awaitable[Any]]
#: ``async def handler(records) -> Sequence[ACCEPT | RELEASE | REJECT | None]`` (one per record,
#: in order) or one ``ACCEPT | RELEASE | REJECT | None`` for the whole batch (``batch=True``).
BatchHandler = Callable[[list[ShareRecord]], Awaitable[Any]]
#: ``async def handler(record): yield result ...; [yield outcome]``: results alongside the
#: outcome (:mod:`queueflow.member.agent.outputs`).
GeneratorHandler = Callable[[ShareRecord], AsyncIterator[Any]]
#: What a share agent runs: a :data:`RecordHandler` or :data:`GeneratorHandler`, or a
#: :data:`BatchHandler` with ``batch=True``.
Handler = RecordHandler | GeneratorHandler | BatchHandler
#: The values of ``processing_guarantee=`` (and of ``queueflow.processing.guarantee``).
PROCESSING_GUARANTEES = ("at_least_once", "exactly_once")
#: Replaces ``record.value`` (and ``record.key``) by their decoded form; raises if it can't.
Decoder = Callable[[ShareRecord], None]


@dataclass(frozen=True, slots=True)
class ShareAgentOptions:
    """How a share agent runs its handler (the keyword arguments of ``@app.share_agent``).

    Attributes:
        concurrency: handler tasks in this process (concurrent handler calls: with
            ``batch=True``, batches handled at once); >= 1.
        name: the agent's name (``None``: the handler's qualified name, :meth:`agent_name`).
        lock_duration_ms: this member's acquisition lock duration (ms), bounded by
            ``group.share.min/max.record.lock.duration.ms`` (:meth:`check_lock_duration`);
            ``None`` uses the group's.
        batch: call the handler with a list of records (the records of one ShareFetch)
            instead of once per record.
        batch_size: with ``batch=True``, the most records per handler call (``None``: the
            records of one ShareFetch, at most ``max.poll.records``); >= 1.
        handler_timeout_ms: cancel a handler call (and RELEASE its records) this many ms after
            it started; ``None``: only when its records' acquisition lock is about to expire.
            When set and the group allows RENEW (``share.renew.acknowledge.enable``), the
            records' locks are renewed (KIP-1222) while the call runs, up to this timeout.
        sink: where the handler's plain results (and ``Send(to=None)``) go: topic names, Faust
            topics or Faust agents (one, or a list); published before the ACCEPT is recorded
            (docs/guide.md "Producing results").
        dead_letter: the topic of ``DeadLetter`` items without ``to=``; with it, a REJECT
            without a ``DeadLetter`` publishes a copy of the record there (its raw key, value
            and headers plus ``queueflow.dead_letter.*`` headers).
        processing_guarantee: ``"at_least_once"`` or ``"exactly_once"`` (results and the
            acknowledgement in one Kafka transaction); ``None``: the app's
            ``queueflow.processing.guarantee``.
        ordering: ``"key"``: key-ordered sharing (records of one key handled one at a time,
            in offset order, across all members; docs/concepts.md "Key-ordered sharing"): the
            app's default group config ``share.ordering=key`` for the group, and the agent
            refuses to start in a group that is not key-ordered. ``"none"`` (default): as the
            group is configured.
        lazy_records: with ``batch=True``, the records a leader carried are lazy views
            (:mod:`queueflow.member.lazy_records`: decoded when the handler first touches one;
            docs/performance.md "Lazy record views").

    Raises:
        ConfigurationError: concurrency < 1, batch_size < 1 or set without ``batch=True``,
            lazy_records without ``batch=True``,
            handler_timeout_ms < 1, or an unknown processing_guarantee (when built); a lock
            duration out of range (:meth:`check_lock_duration`).
    """

    concurrency: int = 1
    name: str | None = None
    lock_duration_ms: int | None = None
    batch: bool = False
    batch_size: int | None = None
    handler_timeout_ms: int | None = None
    sink: Sequence[Any] = ()
    dead_letter: Any = None
    processing_guarantee: str | None = None
    ordering: str = "none"
    lazy_records: bool = False

    def __post_init__(self) -> None:
        check_ordering(self.ordering)
        sink = self.sink
        if sink is None:
            sink = ()
        elif not isinstance(sink, (list, tuple)):
            sink = (sink,)  # one destination
        object.__setattr__(self, "sink", tuple(sink))
        guarantee = self.processing_guarantee
        if guarantee is not None and guarantee not in PROCESSING_GUARANTEES:
            raise ConfigurationError(
                f"share_agent processing_guarantee={guarantee!r}; allowed: "
                f"{', '.join(map(repr, PROCESSING_GUARANTEES))}, or None for the app's "
                "queueflow.processing.guarantee"
            )
        timeout = self.handler_timeout_ms
        if timeout is not None and timeout < 1:
            raise ConfigurationError(
                f"share_agent handler_timeout_ms={timeout}; must be >= 1 (ms), or "
                "None to bound handler calls by their records' acquisition locks only"
            )
        if self.concurrency < 1:
            raise ConfigurationError(f"share_agent concurrency={self.concurrency}; must be >= 1")
        if self.lazy_records and not self.batch:
            raise ConfigurationError(
                "share_agent lazy_records=True needs batch=True (a batch handler): a record "
                "handler's record is decoded anyway"
            )
        if self.batch_size is not None and not self.batch:
            raise ConfigurationError(
                f"share_agent batch_size={self.batch_size} needs batch=True (a batch handler)"
            )
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigurationError(f"share_agent batch_size={self.batch_size}; must be >= 1")

    def check_lock_duration(self, settings: ShareGroupSettings) -> None:
        """Check :attr:`lock_duration_ms` against the broker-level bounds of ``settings``.

        Raises:
            ConfigurationError: it is below ``group.share.min.record.lock.duration.ms`` or
                above ``group.share.max.record.lock.duration.ms``.
        """
        low, high = settings.min_record_lock_duration_ms, settings.max_record_lock_duration_ms
        lock = self.lock_duration_ms
        if lock is not None and not low <= lock <= high:
            raise ConfigurationError(
                f"share_agent lock_duration_ms={lock} is out of range; allowed "
                f"[{low}..{high}] (group.share.min.record.lock.duration.ms .. "
                "group.share.max.record.lock.duration.ms)"
            )

    def agent_name(self, handler: Handler) -> str:
        """:attr:`name`, or the handler's qualified name when it is ``None``."""
        return self.name or f"{handler.__module__}.{handler.__qualname__}"
