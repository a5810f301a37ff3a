"""``queueflow.logging.configure``: structlog through stdlib logging, JSON lines on stderr."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

import queueflow.logging as qlogging
from queueflow.errors import ConfigurationError


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """configure() changes process-wide state; put structlog and the loggers back afterwards."""
    monkeypatch.delenv(qlogging.FORMAT_ENV, raising=False)
    saved = structlog.get_config()
    qf = logging.getLogger("queueflow")
    root = logging.getLogger()
    state = (list(qf.handlers), qf.level, qf.propagate, root.level)
    yield
    structlog.configure(**saved)
    qf.handlers[:] = state[0]
    qf.setLevel(state[1])
    qf.propagate = state[2]
    root.setLevel(state[3])


class Records(logging.Handler):
    """Collects the LogRecords that reach a logger."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.startswith("{")]


def test_error_event_keeps_its_level_under_a_warning_root() -> None:
    logging.getLogger().setLevel(logging.WARNING)  # what `faust worker -l warn` does
    buf = io.StringIO()
    qlogging.configure(json=True, stream=buf)
    seen = Records()
    logging.getLogger("queueflow").addHandler(seen)
    log = structlog.get_logger("queueflow.server.leader")
    log.info("not shown", x=1)
    log.error("boom", x=2)
    assert [(r.levelno, r.name) for r in seen.records] == [
        (logging.ERROR, "queueflow.server.leader")
    ]
    assert [(e["event"], e["level"]) for e in lines(buf)] == [("boom", "error")]


def test_faust_spinner_setup_still_filters_at_the_handler_level() -> None:
    # `faust worker -l warn` with its spinner: root logger DEBUG, console handler WARNING, and a
    # DEBUG-level spinner handler that prints nothing.
    root = logging.getLogger()
    console, spinner = logging.StreamHandler(io.StringIO()), logging.NullHandler()
    console.setLevel(logging.WARNING)
    saved = root.handlers[:]
    root.handlers[:] = [console, spinner]  # Faust clears the root's handlers (pytest's too)
    root.setLevel(logging.DEBUG)
    try:
        buf = io.StringIO()
        qlogging.configure(json=True, stream=buf)
        log = structlog.get_logger("queueflow.server.leader")
        log.debug("d")
        log.info("i")
        log.warning("w")
        log.error("e")
    finally:
        root.handlers[:] = saved
    assert [e["level"] for e in lines(buf)] == ["warning", "error"]


def test_root_level_info_lets_info_through() -> None:
    logging.getLogger().setLevel(logging.INFO)  # `faust worker -l info`
    buf = io.StringIO()
    qlogging.configure(json=True, stream=buf)
    structlog.get_logger("queueflow.member").info("hello")
    assert [e["level"] for e in lines(buf)] == ["info"]


def test_explicit_level_overrides_the_root_level() -> None:
    logging.getLogger().setLevel(logging.ERROR)
    buf = io.StringIO()
    qlogging.configure(json=True, level="debug", stream=buf)
    structlog.get_logger("queueflow.x").debug("fine detail")
    assert [e["level"] for e in lines(buf)] == ["debug"]
    with pytest.raises(ConfigurationError, match="not a level"):
        qlogging.configure(json=True, level="chatty", stream=buf)


def test_json_lines_carry_the_contract_keys() -> None:
    buf = io.StringIO()
    qlogging.configure(json=True, level=logging.DEBUG, stream=buf)
    log = structlog.get_logger("queueflow.server.leader")
    marker = object()
    log.debug("d")
    log.info("i", topic="orders", partition=3, ratio=0.5, flags=[1, 2], obj=marker)
    log.warning("w")
    log.error("e")
    log.critical("c")
    out = lines(buf)
    assert len(out) == len(buf.getvalue().splitlines()) == 5  # one object per line
    assert [e["level"] for e in out] == ["debug", "info", "warning", "error", "critical"]
    for e in out:
        assert {"event", "level", "logger", "timestamp"} <= set(e)
        assert e["logger"] == "queueflow.server.leader"
        stamp = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
        assert stamp.utcoffset() == timezone.utc.utcoffset(None)
    info = out[1]
    assert (info["event"], info["topic"], info["partition"], info["ratio"], info["flags"]) == (
        "i",
        "orders",
        3,
        0.5,
        [1, 2],
    )
    assert info["obj"] == repr(marker)


def test_exceptions_are_an_exception_key() -> None:
    buf = io.StringIO()
    qlogging.configure(json=True, stream=buf)
    log = structlog.get_logger("queueflow.member.agent")
    try:
        raise RuntimeError("handler failed")
    except RuntimeError:
        log.exception("handler raised", offset=7)
        log.warning("again", exc_info=True)
    first, second = lines(buf)
    assert first["level"] == "error" and first["offset"] == 7
    assert "Traceback (most recent call last)" in first["exception"]
    assert "RuntimeError: handler failed" in first["exception"]
    assert second["level"] == "warning" and "RuntimeError" in second["exception"]
    assert "exc_info" not in first


def test_plain_stdlib_records_of_queueflow_loggers_get_the_same_keys() -> None:
    buf = io.StringIO()
    qlogging.configure(json=True, stream=buf)
    logging.getLogger("queueflow.kafka").warning("broker %s is slow", "b1")
    (e,) = lines(buf)
    assert (e["event"], e["level"], e["logger"]) == (
        "broker b1 is slow",
        "warning",
        "queueflow.kafka",
    )
    assert "timestamp" in e


def test_configure_twice_does_not_double_lines() -> None:
    buf = io.StringIO()
    qlogging.configure(json=True, stream=buf)
    qlogging.configure(json=True, stream=buf)
    qlogging.configure(json=False, stream=io.StringIO())
    qlogging.configure(json=True, stream=buf)
    structlog.get_logger("queueflow.x").error("once")
    assert [e["event"] for e in lines(buf)] == ["once"]
    assert len(logging.getLogger("queueflow").handlers) == 1


def test_capture_logs_still_works_after_configure() -> None:
    buf = io.StringIO()
    qlogging.configure(json=True, stream=buf)
    log = structlog.get_logger("queueflow.server.coordinator")
    log.error("before")  # a module-level logger that has logged already
    with capture_logs() as captured:
        log.info("member joined", member="m1")
        log.debug("below every level")  # capture_logs sees everything, as without configure()
    assert captured == [
        {"event": "member joined", "member": "m1", "log_level": "info"},
        {"event": "below every level", "log_level": "debug"},
    ]
    log.error("after")
    assert [e["event"] for e in lines(buf)] == ["before", "after"]


def test_console_format_is_human_readable() -> None:
    buf = io.StringIO()
    qlogging.configure(json=False, stream=buf)
    structlog.get_logger("queueflow.leader").error("lock expired", offset=5)
    text = buf.getvalue()
    assert not text.startswith("{")
    assert "lock expired" in text and "offset=5" in text and "queueflow.leader" in text
    assert "\x1b[" not in text  # no colours on a non-terminal


@pytest.mark.parametrize(("value", "is_json"), [("json", True), ("JSON", True), ("console", False)])
def test_format_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, is_json: bool
) -> None:
    monkeypatch.setenv("QUEUEFLOW_LOG_FORMAT", value)
    buf = io.StringIO()
    qlogging.configure(stream=buf)
    structlog.get_logger("queueflow.x").error("e")
    assert buf.getvalue().startswith("{") is is_json


