"""A ``queueflow`` Spark source whose bootstrap servers can't be reached fails fast, with the
cause in the query's exception (it took 63 s and said only "the queueflow Spark member did not
answer in 30.0 s" before): within ``queueflow.request.timeout.ms`` (10 s) plus Spark's own
overhead, naming the servers, what happened and what to do."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from queueflow.devtools.broker import find_free_ports

#: The query must have failed by then (10 s of broker wait plus Spark's start; was 63 s).
FAIL_WITHIN_S = 40.0


def test_unreachable_bootstrap_fails_fast_with_the_cause(spark: Any, tmp_path: Path) -> None:
    (port,) = find_free_ports(1)  # nothing listens there
    opts = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "app.id": "qf-spark-unreachable",
        "group": "g",
        "topic": "t",
    }
    started = time.monotonic()
    df = spark.readStream.format("queueflow").options(**opts).load()
    query = (
        df.writeStream.foreachBatch(lambda batch, batch_id: None)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    message = ""
    try:
        query.awaitTermination(FAIL_WITHIN_S + 20)
    except Exception as exc:
        message = str(exc)
    finally:
        query.stop()
    took = time.monotonic() - started
    message = message or str(query.exception())
    assert "BrokerError" in message, message
    assert f"could not connect to Kafka at 127.0.0.1:{port} (queueflow Spark source)" in message
    assert "the connection was refused" in message, message
    assert "did not answer in" not in message, message
    assert took < FAIL_WITHIN_S, f"failed after {took:.1f} s"
