"""``@share_agent`` end to end: a Faust worker (role ``all``) runs a handler that accepts,
rejects, raises and returns junk; an undecodable record is rejected without a handler call."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from queueflow import ConfigurationError, ShareConsumer
from queueflow.devtools.broker import find_free_ports
from queueflow.testing import WorkerProcess, faust_worker_argv
from queueflow.testing import produce as produce_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 50
SLOW_RECORDS = 6


async def produce(bootstrap: str, topic: str, count: int = RECORDS, junk: bool = True) -> None:
    values: list[bytes | str] = [json.dumps({"i": i}) for i in range(count)]
    await produce_records(bootstrap, topic, values + ([b"\xff not json"] if junk else []))


@contextlib.contextmanager
def agent_worker(
    module: str, topic: str, bootstrap: str, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path, int]]:
    """Run ``faust -A <module> worker`` (role ``all``); yields (process, ledger, log, web port)
    and stops it with SIGTERM (a graceful drain; SIGKILL if it has not exited within 60 s)."""
    ledger, log = tmp_path / "ledger.jsonl", tmp_path / "worker.log"
    (web_port,) = find_free_ports(1)
    env = {
        "AGENT_APP_ID": f"qf-agent-{uuid.uuid4().hex[:8]}",
        "AGENT_TOPIC": topic,
        "AGENT_BROKER": f"kafka://{bootstrap}",
        "AGENT_LEDGER": str(ledger),
        # These tests read key=value text from the log (e.g. "offset=50"): console format.
        "QUEUEFLOW_LOG_FORMAT": "console",
    }
    argv = faust_worker_argv(module, tmp_path / "data", web_port=web_port)
    worker = WorkerProcess(argv, log, env, cwd=ROOT)
    worker.start()
    assert worker.process is not None
    try:
        yield worker.process, ledger, log, web_port
    finally:
        worker.stop(timeout_s=60)


def wait_for_ledger(
    worker: subprocess.Popen[bytes], ledger: Path, log: Path, done: Callable[[list[dict]], bool]
) -> list[dict]:
    """Poll the handler's ledger (JSON lines) until ``done(lines)``, within 90 s."""
    deadline = time.monotonic() + 90
    while True:
        lines = [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []
        if done(lines):
            return lines
        assert worker.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)


def test_share_agent_outcomes(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    asyncio.run(produce(kafka_bootstrap, topic))
    expected_deliveries = RECORDS + 2 * (RECORDS // 5)  # i%5 in (0, 1) are delivered twice
    with agent_worker("tests.integration.agent_app", topic, kafka_bootstrap, tmp_path) as (
        worker,
        ledger,
        log,
        web_port,
    ):
        lines = wait_for_ledger(worker, ledger, log, lambda x: len(x) >= expected_deliveries)
        metrics = _get(f"http://127.0.0.1:{web_port}/metrics")
    deliveries: dict[int, list[int]] = defaultdict(list)
    for entry in lines:
        deliveries[entry["i"]].append(entry["delivery_count"])
    text = log.read_text()
    for i in range(RECORDS):
        assert deliveries[i] == ([1, 2] if i % 5 in (0, 1) else [1]), (i, deliveries[i])
    assert "handler_raised_record_released" in text
    assert "handler_returned_invalid_outcome_record_released" in text
    assert "undecodable_record_rejected" in text
    assert "offset=50" in text  # the undecodable record is named in its log line
    assert "share_agent_drained" in text  # SIGTERM drained and left the group
    # ... and the worker's own coordinator answered the leave before Faust stopped consuming.
    assert "leave_failed" not in text
    drained_at = text.index("share_agent_drained")
    assert "members=0" in text[text.rindex("share_group_epoch", 0, drained_at) :], text[-3000:]
    labels = {"group": "outcomes", "topic": topic}
    assert _sample(metrics, "queueflow_records_delivered_total", labels) == 71  # 50 + 20 + 1
    assert _sample(metrics, "queueflow_acknowledgements_total", {**labels, "type": "reject"}) == 11
    raised = {**labels, "reason": "raised"}
    assert _sample(metrics, "queueflow_handler_errors_total", raised) == RECORDS // 5


def test_a_worker_whose_table_recovery_stalls_stops_and_says_why(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """A worker whose Faust table recovery makes no progress for
    ``queueflow.leader.recovery.stall.ms`` would keep its partitions and serve nothing: it
    stops, with a non-zero exit and ``leader_recovery_stalled``, so its partitions move."""
    topic = topic_factory(1)
    with agent_worker(
        "tests.integration.stalled_recovery_app", topic, kafka_bootstrap, tmp_path
    ) as (
        worker,
        _ledger,
        log,
        _web_port,
    ):
        code = worker.wait(timeout=90)
    text = log.read_text()
    assert code != 0, text[-2000:]
    assert text.count("leader_recovery_stalled") == 1  # once, though the guard ticks on
    assert text.count("leader_recovery_restarted") == 1  # started over before it stopped
    assert "restart the worker" in text


def test_records_whose_lock_expired_in_the_queue_are_not_handled(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    """A handler slower than the acquisition lock (1 s): the record queued behind it is
    released unhandled once its lock has expired, and delivered again; no handler starts on a
    record after its lock deadline, and every record ends Acknowledged."""
    topic = topic_factory(1)
    asyncio.run(produce(kafka_bootstrap, topic, count=SLOW_RECORDS, junk=False))
    with agent_worker("tests.integration.slow_agent_app", topic, kafka_bootstrap, tmp_path) as (
        worker,
        ledger,
        log,
        web_port,
    ):
        lines = wait_for_ledger(
            worker, ledger, log, lambda x: {e["i"] for e in x} >= set(range(SLOW_RECORDS))
        )
        # every record Acknowledged: the group's SPSO reaches the end of the topic
        wait_for_ledger(worker, ledger, log, lambda _: _spso(web_port, topic) == SLOW_RECORDS)
        metrics = _get(f"http://127.0.0.1:{web_port}/metrics")
        lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert not [e for e in lines if e["late"]], lines  # never handled after its lock deadline
    first = {e["i"]: e["delivery_count"] for e in reversed(lines)}
    assert first[0] == 1
    assert first[1] >= 2, lines  # queued behind the slow record 0: its first delivery expired
    labels = {"group": "slow", "topic": topic}
    assert _sample(metrics, "queueflow_records_lock_expired_unhandled_total", labels) >= 1
    assert "acquisition_lock_expired_before_handling" in log.read_text()


def _spso(web_port: int, topic: str) -> float:
    try:
        metrics = _get(f"http://127.0.0.1:{web_port}/metrics")
        labels = {"group": "slow", "topic": topic, "partition": "0"}
        return _sample(metrics, "queueflow_share_partition_start_offset", labels)
    except (AssertionError, OSError):
        return -1


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
