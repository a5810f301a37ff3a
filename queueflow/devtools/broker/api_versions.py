"""ApiVersions v3, the request that carries a cluster's finalized feature levels (KIP-584).

aiokafka 0.14 declares ApiVersions only up to v2, which lacks the ``FinalizedFeatures`` tagged
field, so v3 is declared here with aiokafka's own protocol building blocks and sent over an
aiokafka connection.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any, ClassVar

from aiokafka.protocol.api import (
    Request,
    RequestStruct,
    Response,
    ResponseHeader_v0,
)
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

__all__ = [
    "ApiVersionsRequest_v3",
    "ApiVersionsResponse_v3",
    "FinalizedFeaturesRequest",
    "finalized_feature_levels",
]

_API_KEY = 18  # ApiVersions
#: Tag of the ``FinalizedFeatures`` field in the ApiVersions v3 response's tagged fields.
_FINALIZED_FEATURES_TAG = 2

_FINALIZED_FEATURES = Schema(
    (
        "finalized_features",
        CompactArray(
            ("name", CompactString("utf-8")),
            ("max_version_level", Int16),
            ("min_version_level", Int16),
            ("tags", TaggedFields),
        ),
    ),
)


class ApiVersionsResponse_v3(Response):
    """ApiVersions v3 response; the feature fields travel in the top-level ``tags``."""

    API_KEY = _API_KEY
    API_VERSION = 3
    SCHEMA = Schema(
        ("error_code", Int16),
        (
            "api_versions",
            CompactArray(
                ("api_key", Int16),
                ("min_version", Int16),
                ("max_version", Int16),
                ("tags", TaggedFields),
            ),
        ),
        ("throttle_time_ms", Int32),
        ("tags", TaggedFields),
    )


class ApiVersionsRequest_v3(RequestStruct):
    """ApiVersions v3 request (flexible request header v2)."""

    FLEXIBLE_VERSION = True
    API_KEY = _API_KEY
    API_VERSION = 3
    RESPONSE_TYPE = ApiVersionsResponse_v3
    SCHEMA = Schema(
        ("client_software_name", CompactString("utf-8")),
        ("client_software_version", CompactString("utf-8")),
        ("tags", TaggedFields),
    )

    def parse_response_header(self, read_buffer: BytesIO | bytes) -> Any:
        # ApiVersions responses always use response header v0, even in flexible versions, so
        # that a client can read them before it knows which versions the broker supports.
        return ResponseHeader_v0.decode(read_buffer)


class FinalizedFeaturesRequest(Request[ApiVersionsRequest_v3]):
    """An ApiVersions v3 request for :meth:`aiokafka.conn.AIOKafkaConnection.send`.

    Args:
        software_name: ``ClientSoftwareName`` the broker records for this connection.
        software_version: ``ClientSoftwareVersion``.
    """

    API_KEY: ClassVar[int] = _API_KEY

    def __init__(self, software_name: str = "queueflow", software_version: str = "0") -> None:
        self.software_name = software_name
        self.software_version = software_version

    def build(self, request_struct_class: type[ApiVersionsRequest_v3]) -> ApiVersionsRequest_v3:
        return request_struct_class(self.software_name, self.software_version, {})


def finalized_feature_levels(response: ApiVersionsResponse_v3) -> dict[str, int]:
    """The ``FinalizedFeatures`` of a v3 response: feature name -> max version level.

    Empty if the broker sent none (no features finalized yet).

    Raises:
        ValueError: the tagged field is malformed.
    """
    raw = response.tags.get(_FINALIZED_FEATURES_TAG)
    if raw is None:
        return {}
    (features,) = _FINALIZED_FEATURES.decode(BytesIO(raw))
    return {name: max_level for name, max_level, _min_level, _tags in features or []}
