"""Logging plumbing: structlog events as stdlib log records with their real level.

Opt-in: importing queueflow, building a :class:`queueflow.App`, calling :func:`queueflow.attach`
or building a :class:`~queueflow.member.consumer.ShareConsumer` leaves the process's logging
(stdlib and structlog) as it was. :func:`configure` is called by queueflow's own commands (the
``queueflow`` command line, the examples) and by every Faust worker of a queueflow app (on
Faust's ``on_worker_init``, which the ``faust`` command sends once it has loaded the app); a
program hosting queueflow calls it if it wants queueflow's set-up, or only
:func:`limit_client_logs` to keep aiokafka's connection errors down during an outage.

Without :func:`configure`, structlog prints to stdout; a Faust worker redirects stdout into
stdlib logging at INFO, so an ``error`` event comes out as INFO and vanishes under
``faust worker -l warn``. :func:`configure` routes structlog through :mod:`structlog.stdlib`:
each event becomes a :class:`logging.LogRecord` of the logger it was asked for
(``structlog.get_logger("queueflow.server.leader")``), at its own level, so the level Faust sets
on the root logger (``-l``) filters queueflow events like any other log line.

Output of the ``queueflow`` logger hierarchy goes to the process's real stderr
(``sys.__stderr__``, which Faust does not redirect), in one of two formats:

The format is the setting ``queueflow.log.format`` (:mod:`queueflow.settings`; environment
variable ``QUEUEFLOW_LOG_FORMAT``), one of:

``json`` (``QUEUEFLOW_LOG_FORMAT=json``)
    One JSON object per line with the keys ``event``, ``level`` (``debug``, ``info``,
    ``warning``, ``error``, ``critical``), ``logger`` (e.g. ``queueflow.server.leader``),
    ``timestamp`` (ISO 8601, UTC, e.g. ``2026-11-24T15:44:02.123456Z``), the event's own
    key-values (values that are not JSON are rendered with :func:`repr`) and, when the event
    carries an exception (``log.exception(...)``, ``exc_info=True``), ``exception`` with the
    formatted traceback. Other lines (Faust's own text logs) may be interleaved on the same
    streams; parsers skip lines that do not start with ``{``.
``console`` (``QUEUEFLOW_LOG_FORMAT=console``)
    structlog's human-readable rendering (coloured when stderr is a terminal).

``auto`` (the default)
    ``console`` when stderr is a terminal and ``json`` otherwise (containers, CI, log
    shippers).

structlog events of loggers outside ``queueflow.*`` (an application's own) are rendered to a text
message (``event key=value ...``) and go to whatever handlers the root logger has (Faust's).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, TextIO

import structlog

from queueflow.errors import ConfigurationError
from queueflow.settings import lookup

__all__ = [
    "FORMAT_ENV",
    "ROOT_LOGGER",
    "JunkDrops",
    "RepeatLimiter",
    "SkipLogLimiter",
    "configure",
    "get_logger",
    "limit_client_logs",
]

#: The environment variable of ``queueflow.log.format``: ``auto``, ``json`` or ``console``.
FORMAT_ENV = lookup("log_format").env
#: The stdlib logger whose hierarchy :func:`configure` sends to stderr.
ROOT_LOGGER = "queueflow"

# Marks the handler configure() installed, so that a second call replaces it (no double lines).
_MARK = "_queueflow_logging_handler"

EventDict = MutableMapping[str, Any]


def configure(
    json: bool | str | None = None,
    level: int | str | None = None,
    *,
    stream: TextIO | None = None,
) -> None:
    """Route structlog through stdlib logging and send ``queueflow.*`` records to stderr.

    Idempotent: a second call replaces the handler and structlog configuration of the first
    (never two handlers). Safe before Faust sets up its own logging in a worker: Faust's
    ``dictConfig`` keeps existing loggers (``disable_existing_loggers=False``) and its stdout
    redirection does not touch ``sys.__stderr__``. Tests that use
    :func:`structlog.testing.capture_logs` keep working (loggers are not cached on first use).

    Args:
        json: True for one JSON object per line, False for console rendering, a value of
            ``queueflow.log.format`` (``"auto"``, ``"json"``, ``"console"``), or None to read
            ``$QUEUEFLOW_LOG_FORMAT`` (unset: ``auto``: ``console`` if the stream is a
            terminal, else ``json``).
        level: level of the ``queueflow`` logger (``logging.INFO``, ``"info"``, ``"WARNING"``).
            None follows the root logger's output: the higher of the root logger's level and the
            lowest level of its console/file handlers, read at each record, so the level a Faust
            worker is started with (``faust worker -l warn``) applies once Faust has set it up.
        stream: where to write (tests); default ``sys.__stderr__``, the real stderr.

    Raises:
        ConfigurationError: the format (``json`` or ``$QUEUEFLOW_LOG_FORMAT``) is not one of
            ``auto``, ``json``, ``console``, or ``level`` is not a level.
    """
    out = stream or sys.__stderr__ or sys.stderr
    as_json = json if isinstance(json, bool) else _want_json(out, json)
    levelno = logging.NOTSET if level is None else _level_number(level)

    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared, _to_stdlib],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: structlog.testing.capture_logs() must still see events of module-level
        # loggers that have logged before; the cost is one bind per event.
        cache_logger_on_first_use=False,
    )

    renderer: list[structlog.typing.Processor]
    if as_json:
        renderer = [
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.ExceptionRenderer(),  # exc_info -> "exception": traceback text
            structlog.processors.JSONRenderer(),  # non-JSON values fall back to repr()
        ]
    else:
        renderer = [
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.dev.ConsoleRenderer(colors=_isatty(out)),
        ]
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=renderer,
            # Plain stdlib records of queueflow.* loggers get the same keys.
            foreign_pre_chain=shared,
        )
    )
    if level is None:
        handler.addFilter(_RootLevelFilter())
    setattr(handler, _MARK, True)

    logger = logging.getLogger(ROOT_LOGGER)
    for old in [h for h in logger.handlers if getattr(h, _MARK, False)]:
        logger.removeHandler(old)
        old.close()
    logger.addHandler(handler)
    logger.setLevel(levelno)
    # Our handler writes them; the root's (Faust's) would render the event dict a second time.
    logger.propagate = False
    logger.disabled = False
    limit_client_logs()


def get_logger(name: str, **context: Any) -> Any:
    """A structlog logger named ``name`` with ``context`` bound that takes structlog's
    configuration when it logs, not when it is made.

    ``structlog.get_logger(name).bind(...)`` assembles its logger from the configuration in force
    at the ``bind``: an object that binds its logger when it is built (before the host, or a
    Faust worker, has configured logging) would keep structlog's defaults. Use this for
    loggers bound in constructors; it costs one bind per event, as :func:`configure`'s
    uncached loggers already do.
    """
    return structlog.get_logger(name, **context)


class RepeatLimiter(logging.Filter):
    """Let at most ``per_second`` records of each kind through per second; drop the rest and
    say, in the next record of that kind let through, how many were dropped.

    A kind is (logger name, message template): ``Unable connect to node with id %s: %s`` is
    one kind whatever the node and error. Only WARNING and above are limited. During a broker
    outage aiokafka logs such lines thousands of times a second (3,070 lines/s, 40 MB in 15 s
    were measured); limited, a process logs at most ``per_second`` lines per kind.

    Args:
        per_second: records of one kind let through per one-second window (>= 1).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, per_second: int = 3, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        if per_second < 1:
            raise ConfigurationError(f"per_second={per_second}; must be >= 1")
        self.per_second = per_second
        self._clock = clock
        # kind -> [window start (s), records let through in it, records dropped in it]
        self._windows: dict[tuple[str, str], list[float]] = {}
        #: Records dropped so far, all kinds.
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window[0] >= 1.0:
            self._windows[key] = [now, 1, 0]
            if window is not None and window[2]:
                record.msg = (
                    f"{record.getMessage()} ({int(window[2])} similar lines suppressed in the "
                    f"last {now - window[0]:.1f} s)"
                )
                record.args = ()  # None: some formatters (mode's) turn it into (None,)
            return True
        if window[1] < self.per_second:
            window[1] += 1
            return True
        window[2] += 1
        self.dropped += 1
        return False


