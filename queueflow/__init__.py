"""queueflow: KIP-932 share groups (queues for Kafka) as a Faust framework, on any Kafka cluster.

Public API::

    import queueflow

    app = queueflow.App("thumbnails", broker="kafka://localhost:9092")

    @app.share_agent(app.topic("jobs"), group="thumbnailers", concurrency=8)
    async def make_thumbnail(record: queueflow.ShareRecord):
        ...
        return queueflow.ACCEPT          # or RELEASE / REJECT; None means ACCEPT

    @app.share_agent(app.topic("jobs"), group="resizers", sink=[app.topic("thumbs")])
    async def resize(record):
        yield make_thumbnail(record.value)  # published to every sink, if the record is ACCEPTed

The names below are imported lazily (PEP 562), so ``import queueflow.engine`` loads neither
Faust nor aiokafka.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from queueflow.structs import AcknowledgeType

if TYPE_CHECKING:
    from queueflow.errors import (
        ConfigurationError,
        CorruptStateError,
        ErrorCode,
        QueueflowError,
        ShareGroupError,
    )
    from queueflow.faust_app import App, ShareGroups, attach
    from queueflow.member.agent import ShareAgent
    from queueflow.member.agent.outputs import (
        COPY_OF_RECORD,
        USE_RECORD_KEY,
        DeadLetter,
        Result,
        Send,
    )
    from queueflow.member.browse import BrowsedRecord
    from queueflow.member.consumer import IllegalStateError, ShareConsumer
    from queueflow.member.outcomes import Release, release
    from queueflow.settings import ShareGroupSettings
    from queueflow.structs import ShareRecord, TopicPartition

#: The record was processed: it becomes Acknowledged.
ACCEPT = AcknowledgeType.ACCEPT
#: Deliver the record again (it is Archived once it reaches the delivery limit).
RELEASE = AcknowledgeType.RELEASE
#: The record can't be processed: it becomes Archived and is never delivered again.
REJECT = AcknowledgeType.REJECT
#: Keep working on the record: its acquisition lock is extended (KIP-1222); it still needs one
#: of the outcomes above.
RENEW = AcknowledgeType.RENEW

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_LAZY = {
    "App": "queueflow.faust_app",
    "ShareGroups": "queueflow.faust_app",
    "attach": "queueflow.faust_app",
    "ShareAgent": "queueflow.member.agent",
    "Send": "queueflow.member.agent.outputs",
    "DeadLetter": "queueflow.member.agent.outputs",
    "Result": "queueflow.member.agent.outputs",
    "USE_RECORD_KEY": "queueflow.member.agent.outputs",
    "COPY_OF_RECORD": "queueflow.member.agent.outputs",
    "ShareConsumer": "queueflow.member.consumer",
    "BrowsedRecord": "queueflow.member.browse",
    "Release": "queueflow.member.outcomes",
    "release": "queueflow.member.outcomes",
    "IllegalStateError": "queueflow.member.consumer",
    "ShareRecord": "queueflow.structs",
    "TopicPartition": "queueflow.structs",
    "ShareGroupSettings": "queueflow.settings",
    "ConfigurationError": "queueflow.errors",
    "CorruptStateError": "queueflow.errors",
    "ErrorCode": "queueflow.errors",
    "QueueflowError": "queueflow.errors",
    "ShareGroupError": "queueflow.errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'queueflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ACCEPT",
    "COPY_OF_RECORD",
    "REJECT",
    "RELEASE",
    "RENEW",
    "USE_RECORD_KEY",
    "AcknowledgeType",
    "App",
    "BrowsedRecord",
    "ConfigurationError",
    "CorruptStateError",
    "DeadLetter",
    "ErrorCode",
    "IllegalStateError",
    "QueueflowError",
    "Release",
    "Result",
    "Send",
    "ShareAgent",
    "ShareConsumer",
    "ShareGroupError",
    "ShareGroupSettings",
    "ShareGroups",
    "ShareRecord",
    "TopicPartition",
    "__version__",
    "attach",
    "release",
]
