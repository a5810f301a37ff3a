"""The share-group coordinator, served from the coordinator topic ``<app>-share-coordinator``.

It handles ShareGroupHeartbeat requests (join, heartbeat, leave) and clock ticks with the pure
:class:`~queueflow.engine.group.ShareGroup` state machine, keeps group metadata in the
``share-groups`` Faust table (so a new coordinator picks up where the old one stopped), and tells
share-partition leaders to release the records of members that left or timed out
(:class:`~queueflow.protocol.messages.ReleaseMember`).

It also serves the admin's write requests (``alterShareGroupOffsets``,
``deleteShareGroupOffsets``, ``deleteShareGroups``; :mod:`queueflow.admin`). The coordinator owns
membership and the share-partition leaders own share-partition state, so an admin request is
checked here (the group exists, has no members, names share-partitions of its topics) and
forwarded to the leaders as :class:`~queueflow.protocol.messages.ResetSharePartition`; the
leaders apply it and answer here, and the coordinator answers the admin once every leader has
(or the request's deadline passed).

The join race: between the emptiness check and a leader applying the reset, a member could join
and acquire records, which the reset would then discard. Two rules close it. (1) While an admin
request is pending for a group, the coordinator refuses joins of that group with the retriable
``REQUEST_TIMED_OUT`` (members retry their join with back-off), so no member can join before
every leader has applied or refused the request, or its deadline passed. (2) A leader refuses a
reset or delete while any record of the share-partition is Acquired (``NON_EMPTY_GROUP``), and
refuses one read after the request's deadline, when (1) no longer holds joins back. (2) also
covers a coordinator failover mid-request (the pending set is in memory only): the
share-partitions a new member already fetched from are refused, and the admin, whose answer is
lost with the old coordinator, times out naming the request.

The package is split by concern, after Kafka's group coordinator, whose handlers return a
``CoordinatorResult`` (the response and the records to write) and do no I/O:

* :mod:`.dispatcher`: :class:`ShareGroupCoordinator`, the one place that reads requests,
  ``match``-es them to their handlers and performs the results (table writes, messages to
  leaders, replies);
* :mod:`.membership`: heartbeats, session expiry and assignment refreshes (pure handlers);
* :mod:`.admin` and :mod:`.admin_state`: admin requests and the lifecycle of those forwarded to
  leaders (pure handlers);
* :mod:`.announcements`: leaders' addresses and lag (pure handler);
* :mod:`.gate`: fencing, step-down, the stall guard and the membership-lease gate;
* :mod:`.state` and :mod:`.results`: what the handlers read and change, and what they return.
"""

from __future__ import annotations

from queueflow.server.coordinator.announcements import LAG_TTL_MS, LEADER_ADDRESS_TTL_MS
from queueflow.server.coordinator.dispatcher import ShareGroupCoordinator
from queueflow.server.coordinator.gate import LEASE_WAIT_MS
from queueflow.server.coordinator.results import CoordinatorResult

__all__ = [
    "LAG_TTL_MS",
    "LEADER_ADDRESS_TTL_MS",
    "LEASE_WAIT_MS",
    "CoordinatorResult",
    "ShareGroupCoordinator",
]
