"""The chaos run's share agent, run by every worker process with ``faust -A examples.chaos.app``.

Records are ``b"<id>"``. For every delivery the handler appends one JSON line to this process's
ledger (``$CHAOS_LEDGER``, line-buffered: each line is one ``write``), *before* its outcome
reaches queueflow, so the ledger is an independent record of what the handlers saw:

``{"id": 17, "dc": 1, "o": "ACCEPT", "pid": 4242, "p": 2, "off": 5, "t": 1700000000.123}``

Outcomes, drawn per ``(seed, id, delivery count)`` so a run is reproducible:

* poison records (``id % $CHAOS_POISON_MOD == 0``): the handler always raises (``"o": "RAISE"``,
  queueflow RELEASEs; the leader Archives them at ``group.share.delivery.count.limit``);
* otherwise REJECT with probability ``$CHAOS_REJECT`` (default 0.01), RELEASE with probability
  ``$CHAOS_RELEASE`` (default 0.05), else ACCEPT.

With ``$CHAOS_RESULTS_TOPIC`` set (``--exactly-once``), the agent runs with
``processing_guarantee="exactly_once"`` and an ACCEPTed record publishes one result, its id, to
that topic (:mod:`examples.chaos.results` counts them downstream).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import queueflow

SEED = int(os.environ.get("CHAOS_SEED", "0"))
RELEASE_P = float(os.environ.get("CHAOS_RELEASE", "0.05"))
REJECT_P = float(os.environ.get("CHAOS_REJECT", "0.01"))
POISON_MOD = int(os.environ.get("CHAOS_POISON_MOD", "997"))
WORK_MS = float(os.environ.get("CHAOS_WORK_MS", "1"))
CONCURRENCY = int(os.environ.get("CHAOS_CONCURRENCY", "8"))
#: Write a ledger line only for ids divisible by this (``make soak`` samples its records).
LEDGER_EVERY = int(os.environ.get("CHAOS_LEDGER_EVERY", "1"))
#: Share-group settings by KIP-932 name (JSON); the driver passes the same ones to every worker.
SHARE_SETTINGS = json.loads(os.environ.get("CHAOS_SHARE_SETTINGS", "{}"))
#: The results topic of ``--exactly-once`` runs ("" : no results, at-least-once).
RESULTS_TOPIC = os.environ.get("CHAOS_RESULTS_TOPIC", "")
#: The group's dead-letter topic (KIP-1191 group configs; empty: none).
DLQ_TOPIC = os.environ.get("CHAOS_DLQ_TOPIC", "")
if RESULTS_TOPIC:
    SHARE_SETTINGS.setdefault("queueflow.processing.guarantee", "exactly_once")
#: Faust consumer-group timeouts (s) of the leaders' group: a SIGKILLed leader must be noticed
#: in seconds, not after Faust's 60 s default.
FAUST_SESSION_TIMEOUT_S = float(os.environ.get("CHAOS_FAUST_SESSION_TIMEOUT_S", "10"))
FAUST_HEARTBEAT_S = float(os.environ.get("CHAOS_FAUST_HEARTBEAT_S", "1"))
#: Replication factor of every topic the workers create (3 on ``make chaos-cluster``).
REPLICATION_FACTOR = int(os.environ.get("CHAOS_REPLICATION_FACTOR", "1"))


class PoisonRecord(RuntimeError):
    """Raised for every delivery of a poison record."""


def is_poison(record_id: int) -> bool:
    return record_id % POISON_MOD == 0


def decide(record_id: int, delivery_count: int, seed: int = SEED) -> str:
    """The handler's outcome for one delivery: ACCEPT, RELEASE, REJECT or RAISE."""
    if is_poison(record_id):
        return "RAISE"
    draw = random.Random(f"{seed}/{record_id}/{delivery_count}").random()
    if draw < REJECT_P:
        return "REJECT"
    if draw < REJECT_P + RELEASE_P:
        return "RELEASE"
    return "ACCEPT"


app = queueflow.App(
    os.environ.get("CHAOS_APP_ID", "queueflow-chaos"),
    broker=os.environ.get("CHAOS_BROKER", "kafka://127.0.0.1:9092"),
    share_settings=SHARE_SETTINGS,
    broker_session_timeout=FAUST_SESSION_TIMEOUT_S,
    broker_heartbeat_interval=FAUST_HEARTBEAT_S,
    # queueflow's internal topics (requests, changelogs, coordinator, replies) and Faust's:
    # replicated like the run's topics on a cluster (make chaos-cluster).
    topic_replication_factor=REPLICATION_FACTOR,
    group_configs={
        "chaos": {
            "errors.deadletterqueue.topic.name": DLQ_TOPIC,
            "errors.deadletterqueue.copy.record.enable": "true",
        }
    }
    if DLQ_TOPIC
    else None,
)
records = app.topic(
    os.environ.get("CHAOS_TOPIC", "chaos"), key_serializer="raw", value_serializer="raw"
)
_ledger = open(os.environ.get("CHAOS_LEDGER", os.devnull), "a", buffering=1)  # noqa: SIM115
_ledger.write(
    json.dumps(
        {
            "event": "start",
            "pid": os.getpid(),
            "t": time.time(),
            "role": os.environ.get("QUEUEFLOW_ROLE", "all"),
        }
    )
    + "\n"
)

_OUTCOMES = {"ACCEPT": queueflow.ACCEPT, "RELEASE": queueflow.RELEASE, "REJECT": queueflow.REJECT}
results = (
    app.topic(RESULTS_TOPIC, key_serializer="raw", value_serializer="raw")
    if RESULTS_TOPIC
    else None
)


@app.share_agent(
    records,
    group="chaos",
    concurrency=CONCURRENCY,
    sink=[results] if results is not None else None,
    processing_guarantee="exactly_once" if results is not None else None,
)
async def handle(record: queueflow.ShareRecord) -> queueflow.AcknowledgeType | queueflow.Result:
    outcome = await _handle(record)
    if results is not None and outcome is queueflow.ACCEPT:
        return queueflow.Result(outcome, [record.value])  # the id, to the results topic
    return outcome


async def _handle(record: queueflow.ShareRecord) -> queueflow.AcknowledgeType:
    if WORK_MS:
        await asyncio.sleep(random.uniform(0, 2 * WORK_MS) / 1000)
    record_id = int(record.value)
    outcome = decide(record_id, record.delivery_count)
    if record_id % LEDGER_EVERY:
        return _OUTCOMES[outcome] if outcome != "RAISE" else _raise(record_id)
    _ledger.write(
        json.dumps(
            {
                "id": record_id,
                "dc": record.delivery_count,
                "o": outcome,
                "pid": os.getpid(),
                "p": record.partition,
                "off": record.offset,
                "t": round(time.time(), 4),
            },
            separators=(",", ":"),
        )
        + "\n"
    )
    if outcome == "RAISE":
        _raise(record_id)
    return _OUTCOMES[outcome]


def _raise(record_id: int) -> queueflow.AcknowledgeType:
    raise PoisonRecord(f"poison record {record_id}")
