"""Two share agents that must survive what their records and handlers do, run by
test_member_robustness as a Faust worker (role ``all``).

* ``decoded`` (JSON topic ``$AGENT_TOPIC``): among good records ``{"i": n}`` one has a header
  name that is not UTF-8 and one a value that is not JSON; it ACCEPTs every record it gets.
* ``misbehaving`` (raw topic ``$AGENT_TOPIC2``, records ``b"<n>"``, 4 handler tasks): on the
  first delivery, n % 50 == 0 raises ``CancelledError``, n % 50 == 1 returns an object whose
  ``repr()`` raises, n % 50 == 2 raises ``GeneratorExit``; it ACCEPTs everything else.

Every ACCEPTed record is a JSON line ``{"agent": ..., "i": n, "delivery_count": c}`` in
``$AGENT_LEDGER``.
"""

from __future__ import annotations

import asyncio
import json
import os

import queueflow
from tests.integration.agent_env import app_from_env

app, topic, ledger = app_from_env()
raw_topic = app.topic(os.environ["AGENT_TOPIC2"], value_serializer="raw")


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr() of this outcome raises")


def accepted(agent: str, i: int, delivery_count: int) -> None:
    ledger.write(json.dumps({"agent": agent, "i": i, "delivery_count": delivery_count}) + "\n")


@app.share_agent(topic, group="decoded", concurrency=2)
async def decoded(record: queueflow.ShareRecord) -> object:
    accepted("decoded", record.value["i"], record.delivery_count)
    return queueflow.ACCEPT


@app.share_agent(raw_topic, group="misbehaving", concurrency=4)
async def misbehaving(record: queueflow.ShareRecord) -> object:
    i = int(record.value)
    if record.delivery_count == 1:
        if i % 50 == 0:
            raise asyncio.CancelledError()
        if i % 50 == 1:
            return BadRepr()
        if i % 50 == 2:
            raise GeneratorExit()
    accepted("misbehaving", i, record.delivery_count)
    return queueflow.ACCEPT