def test_unset_format_is_json_when_not_a_terminal() -> None:
    buf = io.StringIO()  # isatty() is False
    qlogging.configure(stream=buf)
    structlog.get_logger("queueflow.x").error("e")
    assert lines(buf)[0]["event"] == "e"


def test_bad_format_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUEFLOW_LOG_FORMAT", "xml")
    with pytest.raises(
        ConfigurationError, match=r"queueflow.log.format='xml' \(from \$QUEUEFLOW_LOG_FORMAT\)"
    ):
        qlogging.configure(stream=io.StringIO())
    with pytest.raises(ConfigurationError, match=r"choose one of auto \| json \| console"):
        qlogging.configure("yaml", stream=io.StringIO())


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("setting", "terminal", "json_lines"),
    [
        ("auto", True, False),
        ("auto", False, True),
        ("json", True, True),
        ("console", False, False),
    ],
)
def test_the_log_format_setting_chooses_json_or_console(
    setting: str, terminal: bool, json_lines: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queueflow.settings import ShareGroupSettings

    monkeypatch.setenv("QUEUEFLOW_LOG_FORMAT", setting)
    settings = ShareGroupSettings.load()  # one setting, read from its env var
    assert settings.log_format == setting
    buf = Terminal() if terminal else io.StringIO()
    qlogging.configure(settings.log_format, stream=buf)
    structlog.get_logger("queueflow.x").warning("hello", group="g", partition=1)
    out = buf.getvalue()
    assert out.startswith("{") is json_lines, out
    assert "hello" in out and "partition" in out


def test_other_structlog_loggers_reach_the_root_handlers_as_text() -> None:
    buf = io.StringIO()
    qlogging.configure(json=True, stream=buf)
    seen = Records()
    root = logging.getLogger()
    root.addHandler(seen)
    root.setLevel(logging.WARNING)
    try:
        structlog.get_logger("myapp.orders").warning("late order", order_id=12)
    finally:
        root.removeHandler(seen)
    assert [(r.name, r.levelno, r.getMessage()) for r in seen.records] == [
        ("myapp.orders", logging.WARNING, "late order order_id=12")
    ]
    assert buf.getvalue() == ""


def test_json_goes_to_the_real_stderr_even_when_stdio_is_redirected() -> None:
    # As in a Faust worker, which replaces sys.stdout/sys.stderr with proxies into logging.
    script = (
        "import io, sys, structlog, queueflow.logging as q\n"
        "q.configure()\n"
        "sys.stdout = sys.stderr = io.StringIO()\n"
        "structlog.get_logger('queueflow.leader').error('to stderr', n=1)\n"
    )
    env = {**os.environ, "QUEUEFLOW_LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    event = json.loads(line)
    assert (event["event"], event["level"], event["logger"], event["n"]) == (
        "to stderr",
        "error",
        "queueflow.leader",
        1,
    )


# --- Logging is opt-in: building queueflow objects leaves the host's logging alone ----------


def logging_state() -> dict[str, Any]:
    """What a host may have set up: the root and queueflow loggers, the Kafka client loggers'
    filters, and structlog's configuration."""
    root, qf = logging.getLogger(), logging.getLogger("queueflow")
    clients = {
        name: list(obj.filters)
        for name, obj in logging.Logger.manager.loggerDict.items()
        if isinstance(obj, logging.Logger) and name.split(".")[0] in ("aiokafka", "kafka")
    }
    return {
        "root": (list(root.handlers), root.level),
        "queueflow": (list(qf.handlers), qf.level, qf.propagate, qf.disabled),
        "clients": clients,
        "structlog": (structlog.is_configured(), structlog.get_config()),
    }


def test_building_an_app_attaching_or_a_share_consumer_leaves_logging_alone() -> None:
    import faust

    import queueflow
    from queueflow.member.consumer import ShareConsumer

    before = logging_state()
    app = queueflow.App("qf-log-optin", broker="kafka://localhost:1", store="memory://")

    @app.share_agent("jobs", group="g")
    async def handle(record: Any) -> None:
        return None

    queueflow.App("qf-log-optin-m", broker="kafka://localhost:1", role="member")
    queueflow.attach(faust.App("qf-log-optin-attach", broker="kafka://localhost:1"))
    ShareConsumer("g", app_id="qf-log-optin", bootstrap_servers="localhost:1")
    assert logging_state() == before


def test_the_faust_worker_init_hook_configures_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    import queueflow

    monkeypatch.setenv("QUEUEFLOW_LOG_FORMAT", "json")
    app = queueflow.App("qf-log-hook", broker="kafka://localhost:1", store="memory://")
    qf = logging.getLogger("queueflow")
    assert not [h for h in qf.handlers if getattr(h, qlogging._MARK, False)]
    app.on_worker_init.send()  # what the faust command does once it has loaded the app
    (handler,) = [h for h in qf.handlers if getattr(h, qlogging._MARK, False)]
    assert qf.propagate is False and structlog.is_configured()
    assert isinstance(handler.formatter, structlog.stdlib.ProcessorFormatter)


def test_a_process_run_by_the_faust_command_logs_json_lines(tmp_path: Any) -> None:
    # The integration tests and the examples read these lines from their workers' logs,
    # including those of objects built (and their loggers bound) when the app module loads.
    (tmp_path / "qf_log_worker_app.py").write_text(
        "import atexit, structlog, queueflow\n"
        "app = queueflow.App('qf-log-worker', broker='kafka://localhost:1', store='memory://')\n"
        "@app.share_agent('jobs', group='g')\n"
        "async def handle(record):\n"
        "    return None\n"
        "def bye():\n"
        "    structlog.get_logger('queueflow.probe').warning('probe', n=1)\n"
        "    handle.log.warning('agent_probe')\n"
        "atexit.register(bye)\n"
    )
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "QUEUEFLOW_LOG_FORMAT": "json", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "faust", "-A", "qf_log_worker_app", "agents"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
    assert [(e["event"], e["logger"]) for e in events] == [
        ("probe", "queueflow.probe"),
        ("agent_probe", "queueflow.member.agent"),
    ], done.stdout + done.stderr
    assert events[1]["group"] == "g" and events[1]["topic"] == "jobs"


def test_a_host_process_is_not_taken_for_the_faust_command() -> None:
    from queueflow.faust_app import run_by_faust_command

    assert run_by_faust_command() is False  # pytest's process


def test_get_logger_follows_a_configuration_made_after_it() -> None:
    structlog.reset_defaults()  # an unconfigured host (the fixture puts the configuration back)
    early = qlogging.get_logger("queueflow.member.agent", group="g")
    snapshot = structlog.get_logger("queueflow.member.agent").bind(group="g")
    buf = io.StringIO()
    qlogging.configure(json=True, stream=buf)
    early.warning("late_config", n=1)
    assert [(e["event"], e["group"], e["n"]) for e in lines(buf)] == [("late_config", "g", 1)]
    assert not isinstance(snapshot, structlog.stdlib.BoundLogger)  # what bind() at build keeps
