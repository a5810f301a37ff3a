"""A rolling upgrade of share-agent workers that adds an assignor (seed 002, "Rolling
Upgrades"): the coordinator keeps ``simple`` while any old member is in the group, switches to
``lag`` once the last is gone, and every record produced meanwhile is ACCEPTed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer

from queueflow.admin import ShareGroupAdmin
from queueflow.kafka.admin import TopicMetadata
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import WorkerProcess, event_time, faust_worker_argv

ROOT = Path(__file__).resolve().parents[2]
GROUP = "upgrade"
WAIT_S = 90.0
#: The coordinator prefers ``lag``; old members advertise nothing or only ``simple``.
LEADER_ENV = {"QUEUEFLOW_GROUP_SHARE_ASSIGNORS": "lag,simple"}
OLD = [{"QUEUEFLOW_MEMBER_ASSIGNORS": ""}, {"QUEUEFLOW_MEMBER_ASSIGNORS": "simple"}]
#: New members also name their rack: the coordinator then reads the partition leaders' racks
#: from the cluster (none on this broker).
NEW = {"QUEUEFLOW_MEMBER_ASSIGNORS": "simple,lag", "QUEUEFLOW_CLIENT_RACK": "rack-a"}


class Producer(threading.Thread):
    """Produces ``{"i": n}`` records, n = 0, 1, ..., about every 10 ms until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.sent = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            while not self._stop_event.is_set():
                await producer.send_and_wait(self.topic, json.dumps({"i": self.sent}).encode())
                self.sent += 1
                await asyncio.sleep(0.01)
        finally:
            await producer.stop()

    def finish(self) -> int:
        """Stop producing; returns how many records were produced (acknowledged)."""
        self._stop_event.set()
        self.join(timeout=30)
        assert self.error is None, repr(self.error)
        return self.sent


def test_rolling_upgrade_adds_an_assignor_and_loses_nothing(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(4)
    app_id = f"qf-upgrade-{uuid.uuid4().hex[:8]}"
    ledger = tmp_path / "ledger.jsonl"
    base_env = {
        "AGENT_APP_ID": app_id,
        "AGENT_TOPIC": topic,
        "AGENT_BROKER": f"kafka://{kafka_bootstrap}",
        "AGENT_LEDGER": str(ledger),
        "QUEUEFLOW_GROUP_SHARE_HEARTBEAT_INTERVAL_MS": "1000",
    }

    def worker(name: str, role: str, env: dict[str, str]) -> WorkerProcess:
        argv = faust_worker_argv("tests.integration.upgrade_app", tmp_path / f"data-{name}")
        extra = {"QUEUEFLOW_ROLE": role, "UPGRADE_WORKER": name}
        return WorkerProcess(argv, tmp_path / f"{name}.log", base_env | env | extra, cwd=ROOT)

    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

    def describe() -> str:
        """The group's assignor, as the admin reads it from the coordinator's changelog."""
        (group,) = asyncio.run(admin.describe_groups([GROUP]))
        return group.assignor

    def until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
            time.sleep(0.3)

    def joined(w: WorkerProcess) -> bool:
        return bool(w.events("assignment")) or bool(w.events("share_agent_started"))

    leader = worker("leader", "leader", LEADER_ENV)
    old = [worker(f"old-{i}", "member", env) for i, env in enumerate(OLD)]
    new = [worker(f"new-{i}", "member", NEW) for i in range(len(OLD))]
    producer = Producer(kafka_bootstrap, topic)
    started = [leader, *old, *new]
    try:
        leader.start().wait_ready(WAIT_S, what="leader worker")
        for w in old:
            w.start()
        for w in old:
            w.wait_ready(WAIT_S, what=w.log_path.stem)
            until(lambda w=w: joined(w), f"{w.log_path.stem} joined")
        producer.start()
        until(lambda: describe() == "simple", "the group formed with simple")
        last_stop_at = 0.0
        for i, (before, after) in enumerate(zip(old, new, strict=True)):
            after.start().wait_ready(WAIT_S, what=after.log_path.stem)
            until(lambda w=after: joined(w), f"{after.log_path.stem} joined")
            last_stop_at = time.time()
            before.stop(timeout_s=60)  # SIGTERM: drain, then leave the group
            if i < len(old) - 1:
                # An old member is still there: the coordinator must keep simple.
                assert describe() == "simple"
        until(lambda: describe() == "lag", "lag once the last old member left")
        for view in ("--state", "--members"):  # the CLI shows it too (docs/operations.md)
            argv = [sys.executable, "-m", "queueflow", "share-groups", "--bootstrap-server"]
            argv += [kafka_bootstrap, "--app", app_id, "--describe", "--group", GROUP, view]
            shown = subprocess.run(
                [*argv, "--verbose"], capture_output=True, text=True, timeout=60, check=True
            ).stdout
            print(f"$ queueflow share-groups ... {view} --verbose\n{shown}")
            assert "ASSIGNOR" in shown and "lag" in shown, shown
            assert view == "--state" or shown.count("rack-a") == 2, shown
        produced = producer.finish()
        assert produced > 0

        def handled() -> set[int]:
            lines = ledger.read_text().splitlines() if ledger.exists() else []
            return {json.loads(line)["i"] for line in lines}

        until(lambda: handled() >= set(range(produced)), "every produced record ACCEPTed")
        by_worker = {json.loads(line)["worker"] for line in ledger.read_text().splitlines()}
        assert {"old-0", "new-1"} <= by_worker  # both generations did work
        selected = leader.events("assignor_selected")
        assert [e["assignor"] for e in selected] == ["simple", "lag"], selected
        # Not before the last old member was stopped (1 s: the log's clock vs this one).
        assert event_time(selected[1]) >= last_stop_at - 1.0
        assert "most preferred" in selected[1]["reason"]
        assert not any(w.events("share_agent_crashed") for w in started)
        assert not leader.events("partition_racks_unavailable")
        print(f"produced and ACCEPTed: {produced}; assignor_selected events:")
        for event in selected:
            print(json.dumps(event))
    finally:
        if producer.is_alive():
            producer.finish()
        for w in reversed(started):
            w.stop(timeout_s=60)


def test_partition_racks_on_a_broker_without_rack(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    """The session broker has no ``broker.rack``: no partition has a leader rack, so the
    ``rack`` assignor can only spread members' racks (docs/operations.md, Assignors)."""
    topic = topic_factory(2)

    async def racks() -> dict[object, str]:
        metadata = TopicMetadata(KafkaClientConfig(kafka_bootstrap))
        try:
            return dict(await metadata.partition_racks([topic, "qf-no-such-topic"]))
        finally:
            await metadata.close()

    assert asyncio.run(racks()) == {}
