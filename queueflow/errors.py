"""Errors raised by queueflow, with the Kafka error codes they correspond to.

Every error says what was wrong and what to do about it. Protocol-level failures carry an
:class:`ErrorCode` named after the Kafka error code KIP-932 uses for the same condition, so that
logs and metrics read the same as a Kafka broker's.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Protocol error codes (KIP-932 "ShareFetch API" / "ShareAcknowledge API" error lists)."""

    NONE = "NONE"
    #: An acknowledgement names a record that is not Acquired by the acknowledging member.
    INVALID_RECORD_STATE = "INVALID_RECORD_STATE"
    #: A malformed request: overlapping or unordered ranges, bad acknowledge type, bad limits.
    INVALID_REQUEST = "INVALID_REQUEST"
    #: A group config name is unknown or its value is invalid or out of range (Kafka's
    #: ``INVALID_CONFIG``, as ``incrementalAlterConfigs`` answers).
    INVALID_CONFIG = "INVALID_CONFIG"
    #: A state write or fetch from a leader whose state epoch is older than the durable one.
    FENCED_STATE_EPOCH = "FENCED_STATE_EPOCH"
    #: The member is not (or no longer) in the share group.
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    #: The member's epoch is older than the coordinator's.
    FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"
    #: This process no longer leads the share-partition.
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
    #: The topic or partition does not exist.
    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    #: The share group is unknown.
    GROUP_ID_NOT_FOUND = "GROUP_ID_NOT_FOUND"
    #: The group has reached ``group.share.max.size`` members.
    GROUP_MAX_SIZE_REACHED = "GROUP_MAX_SIZE_REACHED"
    #: The share-partition's durable state is corrupt or of an unknown version.
    CORRUPT_STATE = "CORRUPT_STATE"
    #: The group is not empty, so the operation (reset, delete) is not allowed.
    NON_EMPTY_GROUP = "NON_EMPTY_GROUP"
    #: The request timed out before a leader or coordinator answered.
    REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"
    #: The member speaks a protocol version this coordinator does not support (the heartbeat's
    #: ``protocol_version`` is outside ``SUPPORTED_PROTOCOL_VERSIONS``); upgrade or downgrade
    #: queueflow on one side. Not retriable: the same request fails again.
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"

    @property
    def retriable(self) -> bool:
        """True when the same request may succeed later without the caller changing anything
        (a leader moving or restarting), as for Kafka's ``RetriableException``."""
        return self in _RETRIABLE


_RETRIABLE = frozenset(
    {ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_STATE_EPOCH}
)


class QueueflowError(Exception):
    """Base class of every error queueflow raises."""


class IllegalTransitionError(QueueflowError, ValueError, RuntimeError):
    """A lifecycle was asked to move along a transition its table does not allow (a bug, or a
    method called out of order, such as ``ShareAgent.start`` after ``stop``). Every named
    state of the engine, the server and the member side raises it."""


class ConfigurationError(QueueflowError, ValueError):
    """A setting is missing, of the wrong type, or out of its allowed range.

    The message names the setting, the value given and the allowed range.
    """


class UnknownNameError(ConfigurationError, TypeError):
    """An unknown keyword argument, setting name or ``QUEUEFLOW_*`` environment variable (a
    typo would otherwise be silently ignored). The message names it, suggests the closest known
    names (did you mean ...?) and says where the known ones are listed. A ``TypeError`` too, as
    Python raises for an unexpected keyword argument."""


class UnknownNameWarning(UserWarning):
    """A keyword argument queueflow passes through to Faust that Faust doesn't know either (it
    has no effect); the message suggests the closest known names."""


class ShareGroupError(QueueflowError):
    """A share-group protocol error, carrying a KIP-932 :class:`ErrorCode`.

    Args:
        code: the Kafka error code for the condition.
        message: what was wrong and what to do.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class InvalidRecordStateError(ShareGroupError):
    """An acknowledgement names a record not Acquired by that member (KIP-932 ShareAcknowledge)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_RECORD_STATE, message)


class InvalidRequestError(ShareGroupError):
    """A request is malformed (KIP-932 ShareFetch/ShareAcknowledge ``INVALID_REQUEST``)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message)


class FencedStateEpochError(ShareGroupError):
    """A stale leader tried to write state (KIP-932 WriteShareGroupState ``FENCED_STATE_EPOCH``)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.FENCED_STATE_EPOCH, message)


class CorruptStateError(ShareGroupError):
    """Durable share-partition state cannot be decoded; the leader refuses to serve it.

    The message names the group, topic and partition, and what was found.
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CORRUPT_STATE, message)


class BrokerError(QueueflowError):
    """The local Kafka broker could not be resolved, formatted, started or reached."""
