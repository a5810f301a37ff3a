"""Kafka's native share groups from Python: confluent-kafka's ``ShareConsumer`` (KIP-932, preview
in confluent-kafka 2.15+), implicit acknowledgement.

    python -m bench.native_consumer   # BENCH_BROKER (host:port), BENCH_TOPIC, BENCH_GROUP

``BENCH_NATIVE_MODE``: ``batch`` (default) iterates the list ``poll`` returns, no Python function
call per record (queueflow's batch handler's counterpart); ``record`` calls a Python function per
record (a per-record handler's counterpart).

The group's ``share.auto.offset.reset`` must be ``earliest`` before this runs (the driver sets it
with Kafka's ConfigCommand). The consumer subscribes, then polls only once the driver's go-file
exists. Records are counted when ``poll`` returns them (``delivered``), and finished when the
broker has answered their acknowledgement: the acknowledgement commit callback reports them
(implicit mode ACCEPTs the previous batch on each ``poll``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from bench.harness import Stats, go

stats = Stats()


def handle(message: Any) -> None:
    """The per-record variant's handler: a Python call per record, doing nothing."""


def main() -> None:
    import confluent_kafka
    from confluent_kafka import ShareConsumer

    stats.extra["client"] = (
        f"confluent-kafka {confluent_kafka.version()[0]} / librdkafka "
        f"{confluent_kafka.libversion()[0]}"
    )
    consumer = ShareConsumer(
        {
            "bootstrap.servers": os.environ["BENCH_BROKER"],
            "group.id": os.environ["BENCH_GROUP"],
            "share.acknowledgement.mode": "implicit",
            "client.id": "bench-native",
        }
    )
    ack_errors = 0

    def on_commit(offsets: Any, error: Any) -> None:
        nonlocal ack_errors
        if error is not None:
            ack_errors += 1
            stats.extra["ack_errors"] = ack_errors
            stats.extra["last_ack_error"] = str(error)[:200]
            return
        n = sum(len(v) for v in offsets.values())
        if n:
            stats.done += n
            stats.last = time.time()

    consumer.set_acknowledgement_commit_callback(on_commit)
    running = True

    def stop(*_: Any) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    consumer.subscribe([os.environ["BENCH_TOPIC"]])
    stats.extra.update(ready=True, assigned=[])
    stats.start()
    while not go() and running:
        time.sleep(0.005)
    per_record = os.environ.get("BENCH_NATIVE_MODE", "batch") == "record"
    try:
        while running:
            messages = consumer.poll(0.1)
            n = 0
            if per_record:
                for m in messages:
                    if m.error() is None:
                        handle(m)
                        n += 1
            else:
                for m in messages:
                    if m.error() is None:
                        n += 1
            if n:
                if stats.first is None:
                    stats.first = time.time()
                stats.delivered += n
    finally:
        consumer.close()
        stats.flush()


if __name__ == "__main__":
    main()
