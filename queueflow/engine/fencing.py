"""Leader fencing: a leader that lost its partition neither writes state nor hands out records.

KIP-932 fences a stale share-partition leader at the share coordinator: its
``WriteShareGroupState`` carries an old state epoch and is refused with ``FENCED_STATE_EPOCH``.
queueflow's state lives in the leader's own Faust table, so the arbiter is Kafka instead:

* **Leader epoch.** A worker leads request partition ``p`` under the Faust consumer-group
  generation in which it was assigned ``p``. Kafka's group coordinator issues generations, so
  a successor always has a higher one.
* **Fence in the log.** Once Faust has assigned ``p``, recovered the tables and resumed the
  streams, the new leader appends ``Fence(leader_epoch)`` to request partition ``p``. Every
  request, for every share-partition of ``p``, goes through that one ordered log, so the fence
  splits it: requests before it belong to the old leader, requests after it to the new one.
  A leader that reads its *own* fence becomes live (until then it applies acknowledgements but
  acquires nothing). A leader that reads a *newer* fence has been superseded. It steps down:
  it fences its share-partitions, so every later write is refused with
  ``FENCED_STATE_EPOCH``, and it serves nothing more from ``p``.
* **Stall guard.** A process that was paused (SIGSTOP, a VM freeze, a blocked event loop) for
  longer than the Faust session timeout has probably lost its partitions, possibly before it
  could read a fence. When it wakes it steps down from every partition at once. If, one stall
  limit later, Faust has neither rebalanced nor changed its generation, the worker kept its
  membership (Faust heartbeats from its own thread, so a blocked loop alone doesn't lose it):
  it sends a new fence and serves again once it reads it.
* **Membership lease (direct path).** Requests on the direct path (see
  :mod:`queueflow.server.endpoint`) never pass through the request log, so a newer fence
  can't split them. A worker whose Faust membership lapses while its event loop keeps running
  (its heartbeats fail: a partition from the group coordinator, a stuck consumer thread)
  would go on answering them. The broker keeps a member for the session timeout after the
  last heartbeat it accepted, so a heartbeat *sent* at t and answered OK proves membership
  until t + session timeout. :class:`MembershipLease` tracks that, and the direct path serves
  only within it, minus a margin, and never parks a request past its end.
* **Recovery watch.** A worker must restore its tables before it can send its fence. Faust's
  table recovery has been seen to hang after the worker was frozen: it waits for changelog
  records that never come, so the worker keeps its partitions and serves nothing, for good.
  :class:`RecoveryWatch` notices recovery making no progress, and the worker stops, so that
  Faust moves its partitions to another.

A superseded leader's writes from before the fence carry its old state epoch, and delta keys
include the state epoch (:func:`~queueflow.protocol.state_codec.delta_key`), so replay never
mixes two leaders' writes.

This module is pure: callers pass monotonic times in ms.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from queueflow.errors import FencedStateEpochError

__all__ = ["FenceOutcome", "LeaderFencing", "Leadership", "MembershipLease", "RecoveryWatch"]


class FenceOutcome(enum.Enum):
    """What reading a fence means for the leader that read it."""

    #: Our own fence: every later request in the partition is ours to serve.
    LIVE = "live"
    #: A newer leader's fence: step down from the partition.
    SUPERSEDED = "superseded"
    #: An older leader's fence, or one for a partition we don't own: nothing to do.
    IGNORED = "ignored"


@dataclass(slots=True)
class Leadership:
    """This worker's leadership of one request partition.

    Attributes:
        epoch: the leader epoch (Faust consumer generation) it was assigned under.
        live: its own fence has been read back, so requests after it are its to serve.
        fenced: why it stepped down, or ``None``.
        stalled_at_ms: when the stall guard fenced it (monotonic ms), or ``None``.
        fence_sent_ms: when its own fence was last sent (monotonic ms), or ``None``.
    """

    epoch: int
    live: bool = False
    fenced: str | None = None
    stalled_at_ms: int | None = None
    fence_sent_ms: int | None = None


class LeaderFencing:
    """Fencing state of the request partitions of one leader worker.

    Args:
        stall_limit_ms: a pause longer than this (ms) means the worker may have lost every
            partition: the Faust session timeout plus one heartbeat interval.
    """

    def __init__(self, stall_limit_ms: int) -> None:
        if stall_limit_ms <= 0:
            raise ValueError(f"stall_limit_ms must be > 0, got {stall_limit_ms}")
        self.stall_limit_ms = stall_limit_ms
        self.partitions: dict[int, Leadership] = {}
        self._alive_ms: int | None = None

    def assign(self, partitions: set[int], epoch: int) -> None:
        """Lead ``partitions`` under leader epoch ``epoch``; not live until the own fence."""
        for p in partitions:
            self.partitions[p] = Leadership(epoch)

    def revoke(self, partitions: set[int]) -> None:
        """Stop leading ``partitions`` (a Faust rebalance took them)."""
        for p in partitions:
            self.partitions.pop(p, None)

    def on_fence(self, partition: int, epoch: int) -> FenceOutcome:
        """Read ``Fence(epoch)`` from ``partition``'s request log; see :class:`FenceOutcome`."""
        lead = self.partitions.get(partition)
        if lead is None or lead.fenced is not None or epoch < lead.epoch:
            return FenceOutcome.IGNORED
        if epoch == lead.epoch:
            if lead.live:
                return FenceOutcome.IGNORED  # a resent copy
            lead.live = True
            return FenceOutcome.LIVE
        lead.fenced = (
            f"partition {partition} was taken over by leader epoch {epoch}; "
            f"this worker led it under epoch {lead.epoch}"
        )
        lead.live = False
        return FenceOutcome.SUPERSEDED

    def fences_due(self, now_ms: int, resend_after_ms: int) -> list[int]:
        """Partitions whose own fence should be sent now, marked sent at ``now_ms``: those not
        live yet whose fence was never sent, or went out more than ``resend_after_ms`` ago and
        wasn't read back (Faust drops what it fetched while a rebalance was under way, fences
        among them). Call it only while the worker is not rebalancing.
        """
        due = [
            p
            for p, lead in self.partitions.items()
            if not lead.live
            and lead.fenced is None
            and (lead.fence_sent_ms is None or now_ms - lead.fence_sent_ms > resend_after_ms)
        ]
        for p in due:
            self.partitions[p].fence_sent_ms = now_ms
        return due

    def is_live(self, partition: int) -> bool:
        """True when this worker may hand out records of ``partition``."""
        lead = self.partitions.get(partition)
        return lead is not None and lead.live and lead.fenced is None

    def check(self, partition: int) -> None:
        """Raise unless this worker still leads ``partition`` (live or not yet live).

        Raises:
            FencedStateEpochError: the worker stepped down from ``partition`` or doesn't own it.
        """
        lead = self.partitions.get(partition)
        if lead is None:
            raise FencedStateEpochError(f"this worker does not lead partition {partition}")
        if lead.fenced is not None:
            raise FencedStateEpochError(lead.fenced)

    def alive(self, now_ms: int) -> list[int]:
        """Record that the event loop ran at ``now_ms`` (monotonic).

        Returns:
            The partitions this call fenced: all those still led, when the gap since the
            previous call exceeds the stall limit; otherwise none.
        """
        previous, self._alive_ms = self._alive_ms, now_ms
        if previous is None or now_ms - previous <= self.stall_limit_ms:
            return []
        stalled = [p for p, lead in self.partitions.items() if lead.fenced is None]
        for p in stalled:
            lead = self.partitions[p]
            lead.live = False
            lead.stalled_at_ms = now_ms
            lead.fenced = (
                f"this worker was stalled for {now_ms - previous} ms, longer than the "
                f"{self.stall_limit_ms} ms after which Faust's group coordinator gives its "
                f"partitions to another worker (leader epoch {lead.epoch})"
            )
        return stalled

    def resume_after_stall(self, now_ms: int, epoch: int, rebalancing: bool) -> list[int]:
        """Take back partitions the stall guard fenced, if the membership survived the stall.

        Args:
            now_ms: monotonic time in ms.
            epoch: the worker's current Faust consumer generation.
            rebalancing: whether Faust is rebalancing now.

        Returns:
            Partitions taken back (not yet live: the caller sends a new fence for each), when
            a stall limit has passed since the stall with no rebalance and the same generation.
        """
        if rebalancing:
            return []
        resumed = []
        for p, lead in self.partitions.items():
            if (
                lead.stalled_at_ms is not None
                and now_ms - lead.stalled_at_ms > self.stall_limit_ms
                and lead.epoch == epoch
            ):
                lead.fenced = lead.stalled_at_ms = lead.fence_sent_ms = None
                resumed.append(p)
        return resumed


