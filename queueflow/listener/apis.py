"""Which Kafka APIs and versions the listener serves, and the ApiVersions answer
(KIP-511; https://kafka.apache.org/protocol#The_Messages_ApiVersions). Pure."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i16

__all__ = [
    "ALTER_SHARE_GROUP_OFFSETS",
    "API_VERSIONS",
    "DELETE_GROUPS",
    "DELETE_SHARE_GROUP_OFFSETS",
    "DESCRIBE_SHARE_GROUP_OFFSETS",
    "FETCH",
    "FIND_COORDINATOR",
    "LIST_GROUPS",
    "LIST_OFFSETS",
    "METADATA",
    "PRODUCE",
    "SASL_AUTHENTICATE",
    "SASL_HANDSHAKE",
    "SERVED",
    "SHARE_ACKNOWLEDGE",
    "SHARE_FETCH",
    "SHARE_GROUP_DESCRIBE",
    "SHARE_GROUP_HEARTBEAT",
    "api_versions_response",
    "serves",
]

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
FIND_COORDINATOR = 10
LIST_GROUPS = 16
DELETE_GROUPS = 42
API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
DESCRIBE_SHARE_GROUP_OFFSETS = 90
ALTER_SHARE_GROUP_OFFSETS = 91
DELETE_SHARE_GROUP_OFFSETS = 92

#: API key -> (lowest, highest) version served. Metadata from v12 (topic ids), FindCoordinator
#: from v0 (one key, as librdkafka asks; batched from v4), the share APIs from the versions
#: Kafka 4.1+ clients send (KIP-932 GA); the admin APIs ``kafka-share-groups.sh`` uses:
#: ListGroups v5 (group types), ListOffsets v6+ (``--reset-offsets --to-earliest``),
#: DeleteGroups (``--delete``).
#: Produce v3 and Fetch v4 are listed (and refused) for librdkafka (queueflow.listener.refused).
#: SaslHandshake v1 (KIP-152 framing) and SaslAuthenticate are listed on every listener, as
#: Kafka's brokers list them (queueflow.listener.sasl; ILLEGAL_SASL_STATE without SASL).
SERVED: Mapping[int, tuple[int, int]] = {
    PRODUCE: (3, 3),
    FETCH: (4, 4),
    LIST_OFFSETS: (6, 11),
    METADATA: (12, 13),
    FIND_COORDINATOR: (0, 6),
    LIST_GROUPS: (5, 5),
    API_VERSIONS: (0, 4),
    SASL_HANDSHAKE: (1, 1),
    SASL_AUTHENTICATE: (0, 2),
    DELETE_GROUPS: (0, 2),
    SHARE_GROUP_HEARTBEAT: (1, 1),
    SHARE_GROUP_DESCRIBE: (1, 1),
    SHARE_FETCH: (1, 2),
    SHARE_ACKNOWLEDGE: (1, 2),
    DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1),
    ALTER_SHARE_GROUP_OFFSETS: (0, 0),
    DELETE_SHARE_GROUP_OFFSETS: (0, 0),
}

_ZERO = datetime.timedelta(0)


def serves(api_key: int, version: int) -> bool:
    """True when ``version`` of ``api_key`` is served."""
    bounds = SERVED.get(api_key)
    return bounds is not None and bounds[0] <= version <= bounds[1]


def api_versions_response(version: int) -> Any:
    """The ApiVersions answer (a kio response entity of ``version``) to a request of
    ``version``: the served APIs, or, for a version above the highest served, a v0 answer with
    UNSUPPORTED_VERSION that still lists them (so that the client retries with one it shares,
    as Kafka's brokers answer)."""
    error = ErrorCode.none
    if not serves(API_VERSIONS, version):
        version, error = 0, ErrorCode.unsupported_version
    module = load_payload_module(API_VERSIONS, version, EntityType.response)
    api_keys = tuple(
        module.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
        for k, (lo, hi) in sorted(SERVED.items())
    )
    if version == 0:
        return module.ApiVersionsResponse(error_code=error, api_keys=api_keys)
    return module.ApiVersionsResponse(error_code=error, api_keys=api_keys, throttle_time=_ZERO)
