"""Fixtures of the unit tests."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Tests that call ``queueflow.logging.configure`` (directly or through a worker hook):
    put the ``queueflow`` logger and structlog back as they were for the tests that follow."""
    logger = logging.getLogger("queueflow")
    saved = (list(logger.handlers), logger.propagate, logger.level, logger.disabled)
    config = structlog.get_config()
    try:
        yield
    finally:
        for handler in logger.handlers:
            if handler not in saved[0]:
                handler.close()
        logger.handlers[:] = saved[0]
        logger.propagate, logger.disabled = saved[1], saved[3]
        logger.setLevel(saved[2])
        structlog.configure(**config)


@pytest.fixture
def faust_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    """For tests that build a queueflow app without starting it: Faust's services take the
    current event loop (creating one if need be), so give them one that is closed afterwards
    (tests run coroutines on it); and no role or leader group setting from the environment."""
    from queueflow.faust_app import LEADER_GROUP_DEFAULTS

    monkeypatch.delenv("QUEUEFLOW_ROLE", raising=False)
    for name in LEADER_GROUP_DEFAULTS:
        monkeypatch.delenv(name.upper(), raising=False)
    event_loop = asyncio.new_event_loop()
    asyncio.set_event_loop(event_loop)
    try:
        yield event_loop
    finally:
        asyncio.set_event_loop(None)
        event_loop.close()
