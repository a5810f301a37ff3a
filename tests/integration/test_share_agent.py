"""``@share_agent`` end to end: a Faust worker (role ``all``) runs a handler that accepts,
rejects, raises and returns junk; an undecodable record is rejected without a handler call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from queueflow import ConfigurationError, ShareConsumer
from queueflow.broker import find_free_ports

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 50


async def produce(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(RECORDS):
            await producer.send_and_wait(topic, json.dumps({"i": i}).encode())
        await producer.send_and_wait(topic, b"\xff not json")
    finally:
        await producer.stop()


def test_share_agent_outcomes(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    asyncio.run(produce(kafka_bootstrap, topic))
    ledger, log = tmp_path / "ledger.jsonl", tmp_path / "worker.log"
    (web_port,) = find_free_ports(1)
    env = dict(os.environ, AGENT_APP_ID=f"qf-agent-{uuid.uuid4().hex[:8]}", AGENT_TOPIC=topic,
               AGENT_BROKER=f"kafka://{kafka_bootstrap}", AGENT_LEDGER=str(ledger))  # fmt: skip
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", "tests.integration.agent_app", "--datadir",
             str(tmp_path / "data"), "worker", "-l", "info", "--web-port", str(web_port)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deliveries: dict[int, list[int]] = defaultdict(list)
    try:
        deadline = time.monotonic() + 90
        expected_deliveries = RECORDS + 2 * (RECORDS // 5)  # i%5 in (0, 1) are delivered twice
        while sum(map(len, deliveries.values())) < expected_deliveries:
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
            deliveries.clear()
            if ledger.exists():
                for line in ledger.read_text().splitlines():
                    entry = json.loads(line)
                    deliveries[entry["i"]].append(entry["delivery_count"])
        metrics = _get(f"http://127.0.0.1:{web_port}/metrics")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    text = log.read_text()
    for i in range(RECORDS):
        assert deliveries[i] == ([1, 2] if i % 5 in (0, 1) else [1]), (i, deliveries[i])
    assert "handler_raised_record_released" in text
    assert "handler_returned_invalid_outcome_record_released" in text
    assert "undecodable_record_rejected" in text
    assert "offset=50" in text  # the undecodable record is named in its log line
    assert "share_agent_drained" in text  # SIGTERM drained and left the group
    labels = {"group": "outcomes", "topic": topic}
    assert _sample(metrics, "queueflow_records_delivered_total", labels) == 71  # 50 + 20 + 1
    assert _sample(metrics, "queueflow_acknowledgements_total", {**labels, "type": "reject"}) == 11
    raised = {**labels, "reason": "raised"}
    assert _sample(metrics, "queueflow_handler_errors_total", raised) == RECORDS // 5


def _sample(text: str, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no sample {name}{labels} in /metrics")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_unknown_topic_fails_at_subscribe(kafka_bootstrap: str) -> None:
    async def scenario() -> None:
        c = ShareConsumer("g", app_id="nobody", bootstrap_servers=kafka_bootstrap)
        await c.subscribe([f"no-such-topic-{uuid.uuid4().hex[:8]}"])

    with pytest.raises(ConfigurationError, match="unknown topic 'no-such-topic-"):
        asyncio.run(scenario())
