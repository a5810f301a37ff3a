"""How fast a ``queueflow leader`` worker drains a flood of junk on a request topic or the
coordinator topic (prints only, never asserts; docs/operations.md "Junk floods, quotas and
ACLs").

Starts a local broker and a leader worker (``queueflow.auth.mode=hmac``), writes N junk records
of 16 bytes to partition 0 of the topic as fast as one aiokafka producer can, and polls the
worker's ``queueflow_control_messages_dropped_total`` every 0.2 s until it reaches N. Prints the
writing time and the time from the first write until all were dropped. With ``--committed``
it watches the worker's committed offset instead (for a queueflow without that metric; Faust
commits every 2.8 s, so the figure is that coarse).

Usage: ``python -m bench.bench_junk_drain [records] [request|coordinator] [--committed]``
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from queueflow.devtools.broker import LocalBroker, create_topic, find_free_ports
from queueflow.protocol import topics
from queueflow.testing import LeaderWorker

_DROPPED = re.compile(r"^queueflow_control_messages_dropped_total\{[^}]*\} (\S+)", re.M)


async def flood(bootstrap: str, topic: str, count: int) -> float:
    """Write ``count`` junk records to ``topic``[0] in full batches; seconds it took."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    await producer.start()
    value = b"\x00" + os.urandom(15)
    start = time.perf_counter()
    try:
        sent, pending = 0, []
        while sent < count:
            batch = producer.create_batch()
            while sent < count and batch.append(key=None, value=value, timestamp=None):
                sent += 1
            batch.close()
            pending.append(await producer.send_batch(batch, topic, partition=0))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.perf_counter() - start


async def committed(bootstrap: str, group: str, tp: KafkaTopicPartition) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offset = (await admin.list_consumer_group_offsets(group)).get(tp)
        return -1 if offset is None else int(offset.offset)
    finally:
        await admin.close()


async def end_offset(bootstrap: str, tp: KafkaTopicPartition) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


def dropped(web_port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return -1
    return sum(float(v) for v in _DROPPED.findall(text))


def main(count: int, which: str, use_committed: bool) -> None:
    base = Path(tempfile.mkdtemp(prefix="qf-junk-bench-"))
    port, controller_port = find_free_ports(2)
    broker = LocalBroker(
        base / "kafka", port=port, controller_port=controller_port, die_with_parent=True
    )
    broker.start()
    try:
        bootstrap = broker.bootstrap
        source = f"src-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, source, 1)
        app_id = f"junk-bench-{uuid.uuid4().hex[:6]}"
        auth = {"queueflow.auth.mode": "hmac", "queueflow.auth.secret": os.urandom(32).hex()}
        worker = LeaderWorker(app_id, [source], bootstrap, base / "worker", auth)
        with worker.start():
            target = (
                topics.request_topic(app_id, source)
                if which == "request"
                else topics.coordinator_topic(app_id)
            )
            tp = KafkaTopicPartition(target, 0)
            before = asyncio.run(end_offset(bootstrap, tp))
            start = time.perf_counter()
            wrote = asyncio.run(flood(bootstrap, target, count))
            done = 0.0
            while done < count and time.perf_counter() - start < 600:
                time.sleep(0.2)
                if use_committed:
                    done = asyncio.run(committed(bootstrap, app_id, tp)) - before
                else:
                    done = dropped(worker.web_port)
            took = time.perf_counter() - start
        lines = len(worker.log_text().splitlines())
        print(f"{which}: wrote {count} junk records in {wrote:.2f} s ({count / wrote:,.0f}/s)")
        print(
            f"{which}: {done:,.0f} drained {took:.1f} s after the first write "
            f"({done / took:,.0f}/s end to end); worker log {lines} lines"
        )
    finally:
        broker.stop()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(
        int(args[0]) if args else 200_000,
        args[1] if len(args) > 1 else "request",
        "--committed" in sys.argv,
    )
