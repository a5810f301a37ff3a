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
(leader-internal)            :class:`ReleaseMember`, :class:`Tick`, :class:`Fence`
(worker → coordinator)       :class:`MemberTicketRequest` / :class:`HeartbeatResponse`
AlterShareGroupOffsets       :class:`AlterShareGroupOffsetsRequest` / :class:`AdminResponse`
DeleteShareGroupOffsets      :class:`DeleteShareGroupOffsetsRequest` / :class:`AdminResponse`
DeleteGroups (share groups)  :class:`DeleteShareGroupRequest` / :class:`AdminResponse`
DescribeConfigs (group)      :class:`DescribeGroupConfigsRequest` / :class:`AdminResponse`
IncrementalAlterConfigs      :class:`AlterGroupConfigsRequest` / :class:`AdminResponse`
(coordinator ↔ leader)       :class:`ResetSharePartition` / :class:`ResetSharePartitionResult`
===========================  ===========================================================

Requests travel on internal Kafka topics that Faust agents consume, so that every state change
happens inside a Faust stream event of the right partition (see docs/architecture.md). Responses
travel on the reply topic, on the partition the member named in its request.

Encoding
--------
Each message is a :class:`msgspec.Struct` of a tagged union: a compact JSON object whose ``kind``
field names the message (``"fetch"``, ``"fetch_response"``, ``"release_member"``, ``"tick"``,
``"fence"``, ``"heartbeat"``, ``"heartbeat_response"``, ``"member_ticket"``, and the admin messages
``"alter_offsets"``, ``"delete_offsets"``, ``"delete_group"``, ``"admin_response"``,
``"reset_share_partition"``, ``"reset_share_partition_result"``,
``"describe_group_configs"``, ``"alter_group_configs"``). Versioning follows Kafka's
RPC rules (``validVersions`` / tagged fields):

* every message has a schema version ``v`` (1 here), and the heartbeat also carries the member's
  :data:`PROTOCOL_VERSION`, so the coordinator can answer ``UNSUPPORTED_VERSION``;
* fields equal to their default are not written. In particular ``v`` and ``protocol_version``
  are absent at version 1 (absent ``v`` means 1), so version-1 bytes hold only fields that the
  unversioned decoder of earlier queueflow releases knows (it refused any other field), and
  those releases' bytes decode here as version 1: old and new workers interoperate during a
  rolling upgrade, in both directions;
* unknown fields are ignored, so from this release on a newer peer may add fields with defaults
  without a version bump;
* a field of the wrong type, an unknown ``kind`` or bytes that are not JSON are refused by
  :func:`decode` with :class:`~queueflow.errors.InvalidRequestError` naming the field path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final

import msgspec

from queueflow.errors import ErrorCode, InvalidRequestError

__all__ = [
    "ACK_ERROR_MESSAGE_MAX",
    "BINARY_FORMAT_VERSION",
    "PROTOCOL_VERSION",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "AckError",
    "AdminResponse",
    "AlterGroupConfigsRequest",
    "AlterShareGroupOffsetsRequest",
    "DeleteShareGroupOffsetsRequest",
    "DeleteShareGroupRequest",
    "DescribeGroupConfigsRequest",
    "Fence",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "LeaderAnnouncement",
    "MemberTicketRequest",
    "Message",
    "ReleaseMember",
    "ResetSharePartition",
    "ResetSharePartitionResult",
    "ShareFetchCancel",
    "ShareFetchRequest",
    "ShareFetchResponse",
    "Tick",
    "WireAck",
    "WireAcquired",
    "decode",
    "decode_binary",
    "encode",
    "encode_binary",
]

#: Version of the member ↔ leader ↔ coordinator protocol this queueflow speaks. A member sends
#: it in every :class:`HeartbeatRequest`; the coordinator refuses members whose version is not in
#: :data:`SUPPORTED_PROTOCOL_VERSIONS` with ``UNSUPPORTED_VERSION``.
PROTOCOL_VERSION: Final = 1
#: Protocol versions this queueflow's coordinator and leaders can serve.
SUPPORTED_PROTOCOL_VERSIONS: Final = range(1, PROTOCOL_VERSION + 1)

