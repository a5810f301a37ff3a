"""Fencing of the roles a worker holds by owning a partition: share-partition leaders (a request
partition) and the share-group coordinator (a coordinator partition). A worker that lost its
partition neither writes state nor answers for it.

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

The coordinator is fenced by the same rules (:class:`PartitionFencing` with
``role="coordinator"``): its *coordinator epoch* is the Faust generation in which it was assigned
the coordinator partition, it appends ``Fence(epoch)`` to that partition of the coordinator topic
and steps down when it reads a newer one, the stall guard applies, and it serves only within its
:class:`MembershipLease` (a coordinator's answers, tickets and releases are all outputs of the
stream path, so the lease gates them too). Its tickets, ReleaseMember and ResetSharePartition
messages and heartbeat answers carry the coordinator epoch; leaders and members keep the newest
coordinator epoch they have seen per share group in :class:`CoordinatorEpochs` and refuse what an
older coordinator sends.

This module is pure: callers pass monotonic times in ms.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from queueflow.errors import FencedStateEpochError, IllegalTransitionError

__all__ = [
    "LEADERSHIP_TRANSITIONS",
    "CoordinatorEpochs",
    "FenceOutcome",
    "IllegalTransitionError",
    "LeaderFencing",
    "Leadership",
    "LeadershipState",
    "LeaseChange",
    "LeaseTransitions",
    "MembershipLease",
    "PartitionFencing",
    "RecoveryWatch",
    "ack_advances_recovery",
    "generations_continuous",
    "lease_allows",
    "snapshot_replaces",
    "store_rebuild_needed",
    "write_ownership",
]


class FenceOutcome(enum.Enum):
    """What reading a fence means for the leader (or coordinator) that read it."""

    #: Our own fence: every later request in the partition is ours to serve.
    LIVE = "live"
    #: A newer leader's fence: step down from the partition.
    SUPERSEDED = "superseded"
    #: An older leader's fence, or one for a partition we don't own: nothing to do.
    IGNORED = "ignored"


class LeadershipState(enum.Enum):
    """Where this worker's ownership of one request (or coordinator) partition stands.

    The allowed moves are :data:`LEADERSHIP_TRANSITIONS`, checked by
    :meth:`Leadership.move_to`; a revoke drops the :class:`Leadership` (a new assignment makes
    a new one, ``ASSIGNED``).
    """

    #: Owned under an epoch, own fence not read back yet: acknowledgements are applied, nothing
    #: is acquired.
    ASSIGNED = "assigned"
    #: Own fence read back: every later request in the partition is this worker's to serve.
    LIVE = "live"
    #: A newer owner's fence was read: stepped down for good (until a new assignment).
    SUPERSEDED = "superseded"
    #: Fenced by the stall guard; taken back (``ASSIGNED``, a new fence) if the membership
    #: survived the stall.
    STALLED = "stalled"


#: Every allowed move of a :class:`Leadership` (state -> the states it may move to).
LEADERSHIP_TRANSITIONS: dict[LeadershipState, frozenset[LeadershipState]] = {
    LeadershipState.ASSIGNED: frozenset(
        {LeadershipState.LIVE, LeadershipState.SUPERSEDED, LeadershipState.STALLED}
    ),
    LeadershipState.LIVE: frozenset({LeadershipState.SUPERSEDED, LeadershipState.STALLED}),
    LeadershipState.STALLED: frozenset({LeadershipState.ASSIGNED}),
    LeadershipState.SUPERSEDED: frozenset(),
}


@dataclass(slots=True)
class Leadership:
    """This worker's ownership of one request (or coordinator) partition.

    Attributes:
        epoch: the leader or coordinator epoch (Faust consumer generation) it was assigned
            under.
        state: where the ownership stands (:class:`LeadershipState`); change it only with
            :meth:`move_to`.
        reason: why it stepped down (``SUPERSEDED`` or ``STALLED``), else ``None``.
        stalled_at_ms: when the stall guard fenced it (monotonic ms), or ``None``.
        fence_sent_ms: when its own fence was last sent (monotonic ms), or ``None``.
    """

    epoch: int
    state: LeadershipState = LeadershipState.ASSIGNED
    reason: str | None = None
    stalled_at_ms: int | None = None
    fence_sent_ms: int | None = None

    @property
    def live(self) -> bool:
        """Its own fence has been read back and it has not stepped down since."""
        return self.state is LeadershipState.LIVE

    @property
    def fenced(self) -> str | None:
        """Why it stepped down (superseded or stalled), or ``None``."""
        return self.reason

    def move_to(self, state: LeadershipState, reason: str | None = None) -> None:
        """Move to ``state`` (``reason``: why, for ``SUPERSEDED`` and ``STALLED``).

        Raises:
            IllegalTransitionError: :data:`LEADERSHIP_TRANSITIONS` does not allow the move.
        """
        if state not in LEADERSHIP_TRANSITIONS[self.state]:
            raise IllegalTransitionError(
                f"leadership of epoch {self.epoch} cannot move from {self.state.name} to "
                f"{state.name}"
            )
        self.state = state
        self.reason = reason if state in _STEPPED_DOWN else None


_STEPPED_DOWN = frozenset({LeadershipState.SUPERSEDED, LeadershipState.STALLED})


class PartitionFencing:
    """Fencing state of the partitions one worker owns in one role (see the module docstring).

    Args:
        stall_limit_ms: a pause longer than this (ms) means the worker may have lost every
            partition: the Faust session timeout plus one heartbeat interval.
        role: ``"leader"`` (request partitions; the epoch is the leader epoch) or
            ``"coordinator"`` (coordinator partitions; the coordinator epoch). It only names
            the role in the reasons given for stepping down.

    Raises:
        ValueError: ``stall_limit_ms`` is not positive.
    """

    def __init__(self, stall_limit_ms: int, role: str = "leader") -> None:
        if stall_limit_ms <= 0:
            raise ValueError(f"stall_limit_ms must be > 0, got {stall_limit_ms}")
        self.stall_limit_ms = stall_limit_ms
        self.role = role
        self.partitions: dict[int, Leadership] = {}
        self._alive_ms: int | None = None

    def assign(self, partitions: set[int], epoch: int) -> None:
        """Own ``partitions`` under epoch ``epoch``; not live until the own fence."""
        for p in partitions:
            self.partitions[p] = Leadership(epoch)

    def revoke(self, partitions: set[int]) -> None:
        """Stop owning ``partitions`` (a Faust rebalance took them)."""
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
            lead.move_to(LeadershipState.LIVE)
            return FenceOutcome.LIVE
        verb = "led" if self.role == "leader" else "owned"
        lead.move_to(
            LeadershipState.SUPERSEDED,
            f"partition {partition} was taken over by {self.role} epoch {epoch}; "
            f"this worker {verb} it under epoch {lead.epoch}",
        )
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
            if lead.state is LeadershipState.ASSIGNED
            and (lead.fence_sent_ms is None or now_ms - lead.fence_sent_ms > resend_after_ms)
        ]
        for p in due:
            self.partitions[p].fence_sent_ms = now_ms
        return due

    def is_live(self, partition: int) -> bool:
        """True when this worker may hand out records of ``partition``."""
        lead = self.partitions.get(partition)
        return lead is not None and lead.live

    def check(self, partition: int) -> None:
        """Raise unless this worker still leads ``partition`` (live or not yet live).

        Raises:
            FencedStateEpochError: the worker stepped down from ``partition`` or doesn't own it.
        """
        lead = self.partitions.get(partition)
        if lead is None:
            verb = "lead" if self.role == "leader" else "own the coordinator"
            raise FencedStateEpochError(f"this worker does not {verb} partition {partition}")
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
            lead.stalled_at_ms = now_ms
            lead.move_to(
                LeadershipState.STALLED,
                f"this worker was stalled for {now_ms - previous} ms, longer than the "
                f"{self.stall_limit_ms} ms after which Faust's group coordinator gives its "
                f"partitions to another worker ({self.role} epoch {lead.epoch})",
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
                lead.state is LeadershipState.STALLED
                and lead.stalled_at_ms is not None
                and now_ms - lead.stalled_at_ms > self.stall_limit_ms
                and lead.epoch == epoch
            ):
                lead.move_to(LeadershipState.ASSIGNED)
                lead.stalled_at_ms = lead.fence_sent_ms = None
                resumed.append(p)
        return resumed


#: The leader role's name for :class:`PartitionFencing` (its first user).
LeaderFencing = PartitionFencing


class CoordinatorEpochs:
    """The newest coordinator epoch a leader or member has seen, per share group: what an
    older coordinator sends (a zombie: frozen, or cut off from the broker, after losing the
    coordinator partition) is refused.

    Args:
        forget_after_ms: a newest epoch not seen again for this long (ms; about a session
            timeout) no longer refuses older ones. A superseded coordinator serves only within
            its membership lease, so an older epoch that comes back that much later is not a
            zombie: the leaders' Faust group was recreated (its generations start again).

    Epochs below 0 (unknown: a coordinator of a queueflow release before coordinator
    fencing) are admitted and change nothing. ``now_ms`` is monotonic ms. Pure; not
    thread-safe.
    """

    def __init__(self, forget_after_ms: int) -> None:
        if forget_after_ms <= 0:
            raise ValueError(f"forget_after_ms must be > 0, got {forget_after_ms}")
        self.forget_after_ms = forget_after_ms
        self._newest: dict[str, tuple[int, int]] = {}  # group -> (epoch, last seen ms)

    def admit(self, group: str, epoch: int, now_ms: int) -> bool:
        """True if a message of coordinator epoch ``epoch`` for ``group`` may be acted on (it
        is not older than the newest seen); a newer or equal epoch becomes the newest, seen
        at ``now_ms``."""
        if epoch < 0:
            return True
        known = self._newest.get(group)
        if known is not None and epoch < known[0] and now_ms - known[1] <= self.forget_after_ms:
            return False
        if len(self._newest) >= _MAX_GROUPS and group not in self._newest:
            self._newest.clear()  # forgetting only makes the fence laxer, never stuck
        self._newest[group] = (epoch, now_ms)
        return True

    def newest(self, group: str) -> int:
        """The newest coordinator epoch seen for ``group`` (-1: none)."""
        known = self._newest.get(group)
        return -1 if known is None else known[0]


#: Share groups whose coordinator epochs :class:`CoordinatorEpochs` remembers at most.
_MAX_GROUPS = 100_000


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


class LeaseChange(enum.Enum):
    """A change of whether the membership lease holds (:class:`LeaseTransitions`)."""

    #: It held (or was never seen) and holds no more: stop serving the direct path.
    LAPSED = "lapsed"
    #: It had lapsed and an OK heartbeat of the current generation proves it again.
    REGAINED = "regained"


class LeaseTransitions:
    """Turns successive readings of :meth:`MembershipLease.remaining_ms` into the moments it
    lapses and is regained (one log event each, not one per refused request).

    A rebalance is no lapse: Faust forgets the proof when one begins, and the new generation
    proves itself with its first OK heartbeat; readings taken while rebalancing change nothing
    but that. A lease lapses only when it held and then, outside a rebalance, no longer does;
    it is regained when it holds again (in the same generation, or after the worker rejoined).
    Pure; not thread-safe.
    """

    def __init__(self) -> None:
        self.holding = False
        self.lapsed = False

    def observe(self, remaining_ms: int | None, rebalancing: bool = False) -> LeaseChange | None:
        """Feed one reading (``remaining_ms``: ``None`` for a host whose membership can't
        lapse; ``rebalancing``: the host's group is rebalancing now).

        Returns:
            :attr:`LeaseChange.LAPSED` when a lease that held no longer does,
            :attr:`LeaseChange.REGAINED` when a lapsed one holds again, else ``None``.
        """
        if rebalancing:
            self.holding = False
            return None
        holds = lease_allows(remaining_ms)
        if holds == self.holding:
            return None
        self.holding = holds
        if not holds:
            self.lapsed = True
            return LeaseChange.LAPSED
        if self.lapsed:
            self.lapsed = False
            return LeaseChange.REGAINED
        return None


def lease_allows(remaining_ms: int | None, needed_ms: int = 0) -> bool:
    """True when a lease with ``remaining_ms`` left (``None``: can't lapse) covers ``needed_ms``
    more of serving (0: just now)."""
    return remaining_ms is None or remaining_ms > needed_ms


def write_ownership(generation: int, lease_remaining_ms: int | None) -> int | None:
    """Under what a state write is made, or acknowledged: the Faust generation while the
    membership lease holds (``lease_remaining_ms``: :meth:`MembershipLease.remaining_ms`,
    ``None`` for a host whose membership can't lapse), ``None`` when it has lapsed."""
    return generation if lease_allows(lease_remaining_ms) else None


def ack_advances_recovery(written_under: int | None, acked_under: int | None) -> bool:
    """Whether the broker's acknowledgement of a changelog write may advance the local store's
    persisted offset (where Faust's table recovery starts next time).

    A write sent while the worker owned its partition can be held up by a network partition
    and acknowledged after a successor's writes to the same changelog partition, at a higher
    offset. Recording that offset would make the next recovery of this worker's store start
    past the successor's writes: the store would never see them, and a share-partition checked
    against it (:meth:`~queueflow.server.durable.DurableSharePartition.resume`) would look
    untouched. So only an acknowledgement that arrives under the ownership the write was made
    under (:func:`write_ownership`: the same generation, the lease holding at both moments)
    advances it. A lease that lapsed and holds again within one generation is still that
    ownership: an OK heartbeat of the generation proves nobody else was assigned the
    partition meanwhile. Otherwise recovery simply reads a little more of the changelog.

    Args:
        written_under: :func:`write_ownership` when the write was made.
        acked_under: :func:`write_ownership` when its acknowledgement arrived.
    """
    return written_under is not None and written_under == acked_under


def generations_continuous(previous: int | None, current: int) -> bool:
    """Whether a worker assigned partitions at generation ``current`` took part in every
    rebalance since its previous assignment at ``previous`` (``None``: none before).

    Kafka's group coordinator numbers the generations one by one. A worker that missed one
    (cut off, expelled, a failed SyncGroup) can't know who led its old partitions in it, so
    the share-partitions it kept in memory must not be served again without reloading them.
    The same generation again (a repeated assignment callback) is continuous; a lower one (the
    group was deleted and started afresh) is not.
    """
    return previous is None or previous <= current <= previous + 1


def store_rebuild_needed(was_active: bool, previous: int | None, current: int) -> bool:
    """Whether a worker assigned a state changelog partition as *active* at generation
    ``current`` must rebuild its local store of that partition from the changelog before a
    share-partition is loaded from it.

    Only a store this worker wrote itself, as the partition's owner in every generation since
    (``was_active`` in its previous assignment, at ``previous``, and
    :func:`generations_continuous`), is known to hold the partition's state. Any other store
    was kept by Faust's standby replica or an older ownership, and those can miss changelog
    records while counting them as applied: faust-streaming clears its changelog queue when
    a recovery resumes its flow the second time, dropping the standby records fetched since
    the standby partitions were resumed (the consumer's position is already past them, and a
    standby partition has no committed offset to seek back to), so the next records apply on
    top of a hole and the store's persisted offset (where recovery starts) lies beyond it.
    Reading the compacted changelog from its start instead costs a few MiB per takeover.

    Args:
        was_active: the partition was active on this worker in its previous assignment.
        previous: the generation of that assignment (``None``: none before).
        current: the generation of this assignment.
    """
    return not (was_active and generations_continuous(previous, current))


def snapshot_replaces(current: tuple[int, int] | None, incoming: tuple[int, int] | None) -> bool:
    """Whether a share-partition snapshot read from the changelog (``incoming``) may replace
    the one the store holds (``current``); both ``(state epoch, snapshot epoch)``, ``None``:
    none held, or unreadable (the load reports a corrupt one).

    Every state epoch writes the same snapshot key, and a cut leader's snapshot sent before
    its successor took over can reach the changelog after the successor's (KIP-932
    "Share-partition leader": a successor always has the higher state epoch). Replacing the
    successor's snapshot with it would restore the old leader's state: records the successor
    handed out would be delivered again at the same delivery count. So a snapshot never
    replaces one of a higher state epoch, nor, within one state epoch, of a higher snapshot
    epoch (one leader writes its snapshots in order). An equal one replaces (replay is
    idempotent), and a tombstone (a deleted share-partition) always applies.
    """
    return current is None or incoming is None or incoming >= current


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

    def rearm(self, now_ms: int) -> None:
        """Count the period again from ``now_ms`` (ms) at the same remaining count: after
        acting on a report (restarting recovery), the next report comes one ``limit_ms``
        later if there is still no progress."""
        if self._since is not None:
            self._since = now_ms
