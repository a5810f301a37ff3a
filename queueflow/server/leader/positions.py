"""The last request each request partition's leader applied (its position), persisted with the
state so that no request is applied twice.

Faust resumes a partition from its committed offset, which lags (the commit interval, and
faust-streaming issue 606 on GitHub), so requests already applied come round again; applied
twice, an old RELEASE would release a record acquired since. The offset is written to the state
table after the state changes of the request (:func:`~queueflow.protocol.state_codec.
request_position_key`), so a new leader skips what its predecessor applied.
"""

from __future__ import annotations

from collections.abc import Callable

from queueflow.errors import CorruptStateError
from queueflow.logging import get_logger
from queueflow.protocol.state_codec import (
    decode_request_position,
    encode_request_position,
    request_position_key,
)
from queueflow.server.durable import StateTable

__all__ = ["RequestPositions"]


class RequestPositions:
    """Request partition -> offset of the last request applied, read from the table once.

    Args:
        table: the state table.
        topic: the source topic (for logs).
        request_topic: its request topic (for errors), or the ack topic.
        key: the table key of a partition's position: :func:`~queueflow.protocol.state_codec.
            request_position_key`, or :func:`~queueflow.protocol.state_codec.ack_position_key`
            for the ack reader of an exactly-once leader.
    """

    def __init__(
        self,
        table: StateTable,
        topic: str,
        request_topic: str,
        key: Callable[[int], bytes] = request_position_key,
    ) -> None:
        self.table = table
        self.request_topic = request_topic
        self._key = key
        self._applied: dict[int, int] = {}
        self._log = get_logger("queueflow.server.leader", topic=topic)

    def known(self, partition: int) -> bool:
        """True once the position of ``partition`` was read (since it was last forgotten)."""
        return partition in self._applied

    def load(self, partition: int) -> int:
        """Read the persisted position of ``partition`` (again) and return it."""
        applied = self._applied[partition] = self._persisted(partition)
        return applied

    def admit(self, partition: int, offset: int) -> bool:
        """True if the request at ``offset`` was not applied yet; it counts as applied from
        now on (in memory: :meth:`write` persists it)."""
        applied = self._applied.get(partition)
        if applied is None:
            applied = self.load(partition)
        if offset <= applied:
            return False  # applied before, here or by the previous leader (Faust re-delivers)
        self._applied[partition] = offset
        return True

    def applied(self, partition: int) -> int:
        """The offset of the last request of ``partition`` applied (read once from the table)."""
        applied = self._applied.get(partition)
        return self.load(partition) if applied is None else applied

    def forget(self, partition: int) -> None:
        """Re-read the position when ``partition`` comes back (others may apply more)."""
        self._applied.pop(partition, None)

    def write(self, partition: int, offset: int) -> None:
        """Persist ``offset`` as the last request of ``partition`` applied (after its state)."""
        self.table[self._key(partition)] = encode_request_position(offset)

    def _persisted(self, partition: int) -> int:
        """The offset of the last request of ``partition`` whose changes a leader wrote (-1:
        none, or unreadable: then requests are applied from Faust's committed offset)."""
        raw = self.table.get(self._key(partition))
        if raw is None:
            return -1
        try:
            return decode_request_position(raw, where=f"{self.request_topic}[{partition}]")
        except CorruptStateError as exc:
            self._log.error("request_position_refused", partition=partition, error=str(exc))
            return -1
