"""Junk on a leader's or coordinator's topic dropped after a look at its first bytes.

Anyone who may write an internal topic can flood it (docs/operations.md "Junk floods, quotas
and ACLs"); what a server does per junk record bounds how fast it drains a flood. So the first
thing it does with a record is :meth:`JunkGate.is_junk`: the pure check of
:mod:`queueflow.protocol.prefilter`, then a counter and a rate-limited log line, with no lock,
no decode and no await.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from queueflow.logging import JunkDrops
from queueflow.protocol.prefilter import request_prefilter
from queueflow.protocol.roles import ControlAuth
from queueflow.server.context import ServerContext
from queueflow.server.transport import monotonic_ms

__all__ = ["JunkGate", "Record"]


class Record(Protocol):
    """A fetched record (aiokafka's ``ConsumerRecord``): only its value is looked at."""

    @property
    def value(self) -> bytes | None: ...


_R = TypeVar("_R", bound=Record)


class JunkGate:
    """Drops, counts and logs (rate-limited) the junk of one server topic.

    Args:
        ctx: the server context (clock, metrics).
        auth: the receiver's auth (signed envelopes only under ``queueflow.auth.mode=hmac``).
        receiver: the metric's ``receiver`` label: ``leader`` or ``coordinator``.
        topic: the topic read (in the log line).
        log: the receiver's structlog logger (event ``control_message_dropped``).
    """

    def __init__(
        self, ctx: ServerContext, auth: ControlAuth, receiver: str, topic: str, log: Any
    ) -> None:
        self.topic = topic
        self.prefilter = request_prefilter(auth.enabled)
        self.drops = JunkDrops(
            log,
            "control_message_dropped",
            lambda: monotonic_ms(ctx.clock),
            ctx.metrics.control_messages_dropped,
            receiver,
        )

    def is_junk(self, partition: int, value: bytes | None) -> bool:
        """True if ``value`` (a record of ``partition``) is junk by its first bytes: then it
        was counted and logged (rate-limited) here and needs nothing else."""
        reason = self.prefilter.reject(value)
        if reason is None:
            return False
        self.drops.drop(reason, topic=self.topic, partition=partition)
        return True

    def keep(self, partition: int, records: Sequence[_R]) -> list[_R]:
        """The records of a fetched batch of ``partition`` that are not junk, in order; the
        junk is counted, and logged once per reason per batch at most (rate-limited, with
        ``records=n``). For the host's consumer, before records become stream events."""
        reject = self.prefilter.reject
        kept: list[_R] = []
        dropped: Counter[str] | None = None
        for record in records:
            reason = reject(record.value)
            if reason is None:
                kept.append(record)
            else:
                if dropped is None:
                    dropped = Counter()
                dropped[reason] += 1
        if dropped:
            for reason, count in dropped.items():
                self.drops.drop(reason, count, topic=self.topic, partition=partition)
        return kept
