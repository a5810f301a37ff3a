"""Wire messages between share-group members, share-partition leaders and the coordinator.

These carry only control data (offsets, acknowledgements, membership), never record payloads:
members read records from the source topic through Kafka's own fetch path. The messages mirror
the KIP-932 RPCs:

===========================  ===========================================================
KIP-932 RPC                  queueflow message
===========================  ===========================================================
ShareGroupHeartbeat          :class:`HeartbeatRequest` / :class:`HeartbeatResponse`
ShareFetch                   :class:`ShareFetchRequest` (``max_records`` > 0) / response
ShareAcknowledge             :class:`ShareFetchRequest` with ``max_records == 0``
(leader-internal)            :class:`ReleaseMember`, :class:`Tick`
===========================  ===========================================================

Requests travel on internal Kafka topics that Faust agents consume, so that every state change
happens inside a Faust stream event of the right partition (see docs/architecture.md). Responses
travel on the reply topic, on the partition the member named in its request.

Encoding is compact JSON; :func:`decode` raises :class:`~queueflow.errors.InvalidRequestError`
for anything malformed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from queueflow.errors import ErrorCode, InvalidRequestError

#: Acknowledgement batch on the wire: (first_offset, last_offset, acknowledge types).
WireAck = tuple[int, int, tuple[int, ...]]
#: Acquired range on the wire: (first_offset, last_offset, delivery_count).
WireAcquired = tuple[int, int, int]


@dataclass(slots=True)
class ShareFetchRequest:
    """ShareFetch (and ShareAcknowledge when ``max_records == 0``) for one share-partition.

    Args:
        group: share group id.
        topic / partition: the share-partition.
        member_id: the requesting member.
        request_id: correlation id, unique per member.
        reply_partition: partition of the reply topic the member reads.
        max_records: records to acquire (0: acknowledge only).
        acks: acknowledgement batches to apply first, atomically.
        lock_duration_ms: the member's own lock duration, or ``None`` for the group's.
        deadline_ms: wall-clock ms after which the member no longer waits; the leader drops the
            request without acquiring anything (its acknowledgements are still applied).
    """

    group: str
    topic: str
    partition: int
    member_id: str
    request_id: int
    reply_partition: int
    max_records: int
    acks: list[WireAck] = field(default_factory=list)
    lock_duration_ms: int | None = None
    deadline_ms: int = 0
    kind: str = "fetch"


@dataclass(slots=True)
class ShareFetchResponse:
    """Answer to :class:`ShareFetchRequest`.

    ``error`` concerns the fetch as a whole (e.g. ``NOT_LEADER_OR_FOLLOWER``); ``ack_error``
    concerns the acknowledgements, which are all applied or all refused. When they were refused,
    ``ack_stale`` names the offset ranges (inclusive) the member could no longer acknowledge,
    so that it can send its other outcomes again without them.

    ``lock_timeout_ms`` is the acquisition lock duration of the records in ``acquired``
    (KIP-1222 ``AcquisitionLockTimeoutMs``): they may be acknowledged for at least that long
    after the member sent the request.
    """

    member_id: str
    request_id: int
    topic: str
    partition: int
    acquired: list[WireAcquired] = field(default_factory=list)
    error: str = ErrorCode.NONE.value
    error_message: str = ""
    ack_error: str = ErrorCode.NONE.value
    ack_error_message: str = ""
    ack_stale: list[tuple[int, int]] = field(default_factory=list)
    lock_timeout_ms: int = 0
    kind: str = "fetch_response"


@dataclass(slots=True)
class ReleaseMember:
    """Coordinator → leader: release every record the member holds (it left or timed out)."""

    group: str
    topic: str
    partition: int
    member_id: str
    reason: str = ""
    kind: str = "release_member"


@dataclass(slots=True)
class Tick:
    """A timer event sent into a partition the sender owns, so timed work (lock expiry,
    session expiry) runs inside a Faust stream event of that partition."""

    sent_ms: int = 0
    kind: str = "tick"


@dataclass(slots=True)
class Fence:
    """A new leader → its request partition: requests after this one are mine.

    ``leader_epoch`` is the Faust consumer generation the sender was assigned the partition in
    (see :mod:`queueflow.engine.fencing`).
    """

    leader_epoch: int
    sent_ms: int = 0
    kind: str = "fence"


@dataclass(slots=True)
class HeartbeatRequest:
    """ShareGroupHeartbeat: ``member_epoch`` 0 joins, -1 leaves, otherwise the current epoch."""

    group: str
    member_id: str
    member_epoch: int
    subscribed_topics: list[str]
    reply_partition: int
    request_id: int
    client_id: str = ""
    host: str = ""
    kind: str = "heartbeat"


@dataclass(slots=True)
class HeartbeatResponse:
    """The member's epoch and its assigned share-partitions ``{topic: [partition, ...]}``."""

    member_id: str
    request_id: int
    member_epoch: int = 0
    assignment: dict[str, list[int]] = field(default_factory=dict)
    heartbeat_interval_ms: int = 5000
    error: str = ErrorCode.NONE.value
    error_message: str = ""
    kind: str = "heartbeat_response"


Message = (
    ShareFetchRequest
    | ShareFetchResponse
    | ReleaseMember
    | Tick
    | Fence
    | HeartbeatRequest
    | HeartbeatResponse
)
_KINDS: dict[str, type[Any]] = {
    "fetch": ShareFetchRequest,
    "fetch_response": ShareFetchResponse,
    "release_member": ReleaseMember,
    "tick": Tick,
    "fence": Fence,
    "heartbeat": HeartbeatRequest,
    "heartbeat_response": HeartbeatResponse,
}


def encode(message: Message) -> bytes:
    """Encode a message as compact JSON bytes."""
    body = {name: getattr(message, name) for name in message.__slots__}  # type: ignore[union-attr]
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes | str | dict[str, Any]) -> Message:
    """Decode bytes (or an already-parsed dict) into a message.

    Raises:
        InvalidRequestError: not JSON, an unknown ``kind``, or missing/unknown fields.
    """
    try:
        body = data if isinstance(data, dict) else json.loads(data)
        cls = _KINDS[body["kind"]]
        message = cls(**body)
        if isinstance(message, ShareFetchRequest):
            message.acks = [(int(a), int(b), tuple(int(t) for t in c)) for a, b, c in message.acks]
        elif isinstance(message, ShareFetchResponse):
            message.acquired = [(int(a), int(b), int(c)) for a, b, c in message.acquired]
            message.ack_stale = [(int(a), int(b)) for a, b in message.ack_stale]
    except (ValueError, KeyError, TypeError) as exc:
        preview = repr(data)[:120]
        raise InvalidRequestError(
            f"undecodable queueflow control message {preview}: {exc!r}; "
            "is a different queueflow version writing to this topic?"
        ) from None
    return message
