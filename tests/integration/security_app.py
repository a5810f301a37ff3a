"""A share agent on a secured cluster, run by test_security_acls as a Faust worker.

Env: ``SEC_APP_ID``, ``SEC_BROKER`` (the SASL_SSL address), ``SEC_TOPIC``, ``SEC_LEDGER`` (one
JSON line per delivery), ``SEC_USER``/``SEC_PASSWORD`` (SCRAM-SHA-512), ``SEC_CAFILE`` (the CA
to trust), and ``QUEUEFLOW_ROLE``. Every record is ACCEPTed.
"""

from __future__ import annotations

import json
import os
import ssl

import faust

import queueflow

credentials = (
    faust.SASLCredentials(
        username=os.environ["SEC_USER"],
        password=os.environ["SEC_PASSWORD"],
        mechanism="SCRAM-SHA-512",
        ssl_context=ssl.create_default_context(cafile=os.environ["SEC_CAFILE"]),
    )
    if os.environ.get("SEC_CAFILE")
    else None
)
app = queueflow.App(
    os.environ["SEC_APP_ID"],
    broker=f"kafka://{os.environ['SEC_BROKER']}",
    broker_credentials=credentials,
    share_settings={"share.auto.offset.reset": "earliest"},
)
topic = app.topic(os.environ["SEC_TOPIC"], value_serializer="json")
ledger = open(os.environ["SEC_LEDGER"], "a", buffering=1)  # noqa: SIM115


@app.share_agent(topic, group="secured", concurrency=4)
async def handle(record: queueflow.ShareRecord) -> object:
    ledger.write(json.dumps({"i": record.value["i"], "worker": os.environ["SEC_USER"]}) + "\n")
    return queueflow.ACCEPT