class MembershipLease:
    """How long this worker's Faust group membership is certain to last (the direct path's
    fence; see the module docstring).

    Args:
        session_timeout_ms: the Faust consumer-group session timeout (ms).
        margin_ms: served requests end this long (ms) before the membership could lapse
            (one heartbeat interval covers request latency and the broker's processing).

    Raises:
        ValueError: ``margin_ms`` is negative or not below ``session_timeout_ms``.
    """

    def __init__(self, session_timeout_ms: int, margin_ms: int) -> None:
        if not 0 <= margin_ms < session_timeout_ms:
            raise ValueError(
                f"margin_ms must be in [0, session_timeout_ms={session_timeout_ms}), "
                f"got {margin_ms}"
            )
        self.session_timeout_ms = session_timeout_ms
        self.margin_ms = margin_ms
        self._proof: tuple[int, int] | None = None  # (generation, heartbeat sent at ms)

    def heartbeat_ok(self, generation: int, sent_ms: int) -> None:
        """A heartbeat of ``generation`` sent at monotonic ``sent_ms`` was answered OK."""
        if self._proof is None or self._proof < (generation, sent_ms):
            self._proof = (generation, sent_ms)

    def reset(self) -> None:
        """Forget every proof (a rebalance began; the new generation must prove itself)."""
        self._proof = None

    def remaining_ms(self, generation: int, now_ms: int) -> int:
        """How long (ms, ``<= 0`` when none) requests may still be served at ``generation``:
        until the newest OK heartbeat of that generation's send time plus the session
        timeout, minus the margin."""
        if self._proof is None or self._proof[0] != generation:
            return 0
        return self._proof[1] + self.session_timeout_ms - self.margin_ms - now_ms


class RecoveryWatch:
    """Tells when the host's table recovery has made no progress for ``limit_ms``.

    Args:
        limit_ms: how long (ms) recovery may go without restoring a record (0: never stalled;
            ``queueflow.leader.recovery.stall.ms``).
    """

    def __init__(self, limit_ms: int) -> None:
        if limit_ms < 0:
            raise ValueError(f"limit_ms must be >= 0, got {limit_ms}")
        self.limit_ms = limit_ms
        self._since: int | None = None  # when the remaining count last changed (ms)
        self._remaining: int | None = None

    def check(self, in_recovery: bool, remaining: int, now_ms: int) -> int | None:
        """Feed one observation: whether recovery runs and how many changelog records it has
        left. Returns how long (ms) it has been stuck at ``remaining`` once that reaches the
        limit, else ``None``."""
        if not in_recovery or not self.limit_ms:
            self._since = self._remaining = None
            return None
        if self._since is None or remaining != self._remaining:
            self._since, self._remaining = now_ms, remaining
            return None
        stalled = now_ms - self._since
        return stalled if stalled >= self.limit_ms else None
