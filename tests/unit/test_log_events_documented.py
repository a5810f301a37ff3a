"""Every structlog event name logged in ``queueflow/`` has a row in docs/operations.md's event
table ("Monitoring: log events"), so the table stays complete (issue #14 item 6)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "msg"}
EVENT = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)+")  # snake_case: event names, not text messages


def logged_events() -> dict[str, list[str]]:
    """Event name -> where it is logged: the first argument (a string literal, or either branch
    of a conditional) of every ``<logger>.<level>(...)`` call in the package, and the second of
    every ``LogEvent(level, event, ...)`` (a log line a leader handler returns)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "queueflow").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name) and node.func.id == "LogEvent":
                if len(node.args) < 2:
                    continue
                first = node.args[1]
            elif isinstance(node.func, ast.Attribute) and node.func.attr in METHODS and node.args:
                first = node.args[0]
            else:
                continue
            choices = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
            for c in choices:
                value = c.value if isinstance(c, ast.Constant) else None
                if isinstance(value, str) and EVENT.fullmatch(value):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.setdefault(value, []).append(where)
    return found


def documented_events() -> set[str]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("## Monitoring: log events", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.MULTILINE))


def test_the_scan_finds_events() -> None:
    events = logged_events()
    # a sample from each layer, and a conditional event name
    for name in ("leader_assigned", "share_agent_started", "share_partition_deleted"):
        assert name in events, name
    assert len(events) >= 80


def test_every_logged_event_has_a_row_in_the_table() -> None:
    missing = {n: w for n, w in logged_events().items() if n not in documented_events()}
    assert not missing, (
        "log events without a row in docs/operations.md 'Monitoring: log events' "
        f"(add one: | `event` | level | logger | fields | meaning |): {missing}"
    )
