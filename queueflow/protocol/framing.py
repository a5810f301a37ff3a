"""Frames of the direct member ↔ leader path: one message per frame on a TCP stream.

A frame is a 4-byte big-endian length followed by that many bytes: one message in the binary
form of :func:`~queueflow.protocol.messages.encode_binary` (a format version byte, then
MessagePack). Kafka's own protocol frames requests the same way
(a 4-byte size, then the request). The size is bounded, so garbage on the socket (a port scanner,
a client speaking another protocol) is refused after 4 bytes instead of being buffered.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Final

from queueflow.errors import InvalidRequestError

__all__ = ["MAX_FRAME_BYTES", "read_frame", "write_frame"]

#: The largest frame either side accepts (bytes). A ShareFetch of 10,000 single-offset
#: acknowledgements is about 200 KB; anything near this limit is not queueflow talking.
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024

_SIZE: Final = struct.Struct(">I")


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """Read one frame's payload; ``None`` at a clean end of stream (between frames).

    Raises:
        InvalidRequestError: the announced size is 0 or above :data:`MAX_FRAME_BYTES` (the
            peer does not speak this protocol); the caller should close the connection.
        asyncio.IncompleteReadError: the stream ended inside a frame.
    """
    try:
        head = await reader.readexactly(_SIZE.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (size,) = _SIZE.unpack(head)
    if not 0 < size <= MAX_FRAME_BYTES:
        raise InvalidRequestError(
            f"frame of {size} bytes announced (allowed 1..{MAX_FRAME_BYTES}): the peer does "
            "not speak queueflow's direct protocol"
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
