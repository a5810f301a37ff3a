"""A rolling upgrade of queueflow itself (docs/operations.md, "Upgrades"): share-agent workers and
ShareConsumer members of the previous release (:data:`previous_release.PREVIOUS_RELEASE`, run
from a second venv) and of this checkout in one app and group under load; the old workers are
replaced one by one (start new, stop old), the old member leaves, and every produced record is
handled (ACCEPTed) exactly once.

Both generations lead and follow: Faust moves the request-topic partitions between old and new
workers as they come and go, so the new code reads the old one's changelog and serves its
members' direct-path ShareFetches, and the other way round.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from previous_release import PREVIOUS_RELEASE, is_release, previous_release_python, release_env

from queueflow.testing import WorkerProcess, faust_worker_argv

ROOT = Path(__file__).resolve().parents[2]
MEMBER_SCRIPT = Path(__file__).with_name("upgrade_member.py")
PARTITIONS = 4
#: Seconds for a worker to be ready, and for every record to be handled at the end.
WAIT_S = 60.0
#: Every handler ACCEPTs (no RELEASE, REJECT or poison record: ids start at 1).
CHAOS_ENV = {
    "CHAOS_RELEASE": "0",
    "CHAOS_REJECT": "0",
    "CHAOS_POISON_MOD": str(10**12),
    "CHAOS_WORK_MS": "1",
    "CHAOS_CONCURRENCY": "4",
    "CHAOS_SHARE_SETTINGS": json.dumps(
        {"share.auto.offset.reset": "earliest", "group.share.heartbeat.interval.ms": 1000}
    ),
}


#: Faust settings of the previous release's workers. ca0da06 closes its ListOffsets consumer
#: while a leader request may be using it, and that request then waits out aiokafka's request
#: timeout (40 s) when the worker stops (fixed since: LogOffsets._ask in
#: queueflow/server/log_offsets.py); meanwhile its coordinator answers no heartbeat. Faust's
#: ``stream_wait_empty=False`` stops without waiting for the stream event in flight (the next
#: leader reads that request again).
OLD_RELEASE_ENV = {"STREAM_WAIT_EMPTY": "false"}
#: Seconds a previous-release worker's share agents may take to drain and leave after SIGTERM
#: (``share_agent_drained``; under a second when idle).
OLD_DRAIN_S = 10.0
#: Seconds it may then take to exit before it is killed: the same bug can hold it inside its own
#: shutdown after its agents drained and left, until aiokafka's 40 s request timeout; it exits
#: within 1-2 s otherwise. A kill then loses nothing: its members left, and its leaders' state is
#: in their changelogs (the next leaders read it, as after any crash).
OLD_EXIT_S = 3.0


def stop_old_worker(worker: WorkerProcess) -> None:
    """SIGTERM a previous-release worker; SIGKILL it :data:`OLD_EXIT_S` s after its share agents
    drained (or :data:`OLD_DRAIN_S` + :data:`OLD_EXIT_S` s after the SIGTERM at the latest)."""
    worker.terminate()
    deadline = time.monotonic() + OLD_DRAIN_S
    while worker.alive() and not worker.events("share_agent_drained"):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    worker.stop(timeout_s=OLD_EXIT_S)  # a second SIGTERM is ignored: Faust is already stopping


class Producer(threading.Thread):
    """Produces records ``b"<n>"``, n = 1, 2, ..., over the partitions, about every 5 ms until
    stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.sent = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by finish()
            self.error = exc

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            while not self._stop_event.is_set():
                n = self.sent + 1
                await producer.send_and_wait(self.topic, str(n).encode(), partition=n % PARTITIONS)
                self.sent = n
                await asyncio.sleep(0.005)
        finally:
            await producer.stop()

    def finish(self) -> int:
        """Stop producing; returns how many records were produced (ids 1..n)."""
        self._stop_event.set()
        self.join(timeout=30)
        assert self.error is None, repr(self.error)
        return self.sent


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """``(python, src)`` of the previous release's venv (built once per module, offline)."""
    directory = tmp_path_factory.mktemp("previous-release")
    try:
        python = previous_release_python(ROOT, directory)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    src = directory / "src"
    assert is_release(python, src), "the second venv does not import the previous release"
    yield python, src


