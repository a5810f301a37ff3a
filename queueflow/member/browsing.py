"""``ShareConsumer.browse``: a share group's records with their share states, acquiring nothing
(docs/guide.md "Browsing"; the rules are in :mod:`queueflow.member.browse`)."""

from __future__ import annotations

from queueflow.member.browse import DEFAULT_BROWSE_RECORDS, BrowsedRecord, browse
from queueflow.member.context import MemberContext

__all__ = ["Browsing"]


class Browsing:
    """The browse mode of :class:`~queueflow.member.consumer.ShareConsumer` (a mixin: it
    uses the consumer's group, app id and member context)."""

    group: str
    app_id: str
    ctx: MemberContext

    def _check_open(self) -> None:
        """Raise if the consumer is closed (the consumer's own check)."""

    async def browse(
        self,
        topic: str,
        partition: int | None = None,
        *,
        from_offset: int | None = None,
        max_records: int = DEFAULT_BROWSE_RECORDS,
    ) -> list[BrowsedRecord]:
        """Look at this group's records of ``topic`` with their share states (Available,
        Acquired with lock owner and deadline, Acknowledged, Archived) and delivery counts,
        acquiring nothing and changing no delivery count (docs/guide.md "Browsing"). Needs
        no :meth:`subscribe`; the group must exist (a member has joined it once).

        Args:
            topic: a source topic of the group.
            partition: one partition, or ``None`` for each partition of the topic.
            from_offset: the first offset (default: the share-partition start offset).
            max_records: the most records per partition (1..10,000).

        Returns:
            :class:`~queueflow.member.browse.BrowsedRecord` objects in (partition, offset)
            order.

        Raises:
            IllegalStateError: the consumer is closed.
            ShareGroupError: ``GROUP_ID_NOT_FOUND``: no member ever joined the group.
            ConfigurationError: no such topic or partition, or a bad argument.
            TimeoutError: the state or the records can't be read within
                ``queueflow.request.timeout.ms``.
        """
        self._check_open()
        return await browse(
            self.ctx.io.browse_source(),
            self.app_id,
            self.group,
            topic,
            partition,
            from_offset=from_offset,
            max_records=max_records,
        )
