"""Runs an example for real: a Kafka broker, its topics, Faust worker processes, and a
read_committed look at what came out (shared by ``examples.workqueue`` and
``examples.enrichment``; ``make demo`` and ``make chaos`` have their own drivers).

A local broker is started unless ``$QUEUEFLOW_BROKER`` names a cluster; every run gets fresh
topic names (``<example>-<run id>-<name>``), so runs never see each other's records.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from queueflow.devtools.broker import LocalBroker, bootstrap_from_env, create_topic, find_free_ports
from queueflow.testing import WorkerProcess, faust_worker_argv

__all__ = ["ROOT", "ExampleRun", "Output"]

ROOT = Path(__file__).resolve().parents[1]

#: One record read back: (key, value, headers), key and value decoded from JSON where they are
#: JSON, header values as text.
Output = tuple[Any, Any, dict[str, str]]


def _decode(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


class ExampleRun:
    """One run of an example (a context manager: workers and the broker it started are always
    stopped).

    Args:
        example: the example's name (run directory ``.queueflow/examples/<example>/<run id>``).
        say: where progress lines go.
    """

    def __init__(self, example: str, say: Callable[[str], None] = print) -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.prefix = f"{example}-{self.run_id}"
        self.run_dir = ROOT / ".queueflow" / "examples" / example / self.run_id
        self.say = say
        self.bootstrap = bootstrap_from_env() or ""
        self.broker: LocalBroker | None = None
        self.workers: list[WorkerProcess] = []
        self.started = time.monotonic()

    def __enter__(self) -> ExampleRun:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self.bootstrap:
            port, cport = find_free_ports(2)
            self.broker = LocalBroker(
                self.run_dir / "broker", port=port, controller_port=cport, die_with_parent=True
            )
            self.broker.start(timeout_s=180, progress=self.say)
            self.bootstrap = self.broker.bootstrap
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            if worker.process is None:
                continue
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        if self.broker is not None:
            self.broker.stop()
            self.broker.wipe()

    def topic(self, name: str, partitions: int) -> str:
        """Create the run's topic ``name`` and return its full name."""
        full = f"{self.prefix}-{name}"
        create_topic(self.bootstrap, full, partitions)
        return full

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of this run's workers: the broker, the topic prefix, ``extra``."""
        return {
            "EXAMPLE_BROKER": f"kafka://{self.bootstrap}",
            "EXAMPLE_PREFIX": self.prefix,
            **extra,
        }

    def worker(self, app: str, role: str = "all", **env: str) -> WorkerProcess:
        """Start ``faust -A <app> worker`` (queueflow role ``role``) with :meth:`env`."""
        slot = len(self.workers)
        argv = faust_worker_argv(app, self.run_dir / f"worker-{slot}", without_web=True)
        worker = WorkerProcess(
            argv,
            self.run_dir / f"worker-{slot}.log",
            self.env(QUEUEFLOW_ROLE=role, **env),
            cwd=ROOT,
        )
        self.workers.append(worker.start())
        return worker

    def produce(self, topic: str, records: Sequence[tuple[Any, Any]]) -> None:
        """Produce ``(key, value)`` pairs (JSON-encoded) and wait for their acknowledgements."""

        async def send() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            await producer.start()
            try:
                futures = [
                    await producer.send(
                        topic,
                        json.dumps(value).encode(),
                        key=None if key is None else json.dumps(key).encode(),
                    )
                    for key, value in records
                ]
                await asyncio.gather(*futures)
            finally:
                await producer.stop()

        asyncio.run(send())

    def read_until(
        self,
        topics: Mapping[str, int],
        done: Callable[[Mapping[str, list[Output]]], bool],
        timeout_s: float,
    ) -> dict[str, list[Output]]:
        """Read ``topics`` (name -> partitions) from the start with
        ``isolation_level="read_committed"`` (what a downstream application sees) until
        ``done(records by topic)`` or ``timeout_s``.

        Raises:
            TimeoutError: not done within ``timeout_s`` (the message says what was read);
            RuntimeError: a worker exited.
        """

        async def read() -> dict[str, list[Output]]:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                isolation_level="read_committed",
                enable_auto_commit=False,
            )
            await consumer.start()
            out: dict[str, list[Output]] = {t: [] for t in topics}
            try:
                tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                deadline = time.monotonic() + timeout_s
                while not done(out):
                    if time.monotonic() > deadline:
                        counts = {t: len(v) for t, v in out.items()}
                        raise TimeoutError(f"not done after {timeout_s} s; read {counts}")
                    dead = [w for w in self.workers if not w.alive()]
                    if dead:
                        raise RuntimeError(f"a worker exited; see its log in {self.run_dir}")
                    batches = await consumer.getmany(timeout_ms=500)
                    for tp, records in batches.items():
                        out[tp.topic].extend(
                            (
                                _decode(r.key),
                                _decode(r.value),
                                {k: v.decode(errors="replace") for k, v in r.headers},
                            )
                            for r in records
                        )
            finally:
                await consumer.stop()
            return out

        return asyncio.run(read())

    @property
    def seconds(self) -> float:
        """Seconds since the run started."""
        return round(time.monotonic() - self.started, 1)
