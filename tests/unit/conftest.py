"""Fixtures of the unit tests."""

from __future__ import annotations

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
