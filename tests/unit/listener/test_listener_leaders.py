"""Metadata naming each share-partition's leader node, NOT_LEADER_OR_FOLLOWER for a
share-partition fetched from another node, and a listener acting for a member that heartbeats
to another one (its ticket asked of the coordinator), without a broker
(docs/kafka-listener.md "Which node leads a share-partition")."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i8, i32, i64
from listener_stubs import unit_limits
from test_listener_protocol import (
    TOPIC,
    StubSession,
    exchange,
    heartbeat,
    request,
    request_frame,
    response_of,
)

from queueflow.errors import ErrorCode as QfErrorCode
from queueflow.errors import ShareGroupError
from queueflow.listener import KafkaListener
from queueflow.listener.delegated import FIRST_REQUEST_ID, DelegatedMembership
from queueflow.listener.fetch import CLIENT_FETCH_ERRORS, fetch_partition_error
from queueflow.listener.leadership import Cluster, Leader, Node, node_id_of
from queueflow.listener.metadata import TopicIds, find_coordinator_response, metadata_response
from queueflow.listener.server import Leaders
from queueflow.member.session import FetchResult
from queueflow.protocol import messages as protocol
from queueflow.protocol.roles import ControlAuth
from queueflow.settings import ShareGroupSettings
from queueflow.structs import AcknowledgeType, TopicPartition

ME = Node(node_id_of("10.0.0.1:9192"), "10.0.0.1", 9192)
OTHER = "10.0.0.2:9192"
OTHER_ID = node_id_of(OTHER)


def tp(p: int) -> TopicPartition:
    return TopicPartition(TOPIC, p)


# -- the cluster view and Metadata ------------------------------------------------------------
def test_node_ids_are_stable_non_negative_int32_of_the_address() -> None:
    assert node_id_of("10.0.0.2:9192") == node_id_of("10.0.0.2:9192") == OTHER_ID
    assert node_id_of("10.0.0.2:9193") != OTHER_ID
    assert all(0 <= node_id_of(f"h{i}:1") < 2**31 for i in range(1000))


def test_the_cluster_names_local_and_announced_leaders_and_serves_the_rest_itself() -> None:
    cluster = Cluster.build(
        ME,
        local={tp(0): 4},
        remote={tp(0): (3, OTHER), tp(1): (5, OTHER), tp(2): (5, ME.address)},
    )
    assert cluster.leader_of(tp(0)) == Leader(ME, 4)  # local wins over a stale announcement
    other = cluster.leader_of(tp(1))
    assert (other.node.node_id, other.node.address, other.epoch) == (OTHER_ID, OTHER, 5)
    assert cluster.leader_of(tp(2)) == Leader(ME, 5)  # its own announcement
    assert cluster.leader_of(tp(3)) == Leader(ME, -1)  # unknown: served here, no epoch
    assert cluster.moved(tp(1)) == other and cluster.moved(tp(3)) is None
    assert [n.node_id for n in cluster.nodes()] == sorted([ME.node_id, OTHER_ID])
    assert cluster.nodes([tp(0)]) == (ME,)
    gateway = Cluster.build(ME, {}, {tp(1): (5, OTHER)}, gateway=True)
    assert gateway.leader_of(tp(1)) == Leader(ME, 0) and gateway.moved(tp(1)) is None
    assert gateway.nodes() == (ME,)


def test_metadata_lists_every_listener_node_and_each_partitions_leader() -> None:
    cluster = Cluster.build(ME, {tp(0): 7}, {tp(1): (8, OTHER), tp(3): (8, "junk")})
    body = request(
        3,
        13,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    answer = metadata_response(13, body, {TOPIC: 4}, cluster, TopicIds("app"), "app")
    _, decoded = response_of(3, 13, request_frame_free(answer))
    assert {(b.node_id, b.host, b.port) for b in decoded.brokers} == {
        (ME.node_id, "10.0.0.1", 9192),
        (OTHER_ID, "10.0.0.2", 9192),
    }
    (topic,) = decoded.topics
    assert [(p.partition_index, p.leader_id, p.leader_epoch) for p in topic.partitions] == [
        (0, ME.node_id, 7),
        (1, OTHER_ID, 8),
        (2, ME.node_id, -1),  # leader unknown here: this node serves it
        (3, ME.node_id, -1),  # an address that is none
    ]
    assert all(p.replica_nodes == (p.leader_id,) for p in topic.partitions)
    assert decoded.controller_id == ME.node_id


def request_frame_free(answer: Any) -> bytes:
    from queueflow.listener.codec import encode_response

    return encode_response(1, answer)


def test_find_coordinator_names_the_listener_of_the_groups_coordinator_worker() -> None:
    other = Node(OTHER_ID, "10.0.0.2", 9192)
    body = request(10, 4, key_type=0, coordinator_keys=("g", "h"))
    answer = find_coordinator_response(4, body, lambda key: other if key == "g" else ME)
    _, decoded = response_of(10, 4, request_frame_free(answer))
    assert [(c.key, c.node_id, c.host, c.port) for c in decoded.coordinators] == [
        ("g", OTHER_ID, "10.0.0.2", 9192),
        ("h", ME.node_id, "10.0.0.1", 9192),
    ]


# -- the listener: NOT_LEADER_OR_FOLLOWER and acting for members --------------------------------
class Leadership:
    """What the listener is told leads what (mutable between requests)."""

    def __init__(self) -> None:
        self.local: dict[TopicPartition, int] = {}
        self.remote: dict[TopicPartition, tuple[int, str]] = {}

    def __call__(
        self,
    ) -> tuple[Mapping[TopicPartition, int], Mapping[TopicPartition, tuple[int, str]]]:
        return self.local, self.remote


def recording(session: StubSession) -> StubSession:
    """``session`` remembering whether its close left the group (``left``)."""
    session.left = None  # type: ignore[attr-defined]

    async def close(leave: bool = True) -> None:
        session.closed, session.left = True, leave  # type: ignore[attr-defined]

    session.close = close  # type: ignore[method-assign]
    return session


class Served:
    def __init__(self) -> None:
        self.sessions: list[StubSession] = []
        self.delegated: list[tuple[str, StubSession]] = []
        self.unknown: set[str] = set()  # members the coordinator does not have

    def factory(self, group: str, topics: list[str], client_id: str, on_ack: Any, **kw: Any) -> Any:
        self.sessions.append(recording(StubSession(group, topics, client_id, on_ack)))
        self.sessions[-1].member_id = kw["member_id"]
        self.sessions[-1].assignment = {tp(0), tp(1)}
        return self.sessions[-1]

    def delegate(
        self, group: str, topics: list[str], client_id: str, on_ack: Any, *, member_id: str
    ) -> Any:
        session = recording(StubSession(group, topics, client_id, on_ack))
        session.member_id = member_id
        session.assignment = {tp(0), tp(1)}
        unknown = member_id in self.unknown

        async def start() -> None:
            if unknown:
                raise ShareGroupError(QfErrorCode.UNKNOWN_MEMBER_ID, "not in the group")

        session.start = start  # type: ignore[method-assign]
        self.delegated.append((member_id, session))
        return session


@pytest.fixture
def cluster_listener() -> Iterator[tuple[KafkaListener, Served, Leadership]]:
    served, leadership = Served(), Leadership()

    async def topics() -> dict[str, int]:
        return {TOPIC: 2}

    loop = asyncio.new_event_loop()
    leaders: Leaders = leadership
    kl = KafkaListener(
        "PLAINTEXT://127.0.0.1:0",
        "127.0.0.1",
        "app",
        topics,
        served.factory,
        object(),  # type: ignore[arg-type]  # no admin API is asked here
        heartbeat_interval_ms=500,
        session_timeout_ms=60_000,
        limits=unit_limits(),
        max_connections=4,
        monotonic=loop.time,
        leaders=leaders,
        delegate=served.delegate,
        coordinators=lambda group: OTHER if group == "far" else None,
    )
    loop.run_until_complete(kl.start())
    kl.loop = loop  # type: ignore[attr-defined]
    yield kl, served, leadership
    loop.run_until_complete(kl.close())
    loop.close()


def fetch_two(
    epoch: int, member: str = "m1", acks: Mapping[int, tuple[int, int, int]] = {}
) -> bytes:
    """A ShareFetch v2 of partitions 0 and 1, with ``acks`` {partition: (first, last, type)}."""
    m = load_payload_module(78, 2, EntityType.request)
    parts = tuple(
        m.FetchPartition(
            partition_index=i32(p),
            acknowledgement_batches=tuple(
                m.AcknowledgementBatch(
                    first_offset=i64(f), last_offset=i64(last), acknowledge_types=(i8(k),)
                )
                for f, last, k in ([acks[p]] if p in acks else [])
            ),
        )
        for p in (0, 1)
    )
    return request_frame(
        78,
        2,
        m.ShareFetchRequest(
            group_id="g",
            member_id=member,
            share_session_epoch=i32(epoch),
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=i32(1),
            max_records=i32(10),
            batch_size=i32(10),
            topics=(m.FetchTopic(topic_id=TopicIds("app").id_of(TOPIC), partitions=parts),),
            forgotten_topics_data=(),
        ),
    )


def run(kl: KafkaListener, *frames: bytes) -> list[bytes]:
    return kl_loop(kl).run_until_complete(exchange(kl.port, *frames))


class Connection:
    """One client connection kept open across requests: a share session lives as long as the
    connection that opened it (Kafka 4.x; ``KafkaListener`` closes it with the connection)."""

    def __init__(self, kl: KafkaListener) -> None:
        self.kl = kl
        self.reader, self.writer = kl_loop(kl).run_until_complete(
            asyncio.open_connection("127.0.0.1", kl.port)
        )

    def ask(self, *frames: bytes) -> list[bytes]:
        """Send ``frames``; their answers, each within 5 s."""

        async def exchange_here() -> list[bytes]:
            for frame in frames:
                self.writer.write(frame)
            await self.writer.drain()
            answers = []
            for _ in frames:
                size = await asyncio.wait_for(self.reader.readexactly(4), 5)
                answers.append(size + await self.reader.readexactly(int.from_bytes(size, "big")))
            return answers

        return kl_loop(self.kl).run_until_complete(exchange_here())

    def close(self) -> None:
        self.writer.close()
        kl_loop(self.kl).run_until_complete(self.writer.wait_closed())


def kl_loop(kl: KafkaListener) -> asyncio.AbstractEventLoop:
    return kl.loop  # type: ignore[attr-defined,no-any-return]


def partitions_of(answer: Any) -> dict[int, Any]:
    return {p.partition_index: p for t in answer.responses for p in t.partitions}


def test_find_coordinator_names_the_coordinators_worker_when_known(cluster_listener: Any) -> None:
    kl, _, _ = cluster_listener
    body = request(10, 4, key_type=0, coordinator_keys=("far", "near"))
    (answer,) = run(kl, request_frame(10, 4, body))
    far, near = response_of(10, 4, answer)[1].coordinators
    assert (far.node_id, far.host, far.port) == (OTHER_ID, "10.0.0.2", 9192)
    assert (near.node_id, near.host, near.port) == (kl.node.node_id, "127.0.0.1", kl.port)


def test_a_share_partition_led_elsewhere_is_not_fetched_here_and_the_leader_is_named(
    cluster_listener: Any,
) -> None:
    kl, served, leadership = cluster_listener
    leadership.local = {tp(0): 6}
    leadership.remote = {tp(1): (6, OTHER)}
    join, opened, acked = run(kl, heartbeat(0), fetch_two(0), fetch_two(1, acks={1: (0, 0, 1)}))
    assert response_of(76, 1, join)[1].error_code == ErrorCode.none
    answer = response_of(78, 2, opened)[1]
    here, there = partitions_of(answer)[0], partitions_of(answer)[1]
    assert here.error_code == ErrorCode.none and len(here.acquired_records) == 1
    assert (here.current_leader.leader_id, here.current_leader.leader_epoch) == (
        kl.node.node_id,
        6,
    )
    assert there.error_code == ErrorCode.not_leader_or_follower
    assert there.acquired_records == () and there.records in (None, b"")
    assert (there.current_leader.leader_id, there.current_leader.leader_epoch) == (OTHER_ID, 6)
    assert {(n.node_id, n.host, n.port) for n in answer.node_endpoints} == {
        (kl.node.node_id, "127.0.0.1", kl.port),
        (OTHER_ID, "10.0.0.2", 9192),
    }
    # an acknowledgement of a share-partition that moved is still applied (through queueflow's
    # path to its leader), and only partition 0 acquires
    after = partitions_of(response_of(78, 2, acked)[1])
    assert after[1].error_code == ErrorCode.not_leader_or_follower
    assert after[1].acknowledge_error_code == ErrorCode.none
    assert served.sessions[0].acked == [(0, AcknowledgeType.ACCEPT)]
    assert served.sessions[0].next_offset == 2  # two fetches of partition 0, none of 1


def test_a_member_heartbeating_elsewhere_is_acted_for_here_with_its_own_member_id(
    cluster_listener: Any,
) -> None:
    kl, served, leadership = cluster_listener
    leadership.local = {tp(0): 2, tp(1): 2}
    served.unknown = {"ghost"}
    conn = Connection(kl)
    (opened, ghost) = conn.ask(fetch_two(0, member="elsewhere"), fetch_two(0, member="ghost"))
    answer = response_of(78, 2, opened)[1]
    assert answer.error_code == ErrorCode.none
    assert all(len(p.acquired_records) == 1 for p in partitions_of(answer).values())
    [(member_id, session), (ghost_id, ghost_session)] = served.delegated
    assert member_id == "elsewhere" and session.member_id == "elsewhere"
    member = kl.members.get("g", "elsewhere")
    assert member is not None and member.delegated and not served.sessions
    # a member the coordinator does not have: UNKNOWN_MEMBER_ID, nothing kept
    assert response_of(78, 2, ghost)[1].error_code == ErrorCode.unknown_member_id
    assert ghost_id == "ghost" and ghost_session.closed and kl.members.get("g", "ghost") is None
    # the next request of its share session is served by the same session
    (again,) = conn.ask(fetch_two(1, member="elsewhere"))
    assert response_of(78, 2, again)[1].error_code == ErrorCode.none
    assert len(served.delegated) == 2
    # closing its share session here closes what acts for it (without leaving the group)
    (_, closed) = run(kl, fetch_two(0, member="ghost2"), fetch_two(-1, member="ghost2"))
    assert response_of(78, 2, closed)[1].error_code == ErrorCode.none
    [_, _, (_, closing)] = served.delegated
    assert closing.closed and closing.left is False and kl.members.get("g", "ghost2") is None
    # it now heartbeats here (its listener went away): it joins again, never leaving from here
    (moved, joined) = run(
        kl,
        heartbeat(3, member_id="elsewhere"),
        heartbeat(0, member_id="elsewhere"),
    )
    assert response_of(76, 1, moved)[1].error_code == ErrorCode.unknown_member_id
    assert session.closed and session.left is False
    assert response_of(76, 1, joined)[1].error_code == ErrorCode.none
    assert served.sessions[0].member_id == "elsewhere"
    conn.close()


def test_an_acted_for_member_is_closed_after_a_session_timeout_without_requests(
    cluster_listener: Any,
) -> None:
    kl, served, leadership = cluster_listener
    leadership.local = {tp(0): 2, tp(1): 2}
    run(kl, fetch_two(0, member="elsewhere"))
    member = kl.members.get("g", "elsewhere")
    assert member is not None
    member.last_seen -= 61
    kl_loop(kl).run_until_complete(kl.members.reap())
    [(_, session)] = served.delegated
    assert kl.members.get("g", "elsewhere") is None and session.closed and session.left is False


def test_an_acted_for_member_the_coordinator_no_longer_has_is_unknown_here(
    cluster_listener: Any,
) -> None:
    kl, served, leadership = cluster_listener
    leadership.local = {tp(0): 2, tp(1): 2}
    conn = Connection(kl)
    conn.ask(fetch_two(0, member="elsewhere"))
    [(_, session)] = served.delegated
    membership = delegated(StubRequester([]), ControlAuth(None, "kafka-listener"))
    session.router = SimpleNamespace(membership=membership)  # type: ignore[attr-defined]
    membership.gone = True  # its last ticket request: UNKNOWN_MEMBER_ID
    (refused,) = conn.ask(fetch_two(1, member="elsewhere"))
    conn.close()
    assert response_of(78, 2, refused)[1].error_code == ErrorCode.unknown_member_id
    assert session.closed and session.left is False and kl.members.get("g", "elsewhere") is None


@pytest.mark.parametrize(
    ("leader", "answered"),
    [
        (None, ErrorCode.none),
        (QfErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.unknown_topic_or_partition),
        (QfErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.not_leader_or_follower),
        # what Java's ShareFetchCollector would end the consumer on: fetched again instead
        (QfErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.not_leader_or_follower),
        (QfErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.not_leader_or_follower),
        (QfErrorCode.REQUEST_TIMED_OUT, ErrorCode.not_leader_or_follower),
    ],
)
def test_share_partition_errors_are_ones_kafka_clients_handle(
    leader: QfErrorCode | None, answered: ErrorCode
) -> None:
    error = None if leader is None else ShareGroupError(leader, "x")
    assert fetch_partition_error(error) is answered
    assert answered in CLIENT_FETCH_ERRORS


def test_a_leaders_membership_refusal_reaches_the_client_as_a_retriable_error(
    cluster_listener: Any,
) -> None:
    kl, served, leadership = cluster_listener
    leadership.local = {tp(0): 2, tp(1): 2}
    run(kl, heartbeat(0))

    async def refused(tp: TopicPartition, max_records: int, max_wait_ms: int) -> Any:
        return FetchResult(error=ShareGroupError(QfErrorCode.UNKNOWN_MEMBER_ID, "removed"))

    served.sessions[0].fetch = refused  # type: ignore[method-assign]
    (answer,) = run(kl, fetch_two(0))
    parts = partitions_of(response_of(78, 2, answer)[1])
    assert {p.error_code for p in parts.values()} == {ErrorCode.not_leader_or_follower}


# -- the delegated membership: tickets from the coordinator ----------------------------------
class StubRequester:
    """Records the requests and answers them with ``answers`` in turn."""

    reply_partition = 4

    def __init__(self, answers: list[protocol.HeartbeatResponse]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, int, protocol.Message, Any]] = []
        self.reply_key = ControlAuth(None, role="member").reply_key
        self._next = 0

    def start_ids_at(self, first: int) -> None:
        self._next = first - 1

    def next_id(self) -> int:
        self._next += 1
        return self._next

    async def call(
        self, topic: str, partition: int, rid: int, payload: bytes, accept: Any, sealer: Any
    ) -> protocol.Message:
        self.sent.append((topic, partition, protocol.decode(payload), sealer))
        answer = self.answers.pop(0)
        answer.request_id = rid
        return answer


def delegated(requester: StubRequester, worker: ControlAuth) -> DelegatedMembership:
    return DelegatedMembership(
        requester,  # type: ignore[arg-type]
        "app",
        "g",
        [TOPIC],
        ShareGroupSettings(),
        "kafka-share-consumer",
        "m1",
        worker_auth=worker,
        requester_name="10.0.0.1:9192",
    )


def test_the_ticket_of_a_member_comes_from_the_coordinator_sealed_as_a_worker() -> None:
    granted = protocol.HeartbeatResponse(
        member_id="m1",
        request_id=0,
        member_epoch=4,
        assignment={TOPIC: [0, 1]},
        heartbeat_interval_ms=700,
        leaders=[(TOPIC, 1, "10.0.0.2:7000")],
        ticket=b"ticket-4",
    )
    gone = protocol.HeartbeatResponse(
        member_id="m1", request_id=0, error=QfErrorCode.UNKNOWN_MEMBER_ID.value
    )
    requester, worker = StubRequester([granted, gone]), ControlAuth(None, "kafka-listener")
    membership = delegated(requester, worker)
    membership.coordinator_partition = 5

    async def join() -> None:
        await membership.join()
        await membership.stop()  # no periodic refresh in this test

    asyncio.run(join())
    (topic, partition, sent, sealer) = requester.sent[0]
    assert (topic, partition) == ("app-share-coordinator", 5)
    assert isinstance(sent, protocol.MemberTicketRequest) and sealer is worker
    assert (sent.group, sent.member_id, sent.reply_partition) == ("g", "m1", 4)
    assert sent.request_id > FIRST_REQUEST_ID and sent.requester == "10.0.0.1:9192"
    assert (membership.ticket, membership.member_epoch) == (b"ticket-4", 4)
    assert membership.assignment == {tp(0), tp(1)}
    assert membership.leaders == {tp(1): "10.0.0.2:7000"}
    assert membership.heartbeat_interval_ms == 700
    # the member left: the coordinator no longer vouches for it, and neither does the listener
    with pytest.raises(ShareGroupError) as refused:
        asyncio.run(membership._heartbeat())
    assert refused.value.code is QfErrorCode.UNKNOWN_MEMBER_ID and membership.gone
    assert membership.ticket == b"ticket-4"  # kept: the leaders fence it themselves
    # leaving sends nothing: the member leaves where it heartbeats
    asyncio.run(membership.leave())
    assert len(requester.sent) == 2 and membership.assignment == set()
