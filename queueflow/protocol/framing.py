"""Frames of the direct member ↔ leader path: one message per frame on a TCP stream.

A frame is a 4-byte big-endian length followed by that many bytes: one message in the binary
form of :func:`~queueflow.protocol.messages.encode_binary` (a format version byte, then
MessagePack). Kafka's own protocol frames requests the same way
(a 4-byte size, then the request). The size is checked against the reader's limit before a byte
of the body is read, so garbage on the socket (a port scanner, a client speaking another
protocol, a huge announced size) is refused after 4 bytes instead of being buffered.

A reader may also bound time: how long it waits for a frame's first byte (an idle connection,
:class:`FrameIdleTimeout`) and how long a frame may take once its first byte arrived (a peer
trickling bytes, "slowloris", :class:`FrameReadTimeout`). The leader's endpoint uses both, with
a small size limit until a connection has delivered one authenticated frame
(docs/operations.md, "The direct port's limits").
"""

from __future__ import annotations

import asyncio
import struct
from typing import Final

from queueflow.errors import InvalidRequestError

__all__ = [
    "MAX_FRAME_BYTES",
    "FrameIdleTimeout",
    "FrameReadTimeout",
    "FrameTooLargeError",
    "is_tls_record",
    "read_frame",
    "write_frame",
]

#: The largest frame the protocol allows (bytes), and the largest a member accepts from a
#: leader. A leader's endpoint accepts at most ``queueflow.direct.max.frame.bytes`` (less).
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024

_SIZE: Final = struct.Struct(">I")


class FrameTooLargeError(InvalidRequestError):
    """A frame announced 0 bytes or more than the reader's limit; the peer does not speak this
    protocol (or not yet authenticated: then the limit is the pre-authentication one). Close the
    connection: nothing past the 4-byte length was read.

    Attributes:
        tls: the 4 bytes are a TLS record header (a handshake or an alert): the peer speaks TLS
            and this side does not (``queueflow.leader.listener.security.protocol``).
    """

    def __init__(self, message: str, *, tls: bool = False) -> None:
        super().__init__(message)
        self.tls = tls


def is_tls_record(header: bytes) -> bool:
    """Whether ``header`` (a frame's first bytes) starts a TLS record: content type 20-23
    (change cipher spec, alert, handshake, application data), then major version 3 (RFC 8446
    section 5.1)."""
    return len(header) >= 2 and 20 <= header[0] <= 23 and header[1] == 3


class FrameIdleTimeout(TimeoutError):
    """No frame started (not one byte arrived) within the idle timeout; the connection is
    intact, between frames."""


class FrameReadTimeout(InvalidRequestError):
    """A frame started but was not complete within the read timeout (a peer sending a few bytes
    now and then); close the connection: the stream is inside a frame."""


async def read_frame(
    reader: asyncio.StreamReader,
    max_bytes: int = MAX_FRAME_BYTES,
    *,
    idle_timeout_s: float | None = None,
    read_timeout_s: float | None = None,
) -> bytes | None:
    """Read one frame's payload; ``None`` at a clean end of stream (between frames).

    Args:
        reader: the connection's stream.
        max_bytes: the largest payload accepted (bytes, at most :data:`MAX_FRAME_BYTES`).
        idle_timeout_s: seconds to wait for the frame's first byte; ``None``: no limit.
        read_timeout_s: seconds the whole frame may take from its first byte; ``None``: no
            limit.

    Raises:
        FrameTooLargeError: the announced size is 0 or above ``max_bytes``.
        FrameIdleTimeout: no byte within ``idle_timeout_s`` (nothing was consumed).
        FrameReadTimeout: the frame was not complete within ``read_timeout_s``.
        asyncio.IncompleteReadError: the stream ended inside a frame.
    """
    try:
        first = await asyncio.wait_for(reader.readexactly(1), idle_timeout_s)
    except asyncio.IncompleteReadError:
        return None  # nothing of a frame was read
    except asyncio.TimeoutError:  # (a TimeoutError only from Python 3.11)
        raise FrameIdleTimeout(f"no frame within {idle_timeout_s} s") from None
    try:
        return await asyncio.wait_for(_rest(reader, first, max_bytes), read_timeout_s)
    except asyncio.TimeoutError:
        raise FrameReadTimeout(
            f"a frame took longer than {read_timeout_s} s to arrive: too slow, or not "
            "queueflow's direct protocol"
        ) from None


async def _rest(reader: asyncio.StreamReader, first: bytes, max_bytes: int) -> bytes:
    header = first + await reader.readexactly(_SIZE.size - 1)
    (size,) = _SIZE.unpack(header)
    if not 0 < size <= max_bytes:  # checked before a byte of the body is read
        if is_tls_record(header):
            raise FrameTooLargeError(
                "the peer speaks TLS (a TLS record arrived) and this side does not", tls=True
            )
        raise FrameTooLargeError(
            f"frame of {size} bytes announced (allowed 1..{max_bytes}): the peer does "
            "not speak queueflow's direct protocol"
            + ("" if max_bytes >= MAX_FRAME_BYTES else " or is not authenticated yet")
        )
    return await reader.readexactly(size)


def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    """Queue one frame on ``writer`` (the caller drains).

    Raises:
        ValueError: ``payload`` is empty or above :data:`MAX_FRAME_BYTES`.
    """
    if not 0 < len(payload) <= MAX_FRAME_BYTES:
        raise ValueError(f"a frame holds 1..{MAX_FRAME_BYTES} bytes, not {len(payload)}")
    writer.write(_SIZE.pack(len(payload)) + payload)
