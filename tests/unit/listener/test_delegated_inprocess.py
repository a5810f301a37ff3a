"""A listener acting for a member that heartbeats to another listener, through the in-process
cluster with ``queueflow.auth.mode=hmac``: the coordinator gives the member's ticket to a
worker only (sealed with the secret), bound to the acting session's key, and only while the
member is in the group; the leader serves the acting session as the member; a member
credential cannot ask (docs/kafka-listener.md "Which node leads a share-partition")."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from inprocess_helpers import TOPIC, cluster_with, events, run
from structlog.testing import capture_logs

from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.listener.delegated import DelegatedMembership
from queueflow.member.membership import Membership
from queueflow.member.session import ShareFetchSession
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.credentials import Credentials, member_credential
from queueflow.protocol.envelope import topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.structs import AcknowledgeType, TopicPartition

SECRET = "kL4-listener-acting-7Qw_Zx2Cv9Bn5Mm8Hj3Gf6Dd1"
AUTH = {"auth_mode": "hmac", "auth_secret": SECRET}
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


def test_the_acting_listener_fetches_as_the_member_until_it_leaves() -> None:
    async def scenario() -> Any:
        async with cluster_with(6, partitions=2, **AUTH) as cluster:
            ctx = cluster.member_context
            worker = ControlAuth.from_settings(ctx.settings, cluster.app_id, "kafka-listener")
            home = ShareFetchSession(
                ctx,
                "g",
                [TOPIC],
                "console-share-consumer",
                member_id="kafka-m1",
                membership=functools.partial(Membership, sealer=worker),
            )
            await home.start()
            acting = ShareFetchSession(
                ctx,
                "g",
                [TOPIC],
                "console-share-consumer",
                member_id="kafka-m1",
                membership=functools.partial(
                    DelegatedMembership, worker_auth=worker, requester_name="h:9192"
                ),
            )
            await acting.start()
            assigned = (set(home.assignment), set(acting.assignment))
            fetched = await acting.fetch(TP1, 10)
            for record in fetched.records:
                acting.acknowledge(TP1, record.offset, AcknowledgeType.ACCEPT)
            acked = await acting.flush(TP1)
            members = [m.member_id for m in cluster.coordinator.groups["g"].members.values()]
            await home.close()  # the member leaves where it heartbeats
            with pytest.raises(ShareGroupError) as refused:
                await acting._membership.refresh()
            after = await acting.fetch(TP0, 10)
            engine = cluster.share_partition("g", TOPIC, 0)
            taken = 0 if engine is None else engine.acquired_count
            await acting.close(leave=False)
            return assigned, fetched, acked, members, refused.value, after, taken

    with capture_logs() as logs:
        assigned, fetched, acked, members, refused, after, acquired_after = run(scenario())
    assert assigned == ({TP0, TP1}, {TP0, TP1})
    assert fetched.error is None and fetched.acquired == 3  # records of partition 1
    assert acked is None  # its acknowledgements were applied
    assert members == ["kafka-m1"]  # one member: acting for it joined nobody
    assert refused.code is ErrorCode.UNKNOWN_MEMBER_ID  # no ticket once it left
    assert after.error is not None and after.error.code is ErrorCode.UNKNOWN_MEMBER_ID
    assert after.acquired == 0 and acquired_after == 0
    assert not events(logs, "undecodable_coordinator_request")


def test_a_member_credential_cannot_ask_for_a_members_ticket() -> None:
    async def scenario() -> Any:
        async with cluster_with(3, **AUTH) as cluster:
            ns = cluster.app_id
            creds = Credentials.from_member_credential(member_credential(SECRET, ns), ns)
            member = ControlAuth(creds, role="member")
            assert member.reply_key is not None
            coordinator = topics.coordinator_topic(ns)
            request = protocol.MemberTicketRequest(
                group="g",
                member_id="victim",
                reply_partition=0,
                request_id=1,
                reply_key=member.reply_key.public,
            )
            sealed = member.seal(protocol.encode(request), topic_dest(coordinator, 0))
            await cluster.bus.send(coordinator, 0, sealed, b"victim")
            await cluster.bus.drain()

    with capture_logs() as logs:
        run(scenario())
    [refused] = events(logs, "undecodable_coordinator_request")
    assert refused["reason"] == "wrong_role"
