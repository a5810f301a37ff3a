"""The readers a leader runs per share-partition to tail its source partition: the key index of
key-ordered sharing (:mod:`queueflow.server.leader.key_index`) and the hole readers
(:mod:`queueflow.server.leader.holes`). One task per ``(group, partition)``; a reader that fails
(the broker restarting) is reopened after :data:`RETRY_S`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from queueflow.server.context import KeyTail

__all__ = ["RETRY_S", "TailTasks"]

#: How long a reader that failed waits before it tries again (s).
RETRY_S = 1.0


class _Tail(Protocol):
    task: asyncio.Task[None] | None


T = TypeVar("T", bound=_Tail)


class TailTasks(Generic[T]):
    """The tailing tasks of one leader's share-partitions (one source topic), by
    ``(group, partition)``.

    Subclasses name their log events: ``STOPPED_EVENT`` (info: group, partition, reason) and
    ``FAILED_EVENT`` (warning: partition, error).

    Args:
        log: the leader's logger (:func:`queueflow.logging.get_logger`).
    """

    STOPPED_EVENT: ClassVar[str]
    FAILED_EVENT: ClassVar[str]

    def __init__(self, log: Any) -> None:
        self._tails: dict[tuple[str, int], T] = {}
        self._log = log

    def stop(self, partitions: set[int] | None = None) -> None:
        """Stop the readers of ``partitions`` (``None``: all): their share-partitions were
        dropped (revoked, stepped down, deleted)."""
        for key in list(self._tails):
            if partitions is None or key[1] in partitions:
                self._stop(key, "dropped")

    def _stop(self, key: tuple[str, int], why: str) -> None:
        tail = self._tails.pop(key)
        if tail.task is not None:
            tail.task.cancel()
        self._log.info(self.STOPPED_EVENT, group=key[0], partition=key[1], reason=why)

    async def close(self) -> None:
        """Stop every reader and wait for them."""
        tasks = [t.task for t in self._tails.values() if t.task is not None]
        self.stop()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(
        self,
        partition: int,
        open_reader: Callable[[], Awaitable[KeyTail]],
        follow: Callable[[KeyTail], Awaitable[None]],
    ) -> None:
        """Open a reader and ``follow`` it until it returns (the share-partition was dropped)
        or the task is cancelled; a reader that fails to open or to read is closed and opened
        again after :data:`RETRY_S`, logging ``FAILED_EVENT``."""
        while True:
            try:
                reader = await open_reader()
            except Exception as exc:
                self._log.warning(self.FAILED_EVENT, partition=partition, error=repr(exc))
                await asyncio.sleep(RETRY_S)
                continue
            try:
                await follow(reader)
                return
            except Exception as exc:  # the broker may be restarting: read again
                self._log.warning(self.FAILED_EVENT, partition=partition, error=repr(exc))
                await asyncio.sleep(RETRY_S)
            finally:
                await reader.close()
