"""The pipeline's Faust app: share agents that join each flight with the weather and classify its
delay. Workers run it with ``faust -A examples.pipeline.app worker`` (role from
``$QUEUEFLOW_ROLE``).

For every delivery of a flight (JSON value, key = the flight's id) the agent:

* REJECTs it when the flight was cancelled (no departure or arrival time): no result;
* otherwise looks up the weather at its origin and scheduled hour, produces a result record to
  ``flight-results`` (same key) and waits for the broker's acknowledgement, *then* ACCEPTs, so no
  flight is acknowledged before its result is written (a failed produce raises: RELEASE, and the
  flight is delivered again).

Every outcome is appended to this process's ledger (``$PIPELINE_LEDGER``, one JSON line per
delivery), which the driver reads as an independent record of what the handlers did.

The app's leader workers also lead ``flight-results``, whose share groups Spark reads.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from aiokafka import AIOKafkaProducer

import queueflow
from examples.pipeline.config import (
    AGENT_GROUP,
    ENV_APP_ID,
    ENV_BROKER,
    ENV_FLIGHTS_TOPIC,
    ENV_LEDGER,
    ENV_RESULTS_TOPIC,
    FLIGHTS_TOPIC,
    RESULTS_TOPIC,
    classify,
    flight_key,
    is_cancelled,
    load_weather,
)

BROKER = os.environ.get(ENV_BROKER, "kafka://127.0.0.1:9092")
FLIGHTS = os.environ.get(ENV_FLIGHTS_TOPIC, FLIGHTS_TOPIC)
RESULTS = os.environ.get(ENV_RESULTS_TOPIC, RESULTS_TOPIC)
#: Handler tasks per worker: each mostly waits for its result's produce acknowledgement.
CONCURRENCY = int(os.environ.get("PIPELINE_CONCURRENCY", "32"))

app = queueflow.App(
    os.environ.get(ENV_APP_ID, "queueflow-pipeline"),
    broker=BROKER,
    share_settings={
        "share.auto.offset.reset": "earliest",
        "group.share.heartbeat.interval.ms": 1000,
        "group.share.session.timeout.ms": 10000,
        # In flight per share-partition (the most allowed): a Spark micro-batch acquires
        # maxRecordsPerTrigger = 20,000 records over the 2 partitions and holds them until
        # Spark commits it; the default 2,000 would cap every batch at 4,000.
        "group.share.partition.max.record.locks": 10000,
    },
)
flights = app.topic(FLIGHTS, key_serializer="raw", value_serializer="raw")
# Spark's share groups on the results need share-partition leaders too: this app's.
app.share_groups.lead(RESULTS)

#: Loaded once per worker (26,115 hours): the join is a dict lookup.
WEATHER = load_weather()
_ledger = open(os.environ.get(ENV_LEDGER, os.devnull), "a", buffering=1)  # noqa: SIM115
_producer: AIOKafkaProducer | None = None
_producer_lock = asyncio.Lock()


async def results_producer() -> AIOKafkaProducer:
    """This worker's producer of results (started on first use, in the worker's loop)."""
    global _producer
    async with _producer_lock:
        if _producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=BROKER.removeprefix("kafka://"),
                acks="all",
                enable_idempotence=True,  # a retried send is not written twice
                linger_ms=5,
            )
            await producer.start()
            _producer = producer
    return _producer


@app.task
async def _warm_up() -> None:
    """Start the producer with the worker, not on the first record (members too)."""
    await results_producer()


@app.on_before_shutdown.connect
async def _stop_producer(app: Any, **kwargs: Any) -> None:
    """Flush and close the producer when the worker shuts down (a handler still running then
    fails its produce and RELEASEs its flight)."""
    if _producer is not None:
        await _producer.stop()


def result_of(key: str, flight: dict[str, Any]) -> dict[str, Any]:
    """The result record of a flight that flew: its delay class and the weather at departure."""
    hour = (flight["origin"], flight["year"], flight["month"], flight["day"], flight["hour"])
    weather = WEATHER.get(hour)
    return {
        "key": key,
        "carrier": flight["carrier"],
        "month": flight["month"],
        "origin": flight["origin"],
        "dest": flight["dest"],
        "arr_delay": flight.get("arr_delay"),
        "status": classify(flight.get("arr_delay")),
        "weather": weather,  # null when the hour has no observation
    }


@app.share_agent(flights, group=AGENT_GROUP, concurrency=CONCURRENCY)
async def classify_flight(record: queueflow.ShareRecord) -> queueflow.AcknowledgeType:
    flight = json.loads(record.value)
    key = flight_key(flight["carrier"], flight["flight"], flight["time_hour"])
    if is_cancelled(flight):
        outcome = queueflow.REJECT
    else:
        value = json.dumps(result_of(key, flight), separators=(",", ":")).encode()
        producer = await results_producer()
        await (await producer.send(RESULTS, value, key=key.encode()))
        outcome = queueflow.ACCEPT
    entry = {"k": key, "dc": record.delivery_count, "o": outcome.name, "pid": os.getpid()}
    _ledger.write(json.dumps(entry, separators=(",", ":")) + "\n")
    return outcome