# Kafka's own wire integers are int32/int64: anything outside int64 is refused rather than
# handed to the engine as an arbitrary-precision int.
_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]

#: Acknowledgement batch on the wire: (first_offset, last_offset, acknowledge types).
WireAck = tuple[int, int, tuple[int, ...]]
#: Acquired range on the wire: (first_offset, last_offset, delivery_count).
WireAcquired = tuple[int, int, int]

# The same shapes with range checks, used for the fields (mypy sees plain ints).
_WireAck = tuple[_Int64, _Int64, tuple[_Int64, ...]]
_WireAcquired = tuple[_Int64, _Int64, _Int64]


#: The longest exception message an :class:`AckError` carries (characters; longer ones are cut).
ACK_ERROR_MESSAGE_MAX: Final = 1000


class AckError(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Why a member RELEASEd or REJECTed records: its handler raised, or the record could not
    be decoded. The leader keeps the last one per offset (in memory) for the dead-letter
    headers ``queueflow.dead_letter.exception.type`` / ``.exception.message`` and ``.reason``
    (docs/guide.md "Dead-letter topics").

    Attributes:
        type: the exception's qualified type name (``""``: none, e.g. a plain REJECT).
        message: its message, at most :data:`ACK_ERROR_MESSAGE_MAX` characters.
        reason: ``undecodable`` for a record that could not be decoded, else ``""``.
    """

    type: str = ""
    message: str = ""
    reason: str = ""

    @classmethod
    def of(cls, exc: BaseException, reason: str = "") -> AckError:
        """The error of ``exc`` (``module.QualName`` and ``str(exc)`` cut to the limit)."""
        kind = type(exc)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        try:
            text = str(exc)
        except Exception:  # a broken __str__ must not lose the acknowledgement
            text = repr(kind)
        return cls(type=name, message=text[:ACK_ERROR_MESSAGE_MAX], reason=reason)


class _Message(
    msgspec.Struct,
    tag_field="kind",
    omit_defaults=True,
    kw_only=True,
    repr_omit_defaults=True,
):
    """Base of every wire message: the ``kind`` tag and the schema version ``v``.

    ``kw_only`` puts ``v`` after each message's own positional fields, so their positional order
    is unchanged; ``omit_defaults`` keeps version 1 bytes identical to the unversioned format.
    """

    #: Schema version of this message (>= 1); absent on the wire means 1.
    v: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)] = 1


class ShareFetchRequest(_Message, tag="fetch"):
    """ShareFetch (and ShareAcknowledge when ``max_records == 0``) for one share-partition.

    KIP-932 "ShareFetch API" / "ShareAcknowledge API".

    Args:
        group: share group id.
        topic / partition: the share-partition.
        member_id: the requesting member.
        request_id: correlation id, unique per member.
        reply_partition: partition of the reply topic the member reads.
        max_records: records to acquire (0: acknowledge only).
        acks: acknowledgement batches ``(first, last, (type, ...))`` to apply first, atomically.
        lock_duration_ms: the member's own lock duration in ms, or ``None`` for the group's.
        deadline_ms: wall-clock ms after which the member no longer waits; the leader drops the
            request without acquiring anything (its acknowledgements are still applied).
        max_wait_ms: KIP-932 ``MaxWaitMs``: when nothing can be acquired, a leader reached over
            the direct path (:mod:`queueflow.server.endpoint`) parks the request up to this
            many ms and answers as soon as records become available; 0 answers at once (and
            the request-topic path always does).
        ticket: the assignment ticket of the member's latest heartbeat answer
            (:attr:`HeartbeatResponse.ticket`, opaque bytes; empty: none). The leader checks it
            before acknowledging or acquiring (:mod:`queueflow.server.tickets`); leaders of
            earlier releases ignore it.
        ack_delay_ms: ``(first, last, delay_ms)``: the RELEASEs of these offsets make the
            records Available only ``delay_ms`` later (docs/concepts.md "Delayed
            redelivery"); offsets not named: 0, the group's back-off policy. Keyed by offsets
            rather than by batch so that it survives re-batching (a batch split after a
            refusal).
        ack_undelivered: ``(first, last)``: the RELEASEs of these offsets are of records never
            handed to a handler, whose delivery is given back (docs/concepts.md "Delivery
            counts").
        ack_errors: ``(first, last, error)``: why the RELEASEs / REJECTs of those offsets
            happened (:class:`AckError`); leaders of earlier releases ignore it.
        v: schema version (keyword only).
    """

    kind: ClassVar[str] = "fetch"

    group: str
    topic: str
    partition: _Int64
    member_id: str
    request_id: _Int64
    reply_partition: _Int64
    max_records: _Int64
    acks: list[_WireAck] = msgspec.field(default_factory=list)
    lock_duration_ms: _Int64 | None = None
    deadline_ms: _Int64 = 0
    max_wait_ms: _Int64 = 0
    ticket: bytes = b""
    ack_delay_ms: list[tuple[_Int64, _Int64, _Int64]] = msgspec.field(default_factory=list)
    ack_undelivered: list[tuple[_Int64, _Int64]] = msgspec.field(default_factory=list)
    ack_errors: list[tuple[_Int64, _Int64, AckError]] = msgspec.field(default_factory=list)


class ShareFetchResponse(_Message, tag="fetch_response"):
    """Answer to :class:`ShareFetchRequest` (KIP-932 "ShareFetch API" response).

    ``error`` concerns the fetch as a whole (e.g. ``NOT_LEADER_OR_FOLLOWER``); ``ack_error``
    concerns the acknowledgements, which are all applied or all refused. When they were refused,
    ``ack_stale`` names the offset ranges (inclusive) the member could no longer acknowledge,
    so that it can send its other outcomes again without them.

    ``acquired`` holds ``(first_offset, last_offset, delivery_count)`` ranges.
    ``lock_timeout_ms`` is the acquisition lock duration of the records in ``acquired``
    (KIP-1222 ``AcquisitionLockTimeoutMs``), in ms: they may be acknowledged for at least that
    long after the member sent the request. ``read_committed``: the group's
    ``share.isolation.level`` is ``read_committed``, so the member reads ``acquired`` with a
    ``read_committed`` fetch (aborted records and transaction markers come back as gaps, which
    it acknowledges as GAP).

    ``records`` and ``records_end`` (direct path only; the request topics never carry
    payloads): Kafka v2 record batches as the broker stored them (possibly compressed) that
    hold every record of the acquired offsets below ``records_end``; an acquired offset below
    ``records_end`` with no record in them (compacted away, a transaction marker) holds none.
    The member reads the acquired offsets at or after ``records_end`` itself. The batches may
    hold offsets that were not acquired: only the acquired ones are delivered. 0 (the
    default): nothing carried.
    """

    kind: ClassVar[str] = "fetch_response"

    member_id: str
    request_id: _Int64
    topic: str
    partition: _Int64
    acquired: list[_WireAcquired] = msgspec.field(default_factory=list)
    error: str = ErrorCode.NONE.value
    error_message: str = ""
    ack_error: str = ErrorCode.NONE.value
    ack_error_message: str = ""
    ack_stale: list[tuple[_Int64, _Int64]] = msgspec.field(default_factory=list)
    lock_timeout_ms: _Int64 = 0
    read_committed: bool = False
    records: bytes = b""
    records_end: _Int64 = 0


class ReleaseMember(_Message, tag="release_member"):
    """Coordinator → leader: release every record the member holds (it left or timed out).

    KIP-932 "Share group membership": a departed member's acquired records become Available.
    ``member_epoch`` is the group epoch when the member was removed: from then on the leader
    refuses the member's tickets of that epoch or older (``UNKNOWN_MEMBER_ID``), so a removed
    member can't acquire or acknowledge again before it rejoins (a rejoin gets a higher epoch).
    -1 (unknown, a coordinator of an earlier release): the records are released, no ticket is
    fenced.
    ``coordinator_epoch`` is the sender's coordinator epoch (-1: unknown); a leader refuses a
    release from a coordinator older than one it has seen for the group.
    """

    kind: ClassVar[str] = "release_member"

    group: str
    topic: str
    partition: _Int64
    member_id: str
    reason: str = ""
    member_epoch: _Int64 = -1
    coordinator_epoch: _Int64 = -1


class Tick(_Message, tag="tick"):
    """A timer event sent into a partition the sender owns, so timed work (lock expiry,
    session expiry) runs inside a Faust stream event of that partition. ``sent_ms`` is wall-clock
    ms."""

    kind: ClassVar[str] = "tick"

    sent_ms: _Int64 = 0


class Fence(_Message, tag="fence"):
    """A new leader → its request partition (or a new coordinator → its coordinator
    partition): requests after this one are mine.

    ``leader_epoch`` is the Faust consumer generation the sender was assigned the partition in
    (the coordinator epoch on the coordinator topic; see :mod:`queueflow.engine.fencing`);
    ``sent_ms`` is wall-clock ms.
    """

    kind: ClassVar[str] = "fence"

    leader_epoch: _Int64
    sent_ms: _Int64 = 0


class HeartbeatRequest(_Message, tag="heartbeat"):
    """ShareGroupHeartbeat (KIP-932 "ShareGroupHeartbeat API").

    ``member_epoch`` 0 joins, -1 leaves, otherwise the current epoch. ``reply_key`` is the
    member's X25519 public key (32 bytes; empty: none), sent with ``queueflow.auth.mode=hmac``:
    the coordinator seals its answer to it and binds it into the ticket, so the leaders seal the
    member's ShareFetch answers to it too (:mod:`queueflow.protocol.sealed_replies`).
    ``protocol_version`` is
    the member's :data:`PROTOCOL_VERSION`; the coordinator answers ``UNSUPPORTED_VERSION`` when
    it is not in its :data:`SUPPORTED_PROTOCOL_VERSIONS`. It is decoded unchecked so that the
    coordinator can answer rather than drop the request. ``assignors`` are the share-group
    assignors the member supports (``queueflow.member.assignors``; absent: an older member,
    which supports ``simple`` only) and ``rack_id`` its rack (``client.rack``; KIP-848's
    RackId); see :mod:`queueflow.engine.assignors`. ``principal`` is the Kafka principal the
    member's clients authenticate as (``User:<name>`` with SASL; empty: not known), which the
    coordinator binds into the member's assignment tickets.
    """

    kind: ClassVar[str] = "heartbeat"

    group: str
    member_id: str
    member_epoch: _Int64
    subscribed_topics: list[str]
    reply_partition: _Int64
    request_id: _Int64
    client_id: str = ""
    host: str = ""
    protocol_version: _Int64 = PROTOCOL_VERSION
    assignors: list[str] = msgspec.field(default_factory=list)
    rack_id: str = ""
    reply_key: bytes = b""
    principal: str = ""


class HeartbeatResponse(_Message, tag="heartbeat_response"):
    """The member's epoch and its assigned share-partitions ``{topic: [partition, ...]}``.

    KIP-932 "ShareGroupHeartbeat API" response; ``heartbeat_interval_ms`` is in ms.
    ``leaders`` gives, for the assigned share-partitions whose leader announced one, the
    ``host:port`` of the leader's direct endpoint: ``[(topic, partition, address), ...]``
    (KIP-932 members learn share-partition leaders from metadata; here from the coordinator).
    ``ticket`` (successful answers only) is the coordinator's signed assignment ticket
    (:func:`queueflow.protocol.auth.issue_ticket`: group, member id, member epoch, assigned
    share-partitions, expiry one session timeout away), opaque to the member, which attaches
    the latest one to every :class:`ShareFetchRequest`. ``coordinator_epoch`` is the answering
    coordinator's epoch (-1: unknown); a member ignores answers of a coordinator older than
    one it has heard from.
    """

    kind: ClassVar[str] = "heartbeat_response"

    member_id: str
    request_id: _Int64
    member_epoch: _Int64 = 0
    assignment: dict[str, list[_Int64]] = msgspec.field(default_factory=dict)
    heartbeat_interval_ms: _Int64 = 5000
    error: str = ErrorCode.NONE.value
    error_message: str = ""
    leaders: list[tuple[str, _Int64, str]] = msgspec.field(default_factory=list)
    ticket: bytes = b""
    coordinator_epoch: _Int64 = -1


class MemberTicketRequest(_Message, tag="member_ticket"):
    """Worker → coordinator: the current assignment ticket of a live member, for another worker
    that acts for the member at its own share-partition leaders (the Kafka-protocol listener of
    the worker a Kafka share consumer fetches from, when that is not the worker it heartbeats
    to; docs/kafka-listener.md "Metadata names each share-partition's leader").

    Only a worker may ask (its kind is not a member kind, so a member envelope carrying it is
    refused ``wrong_role``). The coordinator answers with a :class:`HeartbeatResponse`, without
    changing the group: the member's epoch, assignment, leader addresses and a ticket like the
    member's own but binding ``reply_key`` (the requesting worker's key for this member), so the
    leaders seal their answers to the requester; ``UNKNOWN_MEMBER_ID`` when the member is not in
    the group (it left, timed out, or never joined).
    """

    kind: ClassVar[str] = "member_ticket"

    group: str
    member_id: str
    reply_partition: _Int64
    request_id: _Int64
    reply_key: bytes = b""
    #: Who asks (the requesting listener's ``host:port``), for log lines.
    requester: str = ""


class ShareFetchCancel(_Message, tag="fetch_cancel"):
    """Member → leader, on the direct path: answer the member's parked (long-poll) ShareFetch
    ``request_id`` of ``topic[partition]`` now, with whatever it already holds (its
    acknowledgement results, nothing acquired). Sent when the member lost the share-partition,
    so that a parked request can't acquire records for a member that no longer fetches them. A
    request that is not parked is answered as usual.
    """

    kind: ClassVar[str] = "fetch_cancel"

    member_id: str
    request_id: _Int64
    topic: str
    partition: _Int64


class LeaderAnnouncement(_Message, tag="leader_announcement"):
    """Leader → coordinator: this worker serves share-partitions of ``topic`` at ``address``.

    ``partitions`` are the source partitions it is live on, ``leader_epoch`` the Faust consumer
    generation it leads them in (a higher epoch replaces a lower one), ``address`` the
    ``host:port`` of its direct endpoint. Sent when the leader goes live and every few seconds
    (the coordinator keeps them in memory only). ``lag`` reports, for the share-partitions of
    those partitions it has loaded, ``(group, partition, lag)`` with KIP-1226's lag (records
    not yet delivered to completion), the input of the ``lag`` assignor; an older coordinator
    ignores it.
    """

    kind: ClassVar[str] = "leader_announcement"

    topic: str
    partitions: list[_Int64]
    leader_epoch: _Int64
    address: str
    sent_ms: _Int64 = 0
    lag: list[tuple[str, _Int64, _Int64]] = msgspec.field(default_factory=list)
    #: The ``host:port`` Kafka clients reach this worker's Kafka-protocol listener at (empty:
    #: none; ``queueflow.kafka.listener``): listeners name it as the share-partitions' leader
    #: in Metadata. An older coordinator ignores it.
    kafka_listener: str = ""
    #: ``(coordinator partition, coordinator epoch)`` of the coordinator partitions this worker
    #: serves, live: listeners name its listener in FindCoordinator for their groups.
    coordinator_partitions: list[tuple[_Int64, _Int64]] = msgspec.field(default_factory=list)


class AlterShareGroupOffsetsRequest(_Message, tag="alter_offsets"):
    """Admin → coordinator: set the SPSO of share-partitions of an empty group (KIP-932
    AlterShareGroupOffsets, ``Admin.alterShareGroupOffsets``).

    Args:
        group: the share group.
        admin_id: the admin client's id; the answer is keyed by it on the reply topic.
        request_id: correlation id, unique per admin client.
        reply_partition: the reply-topic partition the admin reads.
        offsets: ``(topic, partition, new start offset)`` triples; offsets >= 0.
        deadline_ms: wall-clock ms after which the admin no longer waits: the coordinator
            refuses joins of ``group`` until every leader answered or this deadline passed,
            and a leader that reads its reset after it does not apply it.
    """

    kind: ClassVar[str] = "alter_offsets"

    group: str
    admin_id: str
    request_id: _Int64
    reply_partition: _Int64
    offsets: list[tuple[str, _Int64, _Int64]]
    deadline_ms: _Int64 = 0


class DeleteShareGroupOffsetsRequest(_Message, tag="delete_offsets"):
    """Admin → coordinator: delete the share-partition state of ``topics`` of an empty group
    (KIP-932 DeleteShareGroupOffsets, ``Admin.deleteShareGroupOffsets``). Fields as
    :class:`AlterShareGroupOffsetsRequest`."""

    kind: ClassVar[str] = "delete_offsets"

    group: str
    admin_id: str
    request_id: _Int64
    reply_partition: _Int64
    topics: list[str]
    deadline_ms: _Int64 = 0


class DeleteShareGroupRequest(_Message, tag="delete_group"):
    """Admin → coordinator: delete an empty share group, its metadata and the state of all its
    share-partitions (``Admin.deleteShareGroups``, one group per request). Fields as
    :class:`AlterShareGroupOffsetsRequest`."""

    kind: ClassVar[str] = "delete_group"

    group: str
    admin_id: str
    request_id: _Int64
    reply_partition: _Int64
    deadline_ms: _Int64 = 0


class DescribeGroupConfigsRequest(_Message, tag="describe_group_configs"):
    """Admin → coordinator: the group configs of a share group, each with its effective value
    and source (Kafka's ``describeConfigs`` of a ``GROUP`` resource; docs/operations.md "Group
    configs"). Answered with
    :attr:`AdminResponse.configs`. Fields as :class:`AlterShareGroupOffsetsRequest`."""

    kind: ClassVar[str] = "describe_group_configs"

    group: str
    admin_id: str
    request_id: _Int64
    reply_partition: _Int64
    deadline_ms: _Int64 = 0


class AlterGroupConfigsRequest(_Message, tag="alter_group_configs"):
    """Admin → coordinator: set and delete group configs of a share group (Kafka's
    ``incrementalAlterConfigs`` of a ``GROUP`` resource, SET and DELETE; docs/operations.md
    "Group configs"). The
    coordinator validates them against the broker-level bounds (``INVALID_CONFIG``, nothing
    changed) and stores them with the group; the answer's :attr:`AdminResponse.configs` are the
    configs after the change.

    Args:
        set_configs: config name -> value (as text, e.g. ``"3"``, ``"by_duration:PT1H"``).
        delete_configs: config names to return to their default.
        (others as :class:`AlterShareGroupOffsetsRequest`)
    """

    kind: ClassVar[str] = "alter_group_configs"

    group: str
    admin_id: str
    request_id: _Int64
    reply_partition: _Int64
    set_configs: dict[str, str] = msgspec.field(default_factory=dict)
    delete_configs: list[str] = msgspec.field(default_factory=list)
    deadline_ms: _Int64 = 0


class ParkedKeyRequest(_Message, tag="parked_key"):
    """Admin → coordinator: release or skip a parked key of a key-ordered share group
    (``share.ordering=key``; docs/concepts.md "Key-ordered sharing"). The coordinator forwards
    it to the leaders of ``topic``'s share-partitions (``partition`` -1: all of them) as a
    :class:`ResetSharePartition` with ``key_action`` set; the group need not be empty.

    Args:
        topic: the source topic.
        partition: one partition, or -1 for every partition of ``topic``.
        key_hash: the key's 64-bit hash as 16 hex digits
            (:func:`~queueflow.engine.key_order.key_hash`).
        action: ``release`` (its waiting records proceed) or ``skip`` (they are Archived).
        (others as :class:`AlterShareGroupOffsetsRequest`)
    """

    kind: ClassVar[str] = "parked_key"

    group: str
    admin_id: str
    request_id: _Int64
    reply_partition: _Int64
    topic: str
    key_hash: str
    action: str
    partition: _Int64 = -1
    deadline_ms: _Int64 = 0


class AdminResponse(_Message, tag="admin_response"):
    """Coordinator → admin: the outcome of an admin request.

    ``error`` concerns the request as a whole (``GROUP_ID_NOT_FOUND``, ``NON_EMPTY_GROUP``,
    ``UNKNOWN_TOPIC_OR_PARTITION``, ``REQUEST_TIMED_OUT``...; nothing was changed unless it is
    ``REQUEST_TIMED_OUT``, which names the share-partitions whose leaders did not answer).
    ``results`` has one ``(topic, partition, error, error message, start offset)`` per
    share-partition the request reached (start offset -1 when the state was deleted or not
    changed).
    """

    kind: ClassVar[str] = "admin_response"

    admin_id: str
    request_id: _Int64
    error: str = ErrorCode.NONE.value
    error_message: str = ""
    results: list[tuple[str, _Int64, str, str, _Int64]] = msgspec.field(default_factory=list)
    #: Group config requests: ``(name, effective value, source, broker-level synonym)`` for
    #: every group config (see :class:`~queueflow.engine.group_config.ConfigEntry`).
    configs: list[tuple[str, str, str, str]] = msgspec.field(default_factory=list)


class ResetSharePartition(_Message, tag="reset_share_partition"):
    """Coordinator → share-partition leader: reset (``start_offset`` >= 0) or delete
    (``start_offset`` ``None``) the state of ``group``'s share-partition ``topic[partition]``,
    on behalf of the admin request ``(admin_id, request_id)``. The leader refuses while a record
    is Acquired (``NON_EMPTY_GROUP``) and after ``deadline_ms`` (``REQUEST_TIMED_OUT``), and
    answers the coordinator with :class:`ResetSharePartitionResult`. ``coordinator_epoch``:
    as in :class:`ReleaseMember` (a reset from an older coordinator is refused unapplied)."""

    kind: ClassVar[str] = "reset_share_partition"

    group: str
    topic: str
    partition: _Int64
    admin_id: str
    request_id: _Int64
    start_offset: _Int64 | None = None
    deadline_ms: _Int64 = 0
    coordinator_epoch: _Int64 = -1
    #: ``release`` / ``skip``: not a reset but a :class:`ParkedKeyRequest` for the key with
    #: hash ``key_hash`` (16 hex digits); the answer's ``start_offset`` is then the records the
    #: skip Archived (0 for a release), or -1 when the key was not parked there.
    key_action: str = ""
    key_hash: str = ""


class ResetSharePartitionResult(_Message, tag="reset_share_partition_result"):
    """Leader → coordinator: the outcome of a :class:`ResetSharePartition`; ``start_offset``
    is the SPSO now (-1 after a delete or a refusal)."""

    kind: ClassVar[str] = "reset_share_partition_result"

    group: str
    topic: str
    partition: _Int64
    admin_id: str
    request_id: _Int64
    error: str = ErrorCode.NONE.value
    error_message: str = ""
    start_offset: _Int64 = -1


Message = (
    ShareFetchRequest
    | ShareFetchResponse
    | ReleaseMember
    | Tick
    | Fence
    | HeartbeatRequest
    | HeartbeatResponse
    | MemberTicketRequest
    | LeaderAnnouncement
    | ShareFetchCancel
    | AlterShareGroupOffsetsRequest
    | DeleteShareGroupOffsetsRequest
    | DeleteShareGroupRequest
    | DescribeGroupConfigsRequest
    | AlterGroupConfigsRequest
    | ParkedKeyRequest
    | AdminResponse
    | ResetSharePartition
    | ResetSharePartitionResult
)


class _Kind(msgspec.Struct):
    """Reads only the ``kind`` of a message (to name it in error messages)."""

    kind: str = "?"


# Created once: the encoder/decoder compile their type information at construction.
_encoder: Final = msgspec.json.Encoder()
_decoder: Final[msgspec.json.Decoder[Message]] = msgspec.json.Decoder(Message)
_kind_decoder: Final = msgspec.json.Decoder(_Kind)
_binary_encoder: Final = msgspec.msgpack.Encoder()
_binary_decoder: Final[msgspec.msgpack.Decoder[Message]] = msgspec.msgpack.Decoder(Message)

#: First byte of every binary message (the direct path's frames): the version of the binary
#: format. Version 1 is MessagePack of the same structs as the JSON form (``kind`` tag, ``v``,
#: defaults left out), so the schema rules above apply unchanged; a reader refuses a version it
#: doesn't know with a message naming it.
BINARY_FORMAT_VERSION: Final = 1
_BINARY_PREFIX: Final = bytes([BINARY_FORMAT_VERSION])


def encode_binary(message: Message) -> bytes:
    """Encode a message in the compact binary form of the direct path (format version byte,
    then MessagePack): a ShareFetch with 90 acknowledgement runs is about half its JSON size.

    Raises:
        TypeError: ``message`` is not a queueflow message.
    """
    return _BINARY_PREFIX + _binary_encoder.encode(message)


def decode_binary(data: bytes | bytearray | memoryview) -> Message:
    """Decode :func:`encode_binary` bytes.

    Raises:
        InvalidRequestError: empty, an unknown format version, not MessagePack, or a message
            that breaks the schema (as :func:`decode`); the message says which.
    """
    if not data:
        raise InvalidRequestError("empty binary queueflow control message")
    if data[0] != BINARY_FORMAT_VERSION:
        raise InvalidRequestError(
            f"binary queueflow control message of format version {data[0]}; this queueflow "
            f"reads version {BINARY_FORMAT_VERSION}: run the same queueflow version on leaders "
            "and members"
        )
    try:
        return _binary_decoder.decode(memoryview(data)[1:])
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(_problem(bytes(data[:120]), str(exc))) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidRequestError(
            _problem(bytes(data[:120]), f"not a binary message ({reason})")
        ) from None


def encode(message: Message) -> bytes:
    """Encode a message as compact JSON bytes (fields equal to their defaults are left out).

    Raises:
        TypeError: ``message`` is not a queueflow message.
    """
    return _encoder.encode(message)


def decode(data: bytes | bytearray | memoryview | str | Mapping[str, Any]) -> Message:
    """Decode bytes (or text, or an already-parsed mapping) into a message.

    Unknown fields are ignored; a missing ``v`` means version 1.

    Raises:
        InvalidRequestError: not JSON (or truncated), not an object, no or an unknown ``kind``,
            a missing required field or a field of the wrong type. The message names the kind,
            the field path (``$.acks[0][2]``) and what was expected.
    """
    try:
        if isinstance(data, Mapping):
            message: Message = msgspec.convert(data, Message)
            return message
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(_problem(data, str(exc))) from None
    except (msgspec.DecodeError, TypeError, RecursionError, UnicodeDecodeError) as exc:
        # TypeError: not bytes/str (e.g. a tombstone's None); RecursionError: absurd nesting;
        # UnicodeDecodeError: a string of invalid UTF-8 inside otherwise valid JSON.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidRequestError(_problem(data, f"not a JSON message ({reason})")) from None


def _problem(data: object, reason: str) -> str:
    kind = "?"
    try:
        if isinstance(data, Mapping):
            kind = str(data.get("kind", "?"))
        elif isinstance(data, (bytes, bytearray, memoryview, str)):
            kind = _kind_decoder.decode(data).kind
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        pass
    # Slice before repr: a huge message must not make a huge log line.
    if isinstance(data, (bytes, bytearray, memoryview)):
        preview = repr(bytes(data[:120]))
    elif isinstance(data, str):
        preview = repr(data[:120])
    else:
        preview = repr(data)[:120]
    return (
        f"undecodable queueflow control message (kind {kind!r}): {reason}; got {preview}. "
        f"Is a peer running an incompatible queueflow version (this one speaks protocol "
        f"version {PROTOCOL_VERSION}) or something else writing to this topic?"
    )
