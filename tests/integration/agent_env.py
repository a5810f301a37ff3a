"""What the share-agent apps of test_share_agent share: the app, topic and ledger from env vars
(``AGENT_APP_ID``, ``AGENT_BROKER``, ``AGENT_TOPIC``, ``AGENT_LEDGER``)."""

from __future__ import annotations

import os
from typing import Any, TextIO

import queueflow

#: What the gate of ``gated_agent_app`` logs when it holds the worker's start-up.
GATE_LINE = "gate: holding the worker's start-up"


def app_from_env() -> tuple[queueflow.App, Any, TextIO]:
    """(app, JSON topic, line-buffered ledger file) for a worker started by the test."""
    app = queueflow.App(
        os.environ["AGENT_APP_ID"],
        broker=os.environ["AGENT_BROKER"],
        share_settings={"share.auto.offset.reset": "earliest"},
    )
    topic = app.topic(os.environ["AGENT_TOPIC"], value_serializer="json")
    ledger = open(os.environ["AGENT_LEDGER"], "a", buffering=1)  # noqa: SIM115
    return app, topic, ledger
