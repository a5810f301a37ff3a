"""Running aiokafka coroutines from the synchronous devtools API."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_blocking"]

_T = TypeVar("_T")


def run_blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion, also from code already inside a running event loop.

    Inside a running loop (e.g. an async test) the coroutine runs on a fresh loop in a helper
    thread, since the caller's loop cannot be re-entered. Exceptions propagate.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="queueflow-broker") as ex:
        return ex.submit(asyncio.run, coro).result()
