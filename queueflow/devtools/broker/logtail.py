"""The ends of logs and process output, quoted in error messages."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOG_TAIL_LINES", "as_text", "file_size", "tail_file", "tail_text"]

#: How many lines of a log an error message quotes.
LOG_TAIL_LINES = 40


def tail_text(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.splitlines()[-lines:])


def tail_file(path: Path, lines: int, start: int = 0) -> str:
    """The last ``lines`` lines of ``path`` after byte offset ``start`` (0 if the file shrank).

    Reads at most the last 256 KiB; returns "" if the file cannot be read.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = start if start <= size else 0
            f.seek(max(size - 256 * 1024, start))
            return tail_text(f.read().decode(errors="replace"), lines)
    except OSError:
        return ""


def file_size(path: Path) -> int:
    """The size of ``path`` in bytes, 0 if it does not exist."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def as_text(data: str | bytes | None) -> str:
    """Process output as text (``subprocess`` gives bytes, str or None)."""
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
