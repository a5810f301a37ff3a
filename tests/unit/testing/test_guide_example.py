"""The pytest example of docs/guide.md "Testing your share agents" runs, as it is, and passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def guide_example() -> str:
    """The first Python code block of the guide's "Testing your share agents" section."""
    guide = (ROOT / "docs" / "guide.md").read_text()
    section = guide.split("## Testing your share agents\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, "no python code block in the guide's 'Testing your share agents'"
    return str(blocks[0])


def test_the_guides_harness_example_passes_under_pytest(tmp_path: Path) -> None:
    module = tmp_path / "test_thumbnails.py"
    module.write_text(guide_example())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(module)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "4 passed" in result.stdout
