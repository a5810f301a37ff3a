"""queueflow: KIP-932 share groups (queues for Kafka) as a Faust framework, on any Kafka cluster.

Public API::

    import queueflow

    app = queueflow.App("thumbnails", broker="kafka://localhost:9092")

    @app.share_agent(app.topic("jobs"), group="thumbnailers", concurrency=8)
    async def make_thumbnail(record: queueflow.ShareRecord):
        ...
        return queueflow.ACCEPT          # or RELEASE / REJECT; None means ACCEPT
"""

from __future__ import annotations

from queueflow.agent import ShareAgent
from queueflow.app import App, ShareGroups, attach
from queueflow.client import ShareRecord
from queueflow.consumer import IllegalStateError, ShareConsumer
from queueflow.errors import (
    ConfigurationError,
    CorruptStateError,
    ErrorCode,
    QueueflowError,
    ShareGroupError,
)
from queueflow.settings import ShareGroupSettings
from queueflow.share.partition import AcknowledgeType

#: The record was processed: it becomes Acknowledged.
ACCEPT = AcknowledgeType.ACCEPT
#: Deliver the record again (it is Archived once it reaches the delivery limit).
RELEASE = AcknowledgeType.RELEASE
#: The record can't be processed: it becomes Archived and is never delivered again.
REJECT = AcknowledgeType.REJECT

__version__ = "0.1.0"

__all__ = [
    "ACCEPT",
    "REJECT",
    "RELEASE",
    "AcknowledgeType",
    "App",
    "ConfigurationError",
    "CorruptStateError",
    "ErrorCode",
    "IllegalStateError",
    "QueueflowError",
    "ShareAgent",
    "ShareConsumer",
    "ShareGroupError",
    "ShareGroupSettings",
    "ShareGroups",
    "ShareRecord",
    "__version__",
    "attach",
]
