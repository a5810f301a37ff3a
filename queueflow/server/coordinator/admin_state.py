"""The lifecycle of an admin request the coordinator forwarded to share-partition leaders.

A request is :attr:`AdminState.WAITING` from when its ResetSharePartition messages are sent
until every leader answered (:attr:`~AdminState.ANSWERED`), its deadline passed
(:attr:`~AdminState.EXPIRED`) or this worker stopped coordinating its group
(:attr:`~AdminState.ABANDONED`: the leaders' answers go to the new coordinator). Each of those
is final. :meth:`PendingAdmin.move` is the one place the state changes, and it refuses any
other transition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from queueflow.errors import IllegalTransitionError
from queueflow.protocol import messages as protocol

__all__ = ["ADMIN_TRANSITIONS", "AdminRequest", "AdminState", "PendingAdmin", "ResetRequest"]

#: Admin requests answered by the share-partitions' leaders (forwarded as resets).
ResetRequest = (
    protocol.AlterShareGroupOffsetsRequest
    | protocol.DeleteShareGroupOffsetsRequest
    | protocol.DeleteShareGroupRequest
    | protocol.ParkedKeyRequest
)
#: Every admin request the coordinator serves.
AdminRequest = (
    ResetRequest | protocol.DescribeGroupConfigsRequest | protocol.AlterGroupConfigsRequest
)


class AdminState(enum.Enum):
    """Where a forwarded admin request is (see the module docstring)."""

    WAITING = "waiting"
    ANSWERED = "answered"
    EXPIRED = "expired"
    ABANDONED = "abandoned"


#: Allowed transitions: only a waiting request moves, and each move is final.
ADMIN_TRANSITIONS: dict[AdminState, frozenset[AdminState]] = {
    AdminState.WAITING: frozenset({AdminState.ANSWERED, AdminState.EXPIRED, AdminState.ABANDONED}),
    AdminState.ANSWERED: frozenset(),
    AdminState.EXPIRED: frozenset(),
    AdminState.ABANDONED: frozenset(),
}


@dataclass(slots=True)
class PendingAdmin:
    """An admin request forwarded to leaders.

    Attributes:
        request: the admin's request.
        operation: what it does, for messages (``"alter offsets"``, ``"delete offsets"``,
            ``"delete group"``).
        waiting: the share-partitions ``(topic, partition)`` whose leaders have yet to answer.
        deadline_ms: wall ms after which it is given up.
        results: the leaders' answers so far, by share-partition.
        state: where it is (:class:`AdminState`).
    """

    request: ResetRequest
    operation: str
    waiting: set[tuple[str, int]]
    deadline_ms: int
    results: dict[tuple[str, int], protocol.ResetSharePartitionResult] = field(default_factory=dict)
    state: AdminState = AdminState.WAITING

    def move(self, to: AdminState) -> None:
        """Change the state to ``to``.

        Raises:
            ValueError: ``to`` is not allowed from the current state (:data:`ADMIN_TRANSITIONS`).
        """
        if to not in ADMIN_TRANSITIONS[self.state]:
            raise IllegalTransitionError(
                f"admin request {self.request.admin_id}/{self.request.request_id} on share "
                f"group {self.request.group!r}: {self.state.value} -> {to.value} is not allowed"
            )
        self.state = to

    def answered(self, result: protocol.ResetSharePartitionResult) -> bool:
        """Record a leader's answer if it belongs to this request and is the first from its
        share-partition; returns whether it was recorded (late or repeated answers are not).
        Once every leader answered, the request is :attr:`AdminState.ANSWERED`."""
        key = (result.topic, result.partition)
        ours = (self.request.admin_id, self.request.request_id) == (
            result.admin_id,
            result.request_id,
        )
        if self.state is not AdminState.WAITING or not ours or key not in self.waiting:
            return False
        self.waiting.discard(key)
        self.results[key] = result
        if not self.waiting:
            self.move(AdminState.ANSWERED)
        return True

    def expire(self) -> None:
        """Give the request up: its deadline passed."""
        self.move(AdminState.EXPIRED)

    def abandon(self) -> None:
        """Give the request up: this worker no longer coordinates its group."""
        self.move(AdminState.ABANDONED)
