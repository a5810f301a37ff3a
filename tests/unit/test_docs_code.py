"""The Python code blocks of README.md and docs/*.md: every one compiles, and every one marked
runnable (an ``<!-- runnable -->`` line right above its fence) runs: it is executed as a module
(declaring apps, topics and share agents checks every keyword and setting it uses) and its
``test_*`` functions are called. So the documented signatures can't drift from the code."""

from __future__ import annotations

import ast
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "<!-- runnable -->"
_FENCE = re.compile(r"^```python\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    runnable: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found: list[Block] = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            if _FENCE.match(lines[i]):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                runnable = i > 0 and lines[i - 1].strip() == MARKER
                code = "\n".join(lines[i + 1 : end]) + "\n"
                found.append(Block(path, i + 1, code, runnable))
                i = end
            i += 1
    return found


ALL = blocks()


@pytest.mark.parametrize("block", ALL, ids=[b.where for b in ALL])
def test_every_python_block_compiles(block: Block) -> None:
    # Snippets may await at the top level (they stand for code inside a coroutine).
    compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


RUNNABLE = [b for b in ALL if b.runnable]


def test_the_readme_example_is_runnable() -> None:
    assert any(b.path.name == "README.md" for b in RUNNABLE)


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_every_runnable_block_runs(block: Block) -> None:
    name = "docs_block_" + re.sub(r"\W", "_", block.where)
    module = types.ModuleType(name)
    module.__file__ = str(block.path)
    sys.modules[name] = module  # dataclasses and Faust records look their module up
    try:
        exec(compile(block.code, block.where, "exec"), module.__dict__)
        for attr, value in list(vars(module).items()):
            if attr.startswith("test_") and callable(value):
                value()
    finally:
        del sys.modules[name]


SIGNATURES = {
    "queueflow.App(": ("queueflow.faust_app", "App.__init__"),
    "app.share_agent(": ("queueflow.faust_app", "App.share_agent"),
    "queueflow.attach(": ("queueflow.faust_app", "attach"),
    "queueflow.ShareConsumer(": ("queueflow.member.consumer", "ShareConsumer.__init__"),
}


@pytest.mark.parametrize("prefix", sorted(SIGNATURES))
def test_the_documented_signatures_name_every_parameter(prefix: str) -> None:
    """docs/configuration.md "App and agent options" gives each public signature in full: the
    same parameters, in order, with the same defaults."""
    import importlib
    import inspect

    module, qualname = SIGNATURES[prefix]
    target: object = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    real = [
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in inspect.signature(inspect.unwrap(target)).parameters.values()  # type: ignore[arg-type]
        if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    found = re.search(r"^`" + re.escape(prefix) + r"(.*?)\)`", text, re.MULTILINE)
    assert found, f"docs/configuration.md gives no signature `{prefix}...)`"
    documented = [
        p.strip().replace('"', "'")
        for p in found.group(1).split(",")
        if p.strip() not in ("*", "") and not p.strip().startswith("**")
    ]
    assert documented == [p.replace('"', "'") for p in real], f"{prefix}: the code has {real}"
