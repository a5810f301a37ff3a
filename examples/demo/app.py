"""The demo's share agent: parse Python source files with ``ast`` and count definitions.

Workers run this module with ``faust -A examples.demo.app worker``. Files that don't parse are
REJECTed (the standard library ships some deliberately broken ones); every outcome is appended to
this worker's results file, which the demo driver reads as an independent ledger. Parsing is CPU
work, so it runs in a thread (an executor of one thread), as docs/guide.md says: on the event
loop it would hold up the worker's heartbeats, fetches and acknowledgements.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
from concurrent.futures import ThreadPoolExecutor

import queueflow

TOPIC = os.environ["DEMO_TOPIC"]
RESULTS = os.environ["DEMO_RESULTS"]

app = queueflow.App(
    os.environ.get("DEMO_APP_ID", "queueflow-demo"),
    broker=os.environ["DEMO_BROKER"],
    share_settings={
        "share.auto.offset.reset": "earliest",
        "group.share.heartbeat.interval.ms": 1000,
        "group.share.session.timeout.ms": 10000,
    },
)
files = app.topic(TOPIC, key_serializer="raw", value_serializer="raw")
_ledger = open(RESULTS, "a", buffering=1)  # noqa: SIM115 - one line per outcome, kept open
_parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-parser")


def count_definitions(source: bytes) -> int:
    """Function and class definitions in ``source``; raises SyntaxError/ValueError if it
    doesn't parse."""
    tree = ast.parse(source)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return sum(isinstance(node, kinds) for node in ast.walk(tree))


@app.share_agent(files, group="ast-counters", concurrency=2)
async def parse_file(record: queueflow.ShareRecord) -> queueflow.AcknowledgeType:
    path = record.key.decode()
    entry = {"path": path, "delivery_count": record.delivery_count, "pid": os.getpid()}
    try:
        # CPU work off the event loop (docs/guide.md): the loop keeps heartbeating, fetching
        # and acknowledging while files are parsed. One parser thread: CPython 3.11's ast.parse
        # in two threads at once can raise "SystemError: AST constructor recursion depth
        # mismatch", and the GIL runs one parse at a time anyway.
        loop = asyncio.get_running_loop()
        entry["definitions"] = await loop.run_in_executor(_parser, count_definitions, record.value)
        outcome = queueflow.ACCEPT
    except (SyntaxError, ValueError) as exc:
        entry["error"] = type(exc).__name__
        outcome = queueflow.REJECT
    entry["outcome"] = outcome.name
    _ledger.write(json.dumps(entry) + "\n")
    return outcome
