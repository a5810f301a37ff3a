"""Named lifecycle states of the member side, each with its allowed transitions in one table.

Every lifecycle (:class:`AgentState` of a share agent, :class:`HandlersHealth` of its handler
tasks, :class:`SessionState` of a ShareFetch session, :class:`MembershipState` of a group
membership) is an :class:`enum.Enum`; a :class:`Lifecycle` holds the current state and moves it
only along its table (:meth:`Lifecycle.move` raises :class:`IllegalTransitionError` otherwise).
Pure: no I/O, no clocks.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar

from queueflow.errors import IllegalTransitionError

__all__ = [
    "AGENT_STOPPING",
    "AGENT_TRANSITIONS",
    "HEALTH_TRANSITIONS",
    "MEMBERSHIP_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "AgentState",
    "HandlersHealth",
    "IllegalTransitionError",
    "Lifecycle",
    "MembershipState",
    "SessionState",
]


class AgentState(enum.Enum):
    """Lifecycle of a :class:`~queueflow.ShareAgent`.

    ``CREATED`` until :meth:`~queueflow.ShareAgent.start`; ``STARTING`` while it joins the group
    (retried while no coordinator answers); ``RUNNING`` once joined, with its fetch loops and
    handler tasks; ``STOPPING`` from :meth:`~queueflow.ShareAgent.stop` on (the drain); and
    ``STOPPED`` once drained and gone from the group. ``stop`` is allowed in any state before
    ``STOPPING`` (an agent stopped while it joins does not start its tasks).
    """

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class HandlersHealth(enum.Enum):
    """Whether a share agent's handler tasks can take records.

    ``ALL_STUCK``: every handler call ignored its cancellation at its deadline; the agent
    RELEASEs what is queued and acquires nothing until one returns (back to ``WORKING``). It is
    apart from :class:`AgentState` because a stuck call may return during the drain too.
    """

    WORKING = "working"
    ALL_STUCK = "all_stuck"


class SessionState(enum.Enum):
    """Lifecycle of a :class:`~queueflow.member.session.ShareFetchSession`.

    ``CREATED`` until its topics were checked (the first step of ``start``); ``STARTED`` from
    then on (connecting, joining, fetching); ``CLOSED`` after ``close``.
    """

    CREATED = "created"
    STARTED = "started"
    CLOSED = "closed"


class MembershipState(enum.Enum):
    """Lifecycle of a :class:`~queueflow.member.membership.Membership` (KIP-932
    ShareGroupHeartbeat): ``JOINING`` while the join is retried, ``JOINED`` while it heartbeats
    (a rejoin after the coordinator dropped the member happens within ``JOINED``), ``CLOSED``
    after a leave or stop (no more heartbeats or refreshes)."""

    CREATED = "created"
    JOINING = "joining"
    JOINED = "joined"
    CLOSED = "closed"


S = TypeVar("S", bound=enum.Enum)

#: state -> the states it may move to.
AGENT_TRANSITIONS: Mapping[AgentState, frozenset[AgentState]] = {
    AgentState.CREATED: frozenset({AgentState.STARTING, AgentState.STOPPING}),
    AgentState.STARTING: frozenset({AgentState.RUNNING, AgentState.STOPPING}),
    AgentState.RUNNING: frozenset({AgentState.STOPPING}),
    AgentState.STOPPING: frozenset({AgentState.STOPPED}),
    AgentState.STOPPED: frozenset(),
}
#: The states of an agent whose loops end (``ShareAgent.stopping``).
AGENT_STOPPING = frozenset({AgentState.STOPPING, AgentState.STOPPED})
HEALTH_TRANSITIONS: Mapping[HandlersHealth, frozenset[HandlersHealth]] = {
    HandlersHealth.WORKING: frozenset({HandlersHealth.ALL_STUCK}),
    HandlersHealth.ALL_STUCK: frozenset({HandlersHealth.WORKING}),
}
SESSION_TRANSITIONS: Mapping[SessionState, frozenset[SessionState]] = {
    SessionState.CREATED: frozenset({SessionState.STARTED, SessionState.CLOSED}),
    SessionState.STARTED: frozenset({SessionState.CLOSED}),
    # Closed again (a failed start, then the owner's stop): the clients are closed again, the
    # group is not left twice.
    SessionState.CLOSED: frozenset({SessionState.CLOSED}),
}
MEMBERSHIP_TRANSITIONS: Mapping[MembershipState, frozenset[MembershipState]] = {
    MembershipState.CREATED: frozenset({MembershipState.JOINING, MembershipState.CLOSED}),
    MembershipState.JOINING: frozenset({MembershipState.JOINED, MembershipState.CLOSED}),
    MembershipState.JOINED: frozenset({MembershipState.CLOSED}),
    # leave() after stop() (or twice) still sends its leave heartbeat.
    MembershipState.CLOSED: frozenset({MembershipState.CLOSED}),
}


class Lifecycle(Generic[S]):
    """The current state of one lifecycle and the one place it changes.

    Args:
        name: what it is the lifecycle of, for error messages (e.g. ``"share agent a.b"``).
        initial: the first state.
        transitions: state -> the states it may move to.
    """

    __slots__ = ("name", "state", "transitions")

    def __init__(self, name: str, initial: S, transitions: Mapping[S, frozenset[S]]) -> None:
        self.name = name
        self.state = initial
        self.transitions = transitions

    def can_move(self, to: S) -> bool:
        """True if the table allows moving from the current state to ``to``."""
        return to in self.transitions[self.state]

    def move(self, to: S) -> S:
        """Move to ``to``; returns the state it left.

        Raises:
            IllegalTransitionError: the table does not allow it.
        """
        was = self.state
        if to not in self.transitions[was]:
            raise IllegalTransitionError(
                f"{self.name}: {was.name} -> {to.name} is not allowed; from {was.name} only "
                f"{sorted(s.name for s in self.transitions[was]) or 'nothing'}"
            )
        self.state = to
        return was

    def __repr__(self) -> str:
        return f"Lifecycle({self.name!r}, {self.state.name})"
