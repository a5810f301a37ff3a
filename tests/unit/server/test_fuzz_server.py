"""Hostile input to the leader and coordinator and to the direct path's decoders (issue #12 item 3).

The leader's request topic and the coordinator topic get random bytes, truncated messages and
messages with a required field of the wrong type (``"group": null`` among them) between real
requests; afterwards a member joins and acquires every record with delivery count 1: nothing was
acquired, released or corrupted by the junk, no durable state was created for it, and neither
server stopped (no ``*_request_failed``). The skipped records are logged. ``decode_binary``
(direct path frames) and ``read_frame`` get the same treatment.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, RawMember, cluster_with, events, run
from structlog.testing import capture_logs

from queueflow.errors import InvalidRequestError
from queueflow.protocol import framing, topics
from queueflow.protocol import messages as protocol

RECORDS = 5

_fetch = protocol.ShareFetchRequest(
    group="g",
    topic=TOPIC,
    partition=0,
    member_id="m-forged",
    request_id=1,
    reply_partition=0,
    max_records=100,
)
_heartbeat = protocol.HeartbeatRequest(
    group="g",
    member_id="m-forged",
    member_epoch=0,
    subscribed_topics=[TOPIC],
    reply_partition=0,
    request_id=1,
)
# Fields whose value of another type is always refused (every request has them, or, for the
# assignment ticket, bytes: a base64 string in JSON).
_REQUIRED = {
    "fetch": (
        "group",
        "topic",
        "partition",
        "member_id",
        "request_id",
        "reply_partition",
        "ticket",
    ),
    "heartbeat": ("group", "member_id", "member_epoch", "reply_partition", "request_id"),
}
_wrong_type = st.one_of(
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.booleans(),
)


@st.composite
def junk(draw: st.DrawFn, message: Any) -> bytes:
    raw = protocol.encode(message)
    choice = draw(st.sampled_from(["bytes", "truncated", "mistyped"]))
    if choice == "bytes":
        data = draw(st.binary(max_size=64))
        try:
            protocol.decode(data)
        except InvalidRequestError:
            return data
        return b"\x00"
    if choice == "truncated":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    body = json.loads(raw)
    body[draw(st.sampled_from(_REQUIRED[message.kind]))] = draw(_wrong_type)
    return json.dumps(body).encode()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    fetch_junk=st.lists(junk(_fetch), min_size=1, max_size=8),
    coordinator_junk=st.lists(junk(_heartbeat), min_size=1, max_size=8),
)
def test_junk_never_stops_or_changes_the_servers(
    fetch_junk: list[bytes], coordinator_junk: list[bytes]
) -> None:
    async def scenario() -> Any:
        async with cluster_with(RECORDS) as cluster:
            request_topic = topics.request_topic(cluster.app_id, TOPIC)
            coordinator_topic = topics.coordinator_topic(cluster.app_id)
            for data in fetch_junk:
                await cluster.bus.send(request_topic, 0, data, b"m-forged")
            for data in coordinator_junk:
                await cluster.bus.send(coordinator_topic, 0, data, b"m-forged")
            await cluster.bus.drain()
            member = RawMember(cluster, "m")
            joined = await member.heartbeat(0)
            fetched = await member.fetch(0, 100)
            engine = cluster.share_partition("g", TOPIC, 0)
            return joined, fetched, engine.start_offset, [g for g in cluster_groups(cluster)]

    with capture_logs() as logs:
        joined, fetched, spso, groups = run(scenario())
    assert joined.error == "NONE" and joined.member_epoch == 1
    assert fetched.error == "NONE" and fetched.acquired == [(0, RECORDS - 1, 1)]
    assert spso == 0
    assert groups == ["g"]
    # Each junk record is logged once: dropped by its first bytes, or refused by the decoder.
    dropped = events(logs, "control_message_dropped")
    at_coordinator = sum(e["topic"].endswith("-share-coordinator") for e in dropped)
    at_leader = len(dropped) - at_coordinator
    assert len(events(logs, "undecodable_request")) + at_leader == len(fetch_junk)
    assert len(events(logs, "undecodable_coordinator_request")) + at_coordinator == len(
        coordinator_junk
    )
    assert not events(logs, "leader_request_failed")
    assert not events(logs, "coordinator_request_failed")


def cluster_groups(cluster: Any) -> list[str]:
    """The share groups the coordinator knows or stored (junk must not have created any)."""
    return sorted(set(cluster.coordinator.groups) | {k.decode() for k in cluster.tables["groups"]})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_binary_refuses_random_bytes_with_one_error_type(data: bytes) -> None:
    try:
        message = protocol.decode_binary(data)
    except InvalidRequestError:
        return
    assert protocol.decode_binary(protocol.encode_binary(message)) == message


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_decode_binary_refuses_truncated_frames(data: st.DataObject) -> None:
    raw = protocol.encode_binary(_fetch)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(InvalidRequestError):
        protocol.decode_binary(raw[:cut])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_read_frame_on_random_streams(data: bytes) -> None:
    """A stream of random bytes gives frames, a clean end, InvalidRequestError (bad size) or
    IncompleteReadError (cut inside a frame): nothing else, and never a frame above the bound."""

    async def read_all() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        while True:
            try:
                frame = await framing.read_frame(reader)
            except (InvalidRequestError, asyncio.IncompleteReadError):
                return
            if frame is None:
                return
            assert 0 < len(frame) <= framing.MAX_FRAME_BYTES

    asyncio.run(read_all())


def test_read_frame_refuses_an_oversized_announcement_without_buffering() -> None:
    async def read() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", framing.MAX_FRAME_BYTES + 1))
        with pytest.raises(InvalidRequestError):
            await framing.read_frame(reader)

    asyncio.run(read())


def test_a_flood_of_junk_is_logged_rate_limited_and_the_leader_keeps_serving() -> None:
    """500 junk records: 20 log lines (the burst), the rest counted as suppressed; the member
    then acquires every record."""

    async def scenario() -> Any:
        async with cluster_with(RECORDS) as cluster:
            request_topic = topics.request_topic(cluster.app_id, TOPIC)
            for i in range(500):
                await cluster.bus.send(request_topic, 0, b"junk %d" % i, b"m-forged")
            await cluster.bus.drain()
            fetched = await RawMember(cluster, "m").fetch(0, 100)
            leader = cluster.leaders[TOPIC]
            return fetched, leader.skipped.total + leader.junk.drops.total

    with capture_logs() as logs:
        fetched, skipped = run(scenario())
    assert fetched.acquired == [(0, RECORDS - 1, 1)]
    assert skipped == 500
    logged = events(logs, "undecodable_request") + events(logs, "control_message_dropped")
    assert len(logged) == 20
    assert sum(e["suppressed"] for e in logged) == 0  # the rest are counted at the next one
