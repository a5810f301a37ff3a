"""docs/configuration.md's settings table is generated from ``queueflow.settings.SETTINGS``."""

from __future__ import annotations

from pathlib import Path

import pytest

from queueflow.settings import (
    SETTINGS,
    TABLE_END,
    TABLE_START,
    markdown_table,
    show_value,
    with_markdown_table,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
REGENERATE = "python -m queueflow.settings --write docs/configuration.md"


def test_doc_table_is_the_generated_one() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text.count(TABLE_START) == 1 and text.count(TABLE_END) == 1, (
        f"{DOC.name} needs exactly one {TABLE_START} ... {TABLE_END} pair"
    )
    assert with_markdown_table(text) == text, (
        f"the settings table in docs/configuration.md differs from queueflow.settings.SETTINGS; "
        f"regenerate it with: {REGENERATE}"
    )


def test_table_has_a_row_per_setting() -> None:
    table = markdown_table()
    rows = table.splitlines()[2:]
    assert len(rows) == len(SETTINGS)
    for row, s in zip(rows, SETTINGS, strict=True):
        assert row.startswith(
            f"| `{s.name}` <br>(`{s.attr}`) | `{s.env}` | `{show_value(s.default)}` |"
        )
        assert row.count("|") == 7  # no stray pipes from a doc line


def test_regeneration_touches_only_the_table() -> None:
    stale = f"before\n{TABLE_START}\n| old |\n{TABLE_END}\nafter\n"
    assert (
        with_markdown_table(stale)
        == f"before\n{TABLE_START}\n{markdown_table()}{TABLE_END}\nafter\n"
    )


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(ValueError, match="settings-table"):
        with_markdown_table("no markers here")


def test_doc_prose_has_no_stale_lock_range() -> None:
    # The max lock duration range was once documented as [1000..3600000].
    text = DOC.read_text(encoding="utf-8")
    assert "[1000..3600000]` | leader; share agent" not in text
    assert "group.share.min.record.lock.duration.ms" in text