#: Client libraries whose connection errors repeat without bound during an outage.
CLIENT_LOGGERS = ("aiokafka", "kafka")


def limit_client_logs(
    prefixes: Iterable[str] = CLIENT_LOGGERS, per_second: int = 3
) -> RepeatLimiter:
    """Install one :class:`RepeatLimiter` (idempotent) on the Kafka client libraries' loggers
    (``aiokafka`` and every ``aiokafka.*`` logger created so far: a logger's filters don't see
    its children's records). Called by :func:`configure`; a host that keeps its own logging
    set-up may call it alone.

    Returns:
        The limiter (its ``dropped`` counts what it suppressed).
    """
    global _client_limiter
    if _client_limiter is None:
        _client_limiter = RepeatLimiter(per_second)
    names = set(prefixes)
    loggers = [logging.getLogger(n) for n in names] + [
        obj
        for name, obj in logging.Logger.manager.loggerDict.items()
        if isinstance(obj, logging.Logger) and any(name.startswith(p + ".") for p in names)
    ]
    for logger in loggers:
        if _client_limiter not in logger.filters:
            logger.addFilter(_client_limiter)
    return _client_limiter


_client_limiter: RepeatLimiter | None = None


class _RootLevelFilter(logging.Filter):
    """Let a record through only at the level the root logger's output would show it.

    Faust's worker (``-l warn``, with its progress spinner) sets the root *logger* to DEBUG and
    its console *handler* to the ``-l`` level, so the root logger's level alone does not say
    what Faust shows. The threshold is the higher of the root logger's effective level and the
    lowest level of its stream handlers (console or file; the spinner's handler is not one).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= _root_threshold()


def _root_threshold() -> int:
    root = logging.getLogger()
    outputs = [h.level for h in root.handlers if isinstance(h, logging.StreamHandler)]
    return max(root.getEffectiveLevel(), min(outputs, default=logging.NOTSET))


def _to_stdlib(logger: Any, method_name: str, event_dict: EventDict) -> Any:
    """Last structlog processor: hand the event to the stdlib logger.

    ``queueflow.*`` events keep their dict for our ProcessorFormatter; other loggers' events are
    rendered to text here, because the root logger's handlers (Faust's) format plain messages.
    """
    name = event_dict.get("logger", "")
    if name == ROOT_LOGGER or name.startswith(ROOT_LOGGER + "."):
        return structlog.stdlib.ProcessorFormatter.wrap_for_formatter(
            logger, method_name, event_dict
        )
    exc_info = event_dict.pop("exc_info", None)
    for key in ("level", "logger", "timestamp"):  # the stdlib formatter shows its own
        event_dict.pop(key, None)
    text = str(event_dict.pop("event", ""))
    if event_dict:
        text += " " + " ".join(f"{k}={v!r}" for k, v in event_dict.items())
    return (text,), ({"exc_info": exc_info} if exc_info else {})


def _want_json(out: TextIO, chosen: str | None = None) -> bool:
    """JSON or not, from ``chosen`` (a ``queueflow.log.format`` value) or the environment."""
    setting = lookup("log_format")
    if chosen is None:
        raw = os.environ.get(FORMAT_ENV, "").strip().lower() or "auto"
        value = setting.parse(raw, f"${FORMAT_ENV}")
    else:
        value = setting.parse(chosen.strip().lower(), "arguments")
    if value == "auto":
        return not _isatty(out)
    return value == "json"


def _level_number(level: int | str) -> int:
    if isinstance(level, int):
        return level
    name = level.strip().upper()
    if name.isdigit():
        return int(name)
    number = logging.getLevelName("WARNING" if name == "WARN" else name)
    if not isinstance(number, int):
        raise ConfigurationError(
            f"log level {level!r} is not a level; use debug, info, warning, error or critical"
        )
    return number


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # closed or file-like without isatty
        return False


class SkipLogLimiter:
    """Rate limit for the log lines of skipped (undecodable or unauthenticated) messages, so a
    flood of junk can't flood the log: at most ``burst`` lines per ``period_ms``.

    :meth:`admit` returns ``None`` for a line to suppress, else how many were suppressed since
    the last admitted one (log it as ``suppressed=n``). ``clock``: monotonic ms.
    """

    def __init__(
        self, clock: Callable[[], int], *, burst: int = 20, period_ms: int = 10_000
    ) -> None:
        self._clock = clock
        self._burst = burst
        self._period = period_ms
        self._start = clock()
        self._count = 0
        self.suppressed = 0
        #: Every skipped message, logged or not (for tests and metrics).
        self.total = 0

    def admit(self) -> int | None:
        """Count one skipped message; ``None`` if its line is to be suppressed."""
        self.total += 1
        now = self._clock()
        if now - self._start >= self._period:
            self._start, self._count = now, 0
        if self._count >= self._burst:
            self.suppressed += 1
            return None
        self._count += 1
        suppressed, self.suppressed = self.suppressed, 0
        return suppressed


class JunkDrops:
    """Counts and logs, rate-limited, the junk one receiver drops before decoding it
    (:mod:`queueflow.protocol.prefilter`): a flood costs a counter increment per record and at
    most ``burst`` log lines per ``period_ms`` (the next one says how many were suppressed).

    Args:
        log: the receiver's structlog logger.
        event: the log event (documented in docs/operations.md "Monitoring: log events").
        clock: monotonic ms.
        counter: ``queueflow_control_messages_dropped`` (a labelled prometheus counter) or None.
        receiver: its ``receiver`` label (``leader``, ``coordinator``, ``member``).
    """

    def __init__(
        self,
        log: Any,
        event: str,
        clock: Callable[[], int],
        counter: Any = None,
        receiver: str = "",
        *,
        burst: int = 20,
        period_ms: int = 10_000,
    ) -> None:
        self._log = log
        self._event = event
        self._counter = counter
        self._receiver = receiver
        self._children: dict[str, Any] = {}
        self.limiter = SkipLogLimiter(clock, burst=burst, period_ms=period_ms)

    @property
    def total(self) -> int:
        """Every junk record dropped so far."""
        return self.limiter.total

    def drop(self, reason: str, count: int = 1, **fields: Any) -> None:
        """Count ``count`` dropped records (``reason``: why) and log them in one line
        (``records=count`` when more than one) unless over the rate."""
        if self._counter is not None:
            child = self._children.get(reason)
            if child is None:
                child = self._children[reason] = self._counter.labels(self._receiver, reason)
            child.inc(count)
        limiter = self.limiter
        suppressed = limiter.admit()
        limiter.total += count - 1
        if suppressed is None:
            limiter.suppressed += count - 1
            return
        if count > 1:
            fields["records"] = count
        self._log.warning(self._event, reason=reason, suppressed=suppressed, **fields)
