"""Kafka protocol frames, read and written with kio's generated types (no hand-written codecs).

A frame is a 4-byte big-endian size followed by a request header and a request body
(https://kafka.apache.org/protocol#protocol_common). This module is pure: bytes in, entities
out, and the reverse.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

__all__ = [
    "SIZE",
    "FrameError",
    "Request",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "peek_header",
]

#: The frame's size prefix (big-endian int32).
SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")
_API_VERSIONS = 18


class FrameError(ValueError):
    """A frame that cannot be read (truncated, unknown API, bad field); the connection that
    sent it is closed."""


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request: its header fields and its body (a kio request entity)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a frame (without the size prefix), read
    before the rest so that an unsupported version can still be answered.

    Raises:
        FrameError: fewer than 8 bytes.
    """
    if len(frame) < 8:
        raise FrameError(f"a {len(frame)}-byte frame has no request header")
    key, version = _KEY_VERSION.unpack_from(frame)
    (correlation_id,) = SIZE.unpack_from(frame, 4)
    return key, version, correlation_id


def decode_request(frame: bytes) -> Request:
    """Read one request frame (without its size prefix).

    Raises:
        FrameError: an unknown API key or version, or bytes that don't parse as its schema.
    """
    key, version, _ = peek_header(frame)
    try:
        schema = load_request_schema(key, version)
    except (UnknownAPIKey, UnknownEntity) as exc:
        raise FrameError(f"API key {key} version {version}: {exc}") from None
    header_type = schema.__header_schema__
    if header_type not in (RequestHeaderV1, RequestHeaderV2):
        raise FrameError(f"API key {key} version {version}: request header {header_type}")
    try:
        header, used = entity_reader(header_type)(frame, 0)
        body, body_size = entity_reader(schema)(frame, used)
    except Exception as exc:  # kio's native reader raises various errors on bad bytes
        raise FrameError(f"API key {key} version {version} does not parse: {exc!r}") from None
    if used + body_size != len(frame):
        raise FrameError(
            f"API key {key} version {version}: {len(frame) - used - body_size} bytes left over"
        )
    return Request(
        key, version, correlation_id=header.correlation_id, client_id=header.client_id, body=body
    )


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The frame (size prefix included) of ``response`` (a kio response entity), with the
    response header its schema names (v0 for ApiVersions, v1 for flexible versions)."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    header_type = type(response).__header_schema__
    if header_type is ResponseHeaderV1:
        entity_writer(ResponseHeaderV1)(
            buffer, ResponseHeaderV1(correlation_id=i32(correlation_id))
        )
    else:
        entity_writer(ResponseHeaderV0)(
            buffer, ResponseHeaderV0(correlation_id=i32(correlation_id))
        )
    entity_writer(type(response))(buffer, response)
    frame = buffer.getbuffer()
    SIZE.pack_into(frame, 0, len(frame) - 4)
    data = bytes(frame)
    del frame
    return data


def encode_request(request: Any, correlation_id: int, client_id: str) -> bytes:
    """The frame (size prefix included) of ``request`` (a kio request entity), with the request
    header its schema names: what the listener sends to the app's brokers."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    header_type = type(request).__header_schema__
    header = header_type(
        request_api_key=request.__api_key__,
        request_api_version=request.__version__,
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    entity_writer(header_type)(buffer, header)
    entity_writer(type(request))(buffer, request)
    frame = buffer.getbuffer()
    SIZE.pack_into(frame, 0, len(frame) - 4)
    data = bytes(frame)
    del frame
    return data


def decode_response(frame: bytes, schema: type[Any]) -> tuple[int, Any]:
    """``(correlation_id, response)`` of a response frame (without its size prefix) of the kio
    response type ``schema``.

    Raises:
        FrameError: bytes that don't parse as ``schema``.
    """
    try:
        header, used = entity_reader(schema.__header_schema__)(frame, 0)
        body, _ = entity_reader(schema)(frame, used)
    except Exception as exc:  # kio's native reader raises various errors on bad bytes
        raise FrameError(f"a {schema.__name__} does not parse: {exc!r}") from None
    return int(header.correlation_id), body
