"""The leader's direct endpoint bounded before authentication (docs/operations.md, "The direct
port's limits"): frame sizes, connection caps, idle / read / write timeouts, on the in-process
cluster's real TCP endpoint; and members reconnecting after the endpoint closed their
connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from typing import Any

import pytest
from inprocess_helpers import direct_cluster, events, fetch, run
from structlog.testing import capture_logs

from queueflow.errors import ErrorCode
from queueflow.member.direct import DirectClient
from queueflow.protocol import framing
from queueflow.protocol import messages as protocol
from queueflow.protocol.credentials import Credentials
from queueflow.protocol.envelope import direct_dest, direct_reply_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.server.connections import ConnectionGate, DirectLimits, connection_cap
from queueflow.settings import ShareGroupSettings
from queueflow.structs import AcknowledgeType

SECRET = "direct-limits-secret-0123456789abcdef0123456789"
AUTH = {"auth_mode": "hmac", "auth_secret": SECRET}
WAIT_S = 5.0


def address_of(cluster: Any) -> tuple[str, int]:
    assert cluster.endpoint is not None
    host, port = cluster.endpoint.address.rsplit(":", 1)
    return host, int(port)


async def closed_by_peer(reader: asyncio.StreamReader, within_s: float = WAIT_S) -> bool:
    """True when the endpoint closed the connection (EOF or reset) within ``within_s``."""
    try:
        while await asyncio.wait_for(reader.read(65536), within_s):
            pass
    except ConnectionError:
        pass
    return True


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


def dropped(cluster: Any, reason: str) -> float:
    return float(cluster.metrics.direct_connections_dropped.labels(reason)._value.get())


def refused(cluster: Any, reason: str) -> float:
    return float(cluster.metrics.direct_connections_refused.labels(reason)._value.get())


# Frames --------------------------------------------------------------------------------------


def test_a_frame_above_the_reader_s_limit_is_refused_after_its_4_byte_length() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", 65537))  # no body at all: nothing is awaited
        with pytest.raises(framing.FrameTooLargeError, match="not authenticated yet"):
            await asyncio.wait_for(framing.read_frame(reader, 65536), 1.0)
        ok = asyncio.StreamReader()
        ok.feed_data(struct.pack(">I", 3) + b"abc")
        assert await framing.read_frame(ok, 3) == b"abc"

    run(scenario())


def test_a_frame_waits_for_its_first_byte_no_longer_than_the_idle_timeout() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        with pytest.raises(framing.FrameIdleTimeout):
            await framing.read_frame(reader, idle_timeout_s=0.05)
        reader.feed_data(struct.pack(">I", 2) + b"hi")  # nothing was consumed: still readable
        assert await framing.read_frame(reader, idle_timeout_s=0.05) == b"hi"

    run(scenario())


def test_a_frame_that_trickles_in_is_cut_off_by_the_read_timeout() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", 10) + b"abc")  # started, never finished
        started = time.monotonic()
        with pytest.raises(framing.FrameReadTimeout, match=r"longer than 0\.1 s"):
            await framing.read_frame(reader, idle_timeout_s=5.0, read_timeout_s=0.1)
        assert time.monotonic() - started < 1.0

    run(scenario())


def test_the_total_connection_cap_stays_below_half_the_open_file_limit() -> None:
    assert connection_cap(1000, 1024) == 512
    assert connection_cap(100, 1024) == 100
    assert connection_cap(1000, None) == 1000
    assert connection_cap(1000, 1) == 1
    assert 1 <= connection_cap(1000) <= 1000  # this process's own limit


def test_the_gate_counts_per_address_and_in_total() -> None:
    gate = ConnectionGate(max_connections=3, max_per_ip=2)
    assert gate.admit("a") is None and gate.admit("a") is None
    assert gate.admit("a") == "max_connections_per_ip"
    assert gate.admit("b") is None
    assert gate.admit("c") == "max_connections"
    gate.release("a")
    assert gate.held("a") == 1 and gate.admit("c") is None and gate.open == 3


def test_limits_come_from_the_settings() -> None:
    settings = ShareGroupSettings(
        direct_unauthenticated_max_frame_bytes=4096,
        direct_max_frame_bytes=2048,  # never below the pre-authentication one
        direct_unauthenticated_idle_ms=1500,
        direct_connections_max_idle_ms=60_000,
        direct_frame_read_timeout_ms=2500,
        direct_write_timeout_ms=3500,
    )
    limits = DirectLimits.from_settings(settings)
    assert (limits.frame_bytes(False), limits.frame_bytes(True)) == (4096, 4096)
    assert (limits.idle_timeout_s(False), limits.idle_timeout_s(True)) == (1.5, 60.0)
    assert (limits.frame_read_timeout_s, limits.write_timeout_s) == (2.5, 3.5)


# The endpoint --------------------------------------------------------------------------------


def big_fetch(member: str, rid: int, acks: int) -> protocol.ShareFetchRequest:
    """A fetch acknowledging ``acks`` single offsets (every other one): about 12 bytes each."""
    return fetch(
        member, rid, acks=[(2 * i, 2 * i, (int(AcknowledgeType.ACCEPT),)) for i in range(acks)]
    )


def member_auth(app_id: str, secret: str = SECRET) -> ControlAuth:
    return ControlAuth(Credentials.from_secret(secret, app_id), role="member")


def test_before_a_verified_frame_the_small_limit_applies_after_it_the_full_one() -> None:
    """A frame above the pre-authentication limit closes a new connection before its body is
    read; the same frame after a verified one is served. Under hmac, a large frame signed
    with a wrong secret never gets the full limit."""

    async def scenario() -> None:
        async with direct_cluster(
            records=1, direct_unauthenticated_max_frame_bytes=4096, **AUTH
        ) as cluster:
            host, port = address_of(cluster)
            dest = direct_dest(cluster.endpoint.address)  # type: ignore[union-attr]
            member = member_auth(cluster.app_id)
            large = member.seal(protocol.encode_binary(big_fetch("m1", 2, 2000)), dest)
            assert 4096 < len(large) < framing.MAX_FRAME_BYTES
            # A new connection: only the 4-byte length of the large frame is read.
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(struct.pack(">I", len(large)))
            assert await closed_by_peer(reader)
            await close(writer)
            assert dropped(cluster, "frame_too_large") == 1
            # A small signed frame first: then the large one is read and served.
            reader, writer = await asyncio.open_connection(host, port)
            small = member.seal(protocol.encode_binary(fetch("m1", 1, max_records=0)), dest)
            framing.write_frame(writer, small)
            framing.write_frame(writer, large)
            await writer.drain()
            answers = []
            reply_dest = direct_reply_dest(cluster.endpoint.address)  # type: ignore[union-attr]
            for _ in range(2):
                frame = await framing.read_frame(reader, idle_timeout_s=WAIT_S)
                assert frame is not None
                answers.append(protocol.decode_binary(member.open(frame, reply_dest)))
            assert sorted(a.request_id for a in answers) == [1, 2]
            await close(writer)
            # A frame signed with a guessed secret verifies nothing: the next large one is
            # still refused (the connection is closed at the bad frame already).
            reader, writer = await asyncio.open_connection(host, port)
            guessed = member_auth(cluster.app_id, "guessed-" + SECRET)
            framing.write_frame(writer, guessed.seal(protocol.encode_binary(fetch("m1", 3)), dest))
            writer.write(struct.pack(">I", len(large)))
            assert await closed_by_peer(reader)
            await close(writer)
            assert dropped(cluster, "undecodable") == 1

    run(scenario())


def test_with_auth_mode_none_the_first_well_formed_request_lifts_the_small_limit() -> None:
    async def scenario() -> None:
        async with direct_cluster(direct_unauthenticated_max_frame_bytes=4096) as cluster:
            host, port = address_of(cluster)
            large = protocol.encode_binary(big_fetch("m1", 2, 2000))
            reader, writer = await asyncio.open_connection(host, port)
            framing.write_frame(writer, b"\x00 not a message")
            assert await closed_by_peer(reader)
            await close(writer)
            reader, writer = await asyncio.open_connection(host, port)
            framing.write_frame(writer, protocol.encode_binary(fetch("m1", 1, max_records=0)))
            framing.write_frame(writer, large)
            await writer.drain()
            ids = []
            for _ in range(2):
                frame = await framing.read_frame(reader, idle_timeout_s=WAIT_S)
                assert frame is not None
                ids.append(protocol.decode_binary(frame).request_id)  # type: ignore[union-attr]
            assert sorted(ids) == [1, 2]
            await close(writer)

    run(scenario())


def test_a_member_s_large_first_request_goes_after_a_small_verified_frame() -> None:
    """After a reconnect a member's first request may carry thousands of acknowledgements:
    it is served (a small ShareFetchCancel for no request opens every connection)."""

    async def scenario() -> None:
        async with direct_cluster(
            records=1, direct_unauthenticated_max_frame_bytes=4096, **AUTH
        ) as cluster:
            address = cluster.endpoint.address  # type: ignore[union-attr]
            member = member_auth(cluster.app_id)
            client = DirectClient(member)
            request = big_fetch("m1", 1, 4000)
            assert len(member.seal(protocol.encode_binary(request), direct_dest(address))) > 4096
            with capture_logs() as logs:
                response = await client.call(address, request, WAIT_S)
            assert response.request_id == 1
            assert not events(logs, "direct_connection_dropped")
            await client.close()

    run(scenario())


def test_connections_above_the_per_address_and_total_caps_are_closed_at_once() -> None:
    async def scenario() -> None:
        async with direct_cluster(
            records=1, direct_max_connections=5, direct_max_connections_per_ip=3
        ) as cluster:
            host, port = address_of(cluster)
            held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
            with capture_logs() as logs:
                for _ in range(4):  # the 4th from 127.0.0.1 is one too many
                    held.append(await asyncio.open_connection(host, port))
                assert await closed_by_peer(held[3][0])
                others = []
                for source in ("127.0.0.2", "127.0.0.3"):
                    for _ in range(2):
                        others.append(
                            await asyncio.open_connection(host, port, local_addr=(source, 0))
                        )
                # 3 + 2 held = 5: those from a third address are over the total cap
                assert await closed_by_peer(others[2][0])
                assert await closed_by_peer(others[3][0])
            assert refused(cluster, "max_connections_per_ip") == 1
            assert refused(cluster, "max_connections") == 2
            reasons = [e["reason"] for e in events(logs, "direct_connection_refused")]
            assert sorted(reasons) == ["max_connections"] * 2 + ["max_connections_per_ip"]
            assert cluster.metrics.direct_connections._value.get() == 5
            for _, writer in held + others:
                await close(writer)
            # Closed connections free their places: a member connects and is served.
            client = DirectClient()
            deadline = time.monotonic() + WAIT_S
            while cluster.endpoint._gate.open:  # type: ignore[union-attr]
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            response = await client.call(cluster.endpoint.address, fetch("m1", 1), WAIT_S)  # type: ignore[union-attr]
            assert response.error == ErrorCode.NONE.value
            await client.close()

    run(scenario())


def test_a_connection_that_never_sends_is_closed_by_the_unauthenticated_idle_timeout() -> None:
    async def scenario() -> None:
        async with direct_cluster(direct_unauthenticated_idle_ms=200) as cluster:
            host, port = address_of(cluster)
            reader, writer = await asyncio.open_connection(host, port)
            started = time.monotonic()
            assert await closed_by_peer(reader)
            assert 0.15 < time.monotonic() - started < 2.0
            await close(writer)
            assert dropped(cluster, "unauthenticated_idle") == 1

    run(scenario())


def test_a_frame_sent_a_byte_at_a_time_is_closed_by_the_read_timeout() -> None:
    async def scenario() -> None:
        async with direct_cluster(direct_frame_read_timeout_ms=300) as cluster:
            host, port = address_of(cluster)
            reader, writer = await asyncio.open_connection(host, port)
            started = time.monotonic()

            async def trickle() -> None:
                for byte in struct.pack(">I", 100) + b"x" * 100:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)

            sending = asyncio.ensure_future(trickle())
            assert await closed_by_peer(reader)
            assert time.monotonic() - started < 2.0
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
            await close(writer)
            assert dropped(cluster, "read_timeout") == 1

    run(scenario())


def test_a_member_reconnects_transparently_after_the_idle_timeout_closed_its_connection() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=3, direct_connections_max_idle_ms=1000) as cluster:
            address = cluster.endpoint.address  # type: ignore[union-attr]
            client = DirectClient()
            first = await client.call(address, fetch("m1", 1, max_records=1), WAIT_S)
            assert first.acquired == [(0, 0, 1)]
            connection = client._connections[address]
            deadline = time.monotonic() + WAIT_S
            while not connection.closed:  # the endpoint closes it after 1 s without a frame
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            second = await client.call(address, fetch("m1", 2, max_records=1), WAIT_S)
            assert second.acquired == [(1, 1, 1)]
            assert client._connections[address] is not connection
            assert dropped(cluster, "idle") == 1
            # A request written just as the endpoint closed the connection is sent once more.
            connection = client._connections[address]

            async def closed_under_it(message: Any) -> None:
                connection.fail("the leader closed the connection")
                raise ConnectionResetError("reset by peer")

            connection._write = closed_under_it  # type: ignore[method-assign]
            third = await client.call(address, fetch("m1", 3, max_records=1), WAIT_S)
            assert third.acquired == [(2, 2, 1)]
            assert client._connections[address] is not connection
            await client.close()

    run(scenario())


def test_a_parked_long_poll_keeps_its_connection_past_the_idle_timeout() -> None:
    async def scenario() -> None:
        async with direct_cluster(direct_connections_max_idle_ms=1000) as cluster:
            address = cluster.endpoint.address  # type: ignore[union-attr]
            client = DirectClient()
            response = await client.call(address, fetch("m1", 1, max_wait_ms=2_500), WAIT_S)
            assert response.acquired == [] and response.error == ErrorCode.NONE.value
            assert not client._connections[address].closed
            assert dropped(cluster, "idle") == 0
            await client.close()

    run(scenario())


def test_a_peer_that_never_reads_its_answers_is_closed_by_the_write_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queueflow.server import endpoint

    monkeypatch.setattr(endpoint, "WRITE_BUFFER_BYTES", 1024)

    async def scenario() -> None:
        async with direct_cluster(direct_write_timeout_ms=300) as cluster:
            host, port = address_of(cluster)
            assert cluster.endpoint is not None and cluster.endpoint._server is not None
            for listening in cluster.endpoint._server.sockets:  # accepted sockets inherit it
                listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills fast
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            _reader, writer = await asyncio.open_connection(sock=sock)
            writer.transport.pause_reading()  # never reads an answer
            frame = protocol.encode_binary(fetch("m1", 1, max_records=0))
            deadline = time.monotonic() + 3 * WAIT_S  # (20,000 requests on a loaded machine)
            sent = 0
            while dropped(cluster, "write_timeout") == 0:
                assert time.monotonic() < deadline, f"{sent} requests, not closed"
                if sent < 20_000:
                    framing.write_frame(writer, frame)
                    sent += 1
                    if sent % 200 == 0:
                        await asyncio.sleep(0.01)
                else:
                    await asyncio.sleep(0.05)
            writer.transport.abort()
            await close(writer)

    run(scenario())
