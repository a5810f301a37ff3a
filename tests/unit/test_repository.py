"""Rules about the repository itself: what the code and docs cite, formatting, the version."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import queueflow

ROOT = Path(__file__).resolve().parents[2]

#: References to texts that are not in the repository (design notes, seeds, tracker issues).
#: Code and docs cite KIP sections, public URLs or docs/ pages instead.
OUTSIDE_REFERENCES = re.compile(r"notes §|seed 00|issue #", re.IGNORECASE)


def _files(*patterns: str) -> list[Path]:
    return sorted(p for pattern in patterns for p in ROOT.glob(pattern) if p.is_file())


def test_code_and_docs_cite_only_what_is_in_the_repository_or_public() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _files("queueflow/**/*.py", "docs/**/*.md", "README.md")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE_REFERENCES.search(line)
    ]
    assert not found, (
        "these lines cite texts outside the repository; cite a KIP section, a public URL or a "
        "docs/ page instead:\n" + "\n".join(found)
    )


def test_formatting_is_never_switched_off() -> None:
    marker = "fmt: " + "skip"  # written in two parts so that this file does not match
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _files(
            "queueflow/**/*.py", "tests/**/*.py", "examples/**/*.py", "bench/**/*.py"
        )
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if marker in line
    ]
    assert not found, f"'{marker}' in {found}: let `ruff format` lay the code out"


def test_the_version_is_written_once() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"(?m)^version\s*=", project), "pyproject.toml writes the version"
    assert re.search(r'(?m)^dynamic = \["version"\]', project)
    assert importlib.metadata.version("queueflow") == queueflow.__version__


#: The server and member layers stay split by concern: a class past this many lines, or a
#: function past the next, is a sign that a concern has found the wrong home.
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 80


def test_server_and_member_classes_and_functions_stay_small() -> None:
    too_long = []
    for path in _files("queueflow/server/**/*.py", "queueflow/member/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                limit = MAX_CLASS_LINES
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                limit = MAX_FUNCTION_LINES
            else:
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines}")
    assert not too_long, (
        f"over {MAX_CLASS_LINES} lines (a class) or {MAX_FUNCTION_LINES} (a function); split "
        "it by concern (docs/architecture.md, 'Inside the server and member packages'):\n"
        + "\n".join(too_long)
    )
