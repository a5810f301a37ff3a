"""Share agents that produce results, run by test_composition as a Faust worker (role ``all``).

``COMP_MODE=chain`` (topics ``COMP_JOBS``, ``COMP_MID``, ``COMP_OUT``, ``COMP_DLQ``; records
are JSON ``{"i": n}`` keyed ``k<n % 4>``):

* ``first`` (share agent on jobs, ``sink=COMP_MID``, ``dead_letter=COMP_DLQ``) yields
  ``{"i": n, "stage": 1}``; i % 7 == 3: RELEASEs the first delivery (after yielding: nothing
  published), then ACCEPTs; i % 10 == 9: REJECTs (a copy goes to the dead-letter topic);
* ``second`` (share agent on mid) returns ``Result(ACCEPT, [Send(out, {"i": n}), ...])`` to a
  Faust topic (JSON values, raw keys);
* ``count`` (a Faust agent on out) counts per key in a table and writes each new count to the
  ledger.

``COMP_MODE=bad``: ``missing`` (share agent on jobs with ``sink=`` a topic that doesn't exist)
and ``unencodable`` (share agent on mid yielding a value JSON can't encode to out).

Every share-agent delivery writes one ledger line ``{"agent", "i", "delivery_count"}``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import queueflow
from queueflow import REJECT, RELEASE, Result, Send

app = queueflow.App(
    os.environ["COMP_APP_ID"],
    broker=os.environ["COMP_BROKER"],
    share_settings={"share.auto.offset.reset": "earliest", "queueflow.request.timeout.ms": 3000},
)
ledger = open(os.environ["COMP_LEDGER"], "a", buffering=1)  # noqa: SIM115
jobs = app.topic(os.environ["COMP_JOBS"], value_serializer="json")
mid = app.topic(os.environ["COMP_MID"], value_serializer="json")
out = app.topic(os.environ["COMP_OUT"], key_type=str, value_serializer="json")


def note(agent: str, record: queueflow.ShareRecord, **more: Any) -> None:
    entry = {"agent": agent, "i": record.value["i"], "delivery_count": record.delivery_count}
    ledger.write(json.dumps({**entry, **more}) + "\n")


if os.environ["COMP_MODE"] == "chain":
    counts = app.Table("counts", default=int, partitions=1)

    @app.share_agent(jobs, group="first", sink=[mid], dead_letter=os.environ["COMP_DLQ"])
    async def first(record: queueflow.ShareRecord) -> Any:
        i = record.value["i"]
        note("first", record)
        yield {"i": i, "stage": 1}
        if i % 7 == 3 and record.delivery_count == 1:
            yield RELEASE
        elif i % 10 == 9:
            yield REJECT

    @app.share_agent(mid, group="second")
    async def second(record: queueflow.ShareRecord) -> Result:
        note("second", record)
        return Result(queueflow.ACCEPT, [Send(out, {"i": record.value["i"]})])

    @app.agent(out)
    async def count(stream: Any) -> None:
        async for key, value in stream.items():
            counts[key] += 1
            entry = {"agent": "count", "key": key, "i": value["i"], "count": counts[key]}
            ledger.write(json.dumps(entry) + "\n")

else:

    @app.share_agent(jobs, group="missing", sink=os.environ["COMP_MISSING"])
    async def missing(record: queueflow.ShareRecord) -> Any:
        note("missing", record)
        yield record.value

    @app.share_agent(mid, group="unencodable")
    async def unencodable(record: queueflow.ShareRecord) -> Any:
        note("unencodable", record)
        yield Send(out, {"not json": object()})
