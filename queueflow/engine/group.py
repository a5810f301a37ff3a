"""Share-group membership: the coordinator's pure state machine (KIP-932 "Share group membership").

A :class:`ShareGroup` holds the members, their subscriptions and assignments, the group epoch and
the assignment epoch. The coordinator agent feeds it heartbeats, leaves and clock ticks, and
persists :meth:`ShareGroup.to_dict` in a Faust table. Time is passed in (``now_ms``).

Rules implemented here:

* member epoch 0 joins, -1 leaves; the member id is chosen by the member (a UUID);
* any change of membership, subscriptions, advertised assignors, racks or partition counts
  bumps the group epoch, and the assignment is recomputed by the group's assignor
  (:mod:`queueflow.engine.assignors`): the first of ``group.share.assignors`` that every member
  supports, picked again on every such change (``simple``, KIP-932's SimpleAssignor, unless
  configured otherwise); the assignment epoch follows it and never moves backwards;
* a member silent for longer than ``group.share.session.timeout.ms`` is removed, and the leaders
  release its records;
* epochs never go back: a heartbeat of a known member at an epoch above the group epoch (the
  durable metadata lost its last writes in a coordinator failover) moves the group epoch past it;
* the group is EMPTY with no members, STABLE with members, DEAD once deleted;
* ``group.share.max.size`` bounds the number of members (``GROUP_MAX_SIZE_REACHED``); a member
  is *provisional* from its join until its first heartbeat with the member epoch it was given
  (every live member sends one within a heartbeat interval): provisional members don't count
  toward the limit (a join that finds the group full of members removes the oldest provisional
  one instead), and one that sends no such heartbeat within ``share.member.join.grace.ms`` is
  removed early (:meth:`ShareGroup.expire_provisional`), so joins that never follow up can't
  keep a real member out;
* partitions added to a subscribed topic at runtime are noticed on the next heartbeat (a change
  of partition counts) and remembered (:attr:`ShareGroup.added_partitions`): their
  share-partitions start at the log start.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from queueflow.engine.assignors import (
    DEFAULT_ASSIGNOR,
    AssignmentSpec,
    AssignorSelection,
    MemberSpec,
    get_assignor,
    select_assignor,
)
from queueflow.engine.reserved import is_reserved
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.settings import int_default
from queueflow.structs import TopicPartition

#: Member and group epochs are Kafka int32s; a heartbeat claiming more is not believed.
MAX_EPOCH = 2**31 - 1
#: At most this many assignor names in a heartbeat (they are stored with the group).
MAX_ADVERTISED = 32


class GroupState(enum.Enum):
    """``ShareGroup.ShareGroupState`` of Kafka 4.x (no preparing/reconciling states)."""

    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class Member:
    """One share-group member as the coordinator sees it."""

    member_id: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: list[TopicPartition] = field(default_factory=list)
    last_heartbeat_ms: int = 0
    client_id: str = ""
    host: str = ""
    #: The assignor names it advertises (``()``: an older member, which supports ``simple``).
    assignors: tuple[str, ...] = ()
    #: Its rack (``client.rack``), ``""`` if unset.
    rack_id: str = ""
    #: Joined, but has sent no heartbeat with its member epoch yet (not durable: a restored
    #: member is confirmed).
    provisional: bool = False
    #: When it joined (ms).
    joined_ms: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """What the coordinator answers, plus what the leaders must release.

    Attributes:
        member_epoch: the member's epoch after this heartbeat (-1 after a leave).
        assignment: the member's share-partitions.
        released: (member id, share-partitions) whose records the leaders must release.
        evicted: provisional members removed to make room for this join.
    """

    member_epoch: int
    assignment: list[TopicPartition]
    released: list[tuple[str, list[TopicPartition]]]
    evicted: tuple[str, ...] = ()


class ShareGroup:
    """Membership and assignment of one share group.

    Args:
        group_id: the share group id.
        session_timeout_ms: ``group.share.session.timeout.ms``.
        max_size: ``group.share.max.size``.
        assignors: ``group.share.assignors``, most preferred first (registered names).

    Attributes:
        join_grace_ms: ``share.member.join.grace.ms`` (the coordinator raises it to twice the
            group's heartbeat interval): how long a member stays provisional before it is
            removed (see :meth:`expire_provisional`).
        assignor: the assignor of the current assignment (persisted).
        selection: the last choice made and why (``None`` before the first rebalance).
        lag: share-partition → lag as its leader last reported it, set by the coordinator
            before each call (input of lag-aware assignors; absent: unknown).
        partition_racks: Kafka partition → rack of its leader broker, set likewise.
    """

    def __init__(
        self,
        group_id: str,
        session_timeout_ms: int,
        max_size: int,
        assignors: Sequence[str] = (DEFAULT_ASSIGNOR,),
    ) -> None:
        self.group_id = group_id
        self.session_timeout_ms = session_timeout_ms
        self.max_size = max_size
        self.join_grace_ms = int_default("share.member.join.grace.ms")
        self.assignor_preference: tuple[str, ...] = tuple(assignors)
        self.assignor = DEFAULT_ASSIGNOR
        self.selection: AssignorSelection | None = None
        self.lag: Mapping[TopicPartition, int] = {}
        self.partition_racks: Mapping[TopicPartition, str] = {}
        self.members: dict[str, Member] = {}
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.partitions: dict[str, int] = {}
        self.dead = False
        #: Group configs set with the admin (``share.*`` name -> validated value), durable with
        #: the group; see :mod:`queueflow.engine.group_config`.
        self.configs: dict[str, str] = {}
        #: Bumped on every change of :attr:`configs` (leaders apply the highest they see).
        self.config_version = 0
        #: Topics that gained partitions while the group knew them: topic -> the first added
        #: partition (its count before). Those share-partitions start at the log start, not
        #: at ``share.auto.offset.reset``, as in Kafka (nothing produced to them is skipped).
        self.added_partitions: dict[str, int] = {}

    @property
    def state(self) -> GroupState:
        """EMPTY, STABLE or DEAD."""
        if self.dead:
            return GroupState.DEAD
        return GroupState.STABLE if self.members else GroupState.EMPTY

    def subscribed_topics(self) -> set[str]:
        """Every topic some member subscribes to."""
        return {t for m in self.members.values() for t in m.subscribed_topics}

    def heartbeat(
        self,
        member_id: str,
        member_epoch: int,
        subscribed_topics: Sequence[str],
        now_ms: int,
        partitions: Mapping[str, int],
        client_id: str = "",
        host: str = "",
        assignors: Sequence[str] | None = None,
        rack_id: str = "",
    ) -> HeartbeatResult:
        """Handle a ShareGroupHeartbeat.

        Args:
            member_id: the member's id.
            member_epoch: 0 to join, -1 to leave, else the epoch the member last received.
            subscribed_topics: topic names the member subscribes to.
            now_ms: current time in ms.
            partitions: topic → partition count for (at least) the subscribed topics.
            client_id / host: shown by admin tooling.
            assignors: the assignor names the member supports (``[]``: an older member, which
                supports ``simple`` only); ``None`` keeps what it advertised before.
            rack_id: the member's rack (``client.rack``), ``""`` if unset.

        Raises:
            ShareGroupError: ``INVALID_REQUEST`` for more than :data:`MAX_ADVERTISED` assignor
                names, a name of 0 or more than 64 characters, a rack id of more than 255, or
                a member id starting with ``__`` (reserved; nothing changes);
                ``UNKNOWN_MEMBER_ID`` for a heartbeat with epoch > 0 from a member the group
                doesn't know (it must rejoin with epoch 0); ``GROUP_MAX_SIZE_REACHED``;
                ``GROUP_ID_NOT_FOUND`` if the group was deleted.
        """
        if self.dead:
            raise ShareGroupError(
                ErrorCode.GROUP_ID_NOT_FOUND, f"share group {self.group_id!r} was deleted"
            )
        if assignors is not None and (
            len(assignors) > MAX_ADVERTISED or any(not 0 < len(n) <= 64 for n in assignors)
        ):
            raise ShareGroupError(
                ErrorCode.INVALID_REQUEST,
                f"member {member_id} advertises {len(assignors)} assignor names; at most "
                f"{MAX_ADVERTISED} names of 1-64 characters are allowed "
                "(queueflow.member.assignors)",
            )
        if len(rack_id) > 255:
            raise ShareGroupError(
                ErrorCode.INVALID_REQUEST,
                f"member {member_id} sent a rack id of {len(rack_id)} characters; at most 255 "
                "(client.rack)",
            )
        if member_epoch == -1:
            released = self.leave(member_id)
            return HeartbeatResult(-1, [], released)
        if is_reserved(member_id):  # owners the leaders hold records by (engine/reserved.py)
            raise ShareGroupError(
                ErrorCode.INVALID_REQUEST,
                f"member id {member_id!r} starts with '__', which is reserved for the leaders; "
                "use another member id (members generate a UUID)",
            )
        member = self.members.get(member_id)
        evicted: list[tuple[str, list[TopicPartition]]] = []
        if member is None:
            if member_epoch != 0:
                raise ShareGroupError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"member {member_id} is not in share group {self.group_id!r} (it may have "
                    "timed out); rejoin with member epoch 0",
                )
            evicted = self._make_room()
            member = Member(member_id, 0, tuple(sorted(subscribed_topics)))
            member.provisional, member.joined_ms = True, now_ms
            self.members[member_id] = member
            changed = True
        else:
            if member_epoch > 0:
                member.provisional = False  # it follows up with its epoch: a live member
            topics = tuple(sorted(subscribed_topics))
            changed = topics != member.subscribed_topics
            member.subscribed_topics = topics
            if self.group_epoch < member_epoch <= MAX_EPOCH:
                # A member holds an epoch this group never reached: the durable metadata is
                # older than what the previous coordinator issued (its last writes were lost
                # in a failover). Epochs never go back (leaders fence tickets of older
                # epochs), so move past it.
                self.group_epoch = member_epoch
                changed = True
        advertised = member.assignors if assignors is None else tuple(assignors)
        if (advertised, rack_id) != (member.assignors, member.rack_id):
            member.assignors, member.rack_id = advertised, rack_id
            changed = True  # the choice of assignor, or its input, may change
        member.last_heartbeat_ms = now_ms
        member.client_id = client_id or member.client_id
        member.host = host or member.host
        wanted = {t: n for t, n in partitions.items() if t in self.subscribed_topics()}
        if wanted != {t: n for t, n in self.partitions.items() if t in wanted}:
            changed = True
        for t, n in wanted.items():
            known = self.partitions.get(t)
            if known is not None and n > known:  # partitions added to a topic at runtime
                self.added_partitions.setdefault(t, known)
        self.partitions.update(wanted)
        moved = self._rebalance() if changed else []
        return HeartbeatResult(
            member.member_epoch,
            list(member.assignment),
            evicted + moved,
            tuple(m for m, _ in evicted),
        )

    def _make_room(self) -> list[tuple[str, list[TopicPartition]]]:
        """Before a join: refuse it when ``max_size`` members are confirmed; else remove the
        oldest provisional members until there is room. Returns what they held.

        Raises:
            ShareGroupError: ``GROUP_MAX_SIZE_REACHED``.
        """
        confirmed = sum(1 for m in self.members.values() if not m.provisional)
        if confirmed >= self.max_size:
            raise ShareGroupError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"share group {self.group_id!r} has {confirmed} members, the "
                f"group.share.max.size limit",
            )
        evicted: list[tuple[str, list[TopicPartition]]] = []
        if len(self.members) >= self.max_size:
            waiting = sorted(
                (m for m in self.members.values() if m.provisional), key=lambda m: m.joined_ms
            )
            for m in waiting[: len(self.members) - self.max_size + 1]:
                evicted.append((m.member_id, list(m.assignment)))
                del self.members[m.member_id]
        return evicted

    def expire_provisional(self, now_ms: int) -> list[tuple[str, list[TopicPartition]]]:
        """Remove provisional members that sent no heartbeat with their member epoch within
        :attr:`join_grace_ms` of joining (joins nobody followed up: phantom members).

        Returns:
            (member id, its share-partitions) for each removed member.
        """
        expired = [
            m
            for m in self.members.values()
            if m.provisional and now_ms - m.joined_ms > self.join_grace_ms
        ]
        return self._remove(expired)

    def leave(self, member_id: str) -> list[tuple[str, list[TopicPartition]]]:
        """Remove a member that leaves; returns what the leaders must release."""
        member = self.members.pop(member_id, None)
        if member is None:
            return []
        released = [(member_id, list(member.assignment))]
        return released + self._rebalance()

    def expire(self, now_ms: int) -> list[tuple[str, list[TopicPartition]]]:
        """Remove members silent for longer than the session timeout.

        Returns:
            (member id, its share-partitions) for each removed member.
        """
        expired = [
            m
            for m in self.members.values()
            if now_ms - m.last_heartbeat_ms > self.session_timeout_ms
        ]
        return self._remove(expired)

    def touch_all(self, now_ms: int) -> None:
        """Give every member a fresh session (after coordinator failover: the new coordinator
        can't know when they last heartbeated)."""
        for m in self.members.values():
            m.last_heartbeat_ms = now_ms
            if m.provisional:  # a fresh grace too: it may have followed up unseen
                m.joined_ms = now_ms

    def select_assignor(self) -> AssignorSelection:
        """Choose the group's assignor now: the first of ``group.share.assignors`` that every
        current member supports (:func:`~queueflow.engine.assignors.select_assignor`)."""
        self.selection = select_assignor(
            self.assignor_preference, {m.member_id: m.assignors for m in self.members.values()}
        )
        self.assignor = self.selection.name
        return self.selection

    def _spec(self) -> AssignmentSpec:
        return AssignmentSpec(
            members={
                m.member_id: MemberSpec(m.subscribed_topics, m.rack_id, tuple(m.assignment))
                for m in self.members.values()
            },
            partitions=self.partitions,
            lag=self.lag,
            partition_racks=self.partition_racks,
        )

    def refresh(self) -> bool:
        """Recompute the assignment with the current inputs (:attr:`lag`,
        :attr:`partition_racks`) and rebalance, bumping the group epoch, only if it changed
        (a stable group's ``lag`` assignment follows its lag this way; ``simple`` never
        changes without a membership change).

        Returns:
            Whether it rebalanced.
        """
        if self.dead or not self.members:
            return False
        selection = select_assignor(
            self.assignor_preference, {m.member_id: m.assignors for m in self.members.values()}
        )
        target = get_assignor(selection.name).assign(self._spec())
        same = selection.name == self.assignor and all(
            target[m.member_id] == sorted(m.assignment) for m in self.members.values()
        )
        if same:
            return False
        self._rebalance()
        return True

    def _remove(self, gone: list[Member]) -> list[tuple[str, list[TopicPartition]]]:
        """Remove ``gone`` and rebalance once if any; returns what the leaders must release:
        (member id, its share-partitions) of each."""
        released = [(m.member_id, list(m.assignment)) for m in gone]
        for m in gone:
            del self.members[m.member_id]
        if gone:
            released += self._rebalance()
        return released

    def _rebalance(self) -> list[tuple[str, list[TopicPartition]]]:
        self.group_epoch += 1
        self.select_assignor()
        target = get_assignor(self.assignor).assign(self._spec())
        self.assignment_epoch = max(self.assignment_epoch, self.group_epoch)
        for m in self.members.values():
            m.assignment = target[m.member_id]
            m.member_epoch = self.group_epoch
        # Partitions move between members, but records stay acquired by whoever holds them:
        # nothing to release on a plain reassignment.
        return []

    def to_dict(self) -> dict[str, Any]:
        """The durable form (stored in the coordinator's Faust table)."""
        data: dict[str, Any] = {
            "v": 1,
            "group_epoch": self.group_epoch,
            "assignment_epoch": self.assignment_epoch,
            "dead": self.dead,
            "partitions": self.partitions,
            "members": [
                [
                    m.member_id,
                    m.member_epoch,
                    list(m.subscribed_topics),
                    [list(tp) for tp in m.assignment],
                    m.client_id,
                    m.host,
                ]
                for m in self.members.values()
            ],
        }
        # Added later, written only when not the default (so older layouts stay byte-equal).
        if self.assignor != DEFAULT_ASSIGNOR:
            data["assignor"] = self.assignor
        meta = {
            m.member_id: [list(m.assignors), m.rack_id]
            for m in self.members.values()
            if m.assignors or m.rack_id
        }
        if meta:
            data["member_meta"] = meta
        return data

    @classmethod
    def from_dict(
        cls,
        group_id: str,
        data: Mapping[str, Any],
        session_timeout_ms: int,
        max_size: int,
        now_ms: int,
    ) -> ShareGroup:
        """Rebuild a group from :meth:`to_dict`; every member gets a fresh session at ``now_ms``.

        Raises:
            ShareGroupError: ``CORRUPT_STATE`` naming the group when ``data`` is malformed.
        """
        group = cls(group_id, session_timeout_ms, max_size)
        try:
            if data.get("v") != 1:
                raise ValueError(f"unknown version {data.get('v')!r}, expected 1")
            group.group_epoch = int(data["group_epoch"])
            group.assignment_epoch = int(data["assignment_epoch"])
            group.dead = bool(data["dead"])
            group.partitions = {str(t): int(n) for t, n in data["partitions"].items()}
            for mid, epoch, topics, tps, client_id, host in data["members"]:
                group.members[mid] = Member(
                    mid,
                    int(epoch),
                    tuple(topics),
                    [TopicPartition(str(t), int(p)) for t, p in tps],
                    now_ms,
                    client_id,
                    host,
                )
            group.assignor = str(data.get("assignor", DEFAULT_ASSIGNOR))
            for mid, (names, rack) in dict(data.get("member_meta", {})).items():
                if mid in group.members:
                    group.members[mid].assignors = tuple(str(n) for n in names)
                    group.members[mid].rack_id = str(rack)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ShareGroupError(
                ErrorCode.CORRUPT_STATE,
                f"share group {group_id!r}: durable group metadata is corrupt ({exc}); "
                'see docs/operations.md, "Corrupt state", for how to inspect and repair it',
            ) from None
        return group
