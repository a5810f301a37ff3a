"""Stopping aiokafka clients without letting their shutdown errors escape."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

__all__ = ["stop_quietly"]

log = structlog.get_logger("queueflow.kafka")


async def stop_quietly(what: str, stop: Callable[[], Awaitable[object]]) -> None:
    """Run ``stop()`` (an aiokafka client's ``stop``), logging instead of raising its errors.

    With the broker gone, ``AIOKafkaProducer.stop()`` can raise ``CancelledError`` out of its
    sender task although nobody cancelled the caller; let through, it looks like a cancellation
    of whatever closes the client (a Faust worker starting a share agent then exits with
    status 0, saying nothing). Such a ``CancelledError`` is logged as ``client_stop_failed``;
    a real cancellation of the calling task (Python 3.11+ tells them apart) is re-raised.

    Args:
        what: what is stopped, for the log (``"member producer"``).
        stop: the client's ``stop`` method.
    """
    try:
        await stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        cancelling = getattr(task, "cancelling", None)
        if cancelling is None or cancelling():
            raise
        log.warning("client_stop_failed", client=what, error="CancelledError")
    except Exception as exc:  # the client is gone either way
        log.warning("client_stop_failed", client=what, error=repr(exc))
