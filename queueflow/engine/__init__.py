"""KIP-932 share-partition engine: record states, acknowledgements and durable state.

Pure and synchronous; see :mod:`queueflow.engine.partition` and :mod:`queueflow.engine.state`.
"""

from __future__ import annotations

from queueflow.engine.partition import (
    AcknowledgementBatch,
    AcknowledgeType,
    AcquiredRecords,
    MemberFence,
    RecordView,
    RunView,
    SharePartition,
    SharePartitionConfig,
)
from queueflow.engine.state import (
    RecordState,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    merge_batches,
    replay,
)

__all__ = [
    "AcknowledgeType",
    "AcknowledgementBatch",
    "AcquiredRecords",
    "MemberFence",
    "RecordState",
    "RecordView",
    "RunView",
    "SharePartition",
    "SharePartitionConfig",
    "ShareSnapshot",
    "ShareUpdate",
    "StateBatch",
    "merge_batches",
    "replay",
]
