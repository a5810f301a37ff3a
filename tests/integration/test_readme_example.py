"""The README's example, as written, on the session broker: records produced before its first
worker starts are all handled (a new user's first run; the group starts at ``earliest`` as the
example sets it).

The example's code block is taken from README.md; only its broker address is the session
broker's, and ``render`` (the example's "your code") is defined to write what it got."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from queueflow.devtools.broker import create_topic
from queueflow.testing import WorkerProcess, faust_worker_argv

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 200

RENDER = """
import os

async def render(value: bytes) -> None:  # the example's "your code"
    with open(os.environ["README_LEDGER"], "a") as ledger:
        ledger.write(value.decode() + "\\n")
"""


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"## Example\n\n<!-- runnable -->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, "README.md has no runnable example under '## Example'"
    return found.group(1)


def guide_enqueue() -> Callable[..., Awaitable[None]]:
    """docs/guide.md "Enqueueing records": the producer example, as written."""
    text = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    found = re.search(
        r"### Enqueueing records\n.*?<!-- runnable -->\n```python\n(.*?)```", text, re.DOTALL
    )
    assert found, "docs/guide.md has no runnable producer example under 'Enqueueing records'"
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), "docs/guide.md", "exec"), namespace)
    return cast(Callable[..., Awaitable[None]], namespace["enqueue"])


def test_the_readme_example_handles_records_produced_before_it_started(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    code = readme_example()
    assert 'broker="kafka://localhost:9092"' in code and 'app.topic("jobs"' in code
    app_id = f"readme-{uuid.uuid4().hex[:8]}"
    topic = f"jobs-{app_id}"
    code = (
        code.replace("kafka://localhost:9092", f"kafka://{kafka_bootstrap}")
        .replace('"thumbnails"', f'"{app_id}"')
        .replace('app.topic("jobs"', f'app.topic("{topic}"')
    )
    (tmp_path / "readme_app.py").write_text(RENDER + code, encoding="utf-8")
    create_topic(kafka_bootstrap, topic, 2)  # "The topic jobs must exist before workers start"
    jobs = [{"job": i} for i in range(RECORDS)]
    asyncio.run(guide_enqueue()(jobs, topic=topic, bootstrap=kafka_bootstrap))
    values = [json.dumps(job) for job in jobs]
    ledger = tmp_path / "ledger.txt"
    worker = WorkerProcess(
        faust_worker_argv("readme_app", tmp_path / "data"),
        tmp_path / "worker.log",
        {
            "README_LEDGER": str(ledger),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            ),
        },
        cwd=tmp_path,
    )
    worker.start()
    try:
        deadline = time.monotonic() + 90
        while not ledger.exists() or len(ledger.read_text().splitlines()) < RECORDS:
            assert worker.alive(), f"the worker exited:\n{worker.log_tail()}"
            assert time.monotonic() < deadline, (
                f"{len(ledger.read_text().splitlines()) if ledger.exists() else 0} of "
                f"{RECORDS} handled in 90 s:\n{worker.log_tail()}"
            )
            time.sleep(0.2)
    finally:
        worker.stop()
    assert sorted(ledger.read_text().splitlines()) == sorted(values)
    assert not worker.events("share_partition_started_past_records")
