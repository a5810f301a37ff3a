"""Connection errors logged rate-limited (issue #13, "Outages"): :class:`RepeatLimiter`."""

from __future__ import annotations

import logging

import pytest

from queueflow.errors import ConfigurationError
from queueflow.logging import RepeatLimiter, limit_client_logs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(
    msg: str = "Unable connect to node with id %s: %s",
    *args: object,
    level: int = logging.ERROR,
    name: str = "aiokafka",
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args or (1, "refused"), None)


def test_a_few_lines_a_second_pass_and_the_next_one_counts_the_rest() -> None:
    clock = Clock()
    limiter = RepeatLimiter(per_second=3, clock=clock)
    passed = [limiter.filter(record()) for _ in range(100)]
    assert passed.count(True) == 3 and passed[:3] == [True] * 3
    assert limiter.dropped == 97
    clock.now += 1.2
    r = record("Unable connect to node with id %s: %s", 2, "reset")
    assert limiter.filter(r)
    assert r.getMessage() == (
        "Unable connect to node with id 2: reset (97 similar lines suppressed in the last 1.2 s)"
    )
    # A quiet window says nothing extra.
    clock.now += 5
    quiet = record()
    assert (
        limiter.filter(quiet) and quiet.getMessage() == "Unable connect to node with id 1: refused"
    )


def test_kinds_are_limited_apart_and_info_is_not_limited() -> None:
    limiter = RepeatLimiter(per_second=1, clock=Clock())
    assert limiter.filter(record())
    assert not limiter.filter(record())
    assert limiter.filter(record("Unable to update metadata from %s", "n1"))
    assert limiter.filter(record(name="aiokafka.conn"))  # another logger: another kind
    assert all(limiter.filter(record(level=logging.INFO)) for _ in range(10))


def test_per_second_must_be_positive() -> None:
    with pytest.raises(ConfigurationError):
        RepeatLimiter(per_second=0)


def test_limit_client_logs_covers_aiokafka_loggers_once() -> None:
    import aiokafka.conn  # noqa: F401 (creates the aiokafka.conn logger)

    limiter = limit_client_logs()
    assert limit_client_logs() is limiter
    # aiokafka.client logs as "aiokafka"; a logger's filters don't see its children's records
    for name in ("aiokafka", "aiokafka.conn"):
        assert logging.getLogger(name).filters.count(limiter) == 1, name


def test_the_summary_line_formats_under_faust_s_log_formatter() -> None:
    """Faust workers format records with mode's formatter, which wraps non-tuple ``args``
    (``None`` became ``(None,)`` and the summary line a "--- Logging error ---" traceback,
    seen in a chaos run): the summary keeps a tuple."""
    from mode.utils.logging import ExtensionFormatter

    clock = Clock()
    limiter = RepeatLimiter(per_second=1, clock=clock)
    assert limiter.filter(record()) and not limiter.filter(record())
    clock.now += 1.5
    summary = record()
    assert limiter.filter(summary)
    text = ExtensionFormatter(fmt="%(message)s").format(summary)
    assert text == (
        "Unable connect to node with id 1: refused (1 similar lines suppressed in the last 1.5 s)"
    )