def test_rolling_upgrade_from_the_previous_release_handles_every_record_once(
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    tmp_path: Path,
    previous_release: tuple[Path, Path],
) -> None:
    old_python, old_src = previous_release
    topic = topic_factory(PARTITIONS)
    app_id = f"qf-roll-{uuid.uuid4().hex[:8]}"
    base_env = {
        **CHAOS_ENV,
        "CHAOS_APP_ID": app_id,
        "CHAOS_TOPIC": topic,
        "CHAOS_BROKER": f"kafka://{kafka_bootstrap}",
        "UPGRADE_APP_ID": app_id,
        "UPGRADE_BOOTSTRAP": kafka_bootstrap,
        "UPGRADE_TOPIC": topic,
    }
    ledgers: dict[str, Path] = {}

    def process(name: str, old: bool, argv: list[str]) -> WorkerProcess:
        ledgers[name] = tmp_path / f"{name}.jsonl"
        env = base_env | {"CHAOS_LEDGER": str(ledgers[name]), "UPGRADE_LEDGER": str(ledgers[name])}
        if old:  # the release's Python, in its source tree, without this checkout's path
            argv = [str(old_python), *argv[1:]]
            env |= release_env(old_src) | OLD_RELEASE_ENV
        return WorkerProcess(argv, tmp_path / f"{name}.log", env, cwd=old_src if old else ROOT)

    def worker(name: str, old: bool) -> WorkerProcess:
        argv = faust_worker_argv("examples.chaos.app", tmp_path / f"data-{name}")
        return process(name, old, argv)

    def member(name: str, old: bool) -> WorkerProcess:
        return process(name, old, [sys.executable, str(MEMBER_SCRIPT)])

    old_workers = [worker("old-worker-0", True), worker("old-worker-1", True)]
    new_workers = [worker("new-worker-0", False), worker("new-worker-1", False)]
    old_member, new_member = member("old-member", True), member("new-member", False)
    producer = Producer(kafka_bootstrap, topic)
    started: list[WorkerProcess] = []

    def start(*processes: WorkerProcess) -> None:
        for p in processes:
            started.append(p.start())

    unconfirmed: set[int] = set()

    def handled() -> Counter[int]:
        """How many times each record id was ACCEPTed, over every process's ledger (and in
        ``unconfirmed`` those a member's acknowledgement got no confirmation for: it may have
        been applied, or the record comes back)."""
        counts: Counter[int] = Counter()
        for path in ledgers.values():
            for line in path.read_text().splitlines() if path.exists() else []:
                entry = json.loads(line)
                if entry.get("o") == "ACCEPT":
                    counts[entry["id"]] += 1
                elif entry.get("o") == "ACK_FAILED":
                    unconfirmed.add(entry["id"])
        return counts

    def tails() -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log_tail(15)}" for p in started)

    began = time.monotonic()
    try:
        start(*old_workers, old_member, new_member)
        for w in old_workers:
            w.wait_ready(WAIT_S, what=w.log_path.stem)
        producer.start()
        for before, after in zip(old_workers, new_workers, strict=True):
            start(after)
            after.wait_ready(WAIT_S, what=after.log_path.stem)
            stop_old_worker(before)  # SIGTERM: drain, then leave
        old_member.stop(timeout_s=WAIT_S)
        produced = producer.finish()
        everything = set(range(1, produced + 1))
        deadline = time.monotonic() + WAIT_S
        while not everything <= set(handled()) | unconfirmed:
            missing = everything - set(handled()) - unconfirmed
            assert time.monotonic() < deadline, f"lost: {sorted(missing)[:20]}...\n{tails()}"
            for p in (*new_workers, new_member):
                assert p.alive(), p.log_tail()
            time.sleep(0.2)
        counts = handled()
        twice = {i: n for i, n in counts.items() if n > 1}
        by_process = {
            name: sum(1 for line in path.read_text().splitlines() if '"o":' in line)
            for name, path in ledgers.items()
            if path.exists()
        }
        print(
            json.dumps(
                {
                    "previous_release": PREVIOUS_RELEASE,
                    "produced": produced,
                    "lost": len(everything - set(counts) - unconfirmed),
                    "duplicates": len(twice),
                    "unconfirmed_acks": len(unconfirmed),
                    "handled_by": by_process,
                    "seconds": round(time.monotonic() - began, 1),
                }
            )
        )
        assert not twice, f"ACCEPTed more than once: {dict(list(twice.items())[:20])}"
        assert set(counts) == everything, f"unexpected ids: {sorted(set(counts) - everything)}"
        assert by_process.get("old-worker-0") and by_process.get("new-worker-1"), by_process
        for p in started:
            assert not p.events("share_agent_crashed"), p.log_tail()
    finally:
        if producer.is_alive():
            producer.finish()
        for p in reversed(started):
            p.stop(timeout_s=WAIT_S)


def test_a_clone_without_the_previous_release_fails_saying_how_to_fetch_it(
    tmp_path: Path,
) -> None:
    """A shallow clone (CI checkouts often are) lacks the previous release's commit."""
    repo = tmp_path / "shallow"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=60)
    with pytest.raises(RuntimeError, match=r"git fetch --unshallow") as info:
        previous_release_python(repo, tmp_path / "venv")
    assert PREVIOUS_RELEASE in str(info.value)
    assert "tests/integration/previous_release.py" in str(info.value)
