"""The test session's SparkSession, built by queueflow.spark.session.local_session: bound to
127.0.0.1 (its executors run in this JVM; this machine's host name may resolve to loopback, and
Spark would then bind to an outside interface) and with the longer Python worker handshake of
queueflow.spark.startup."""

from __future__ import annotations

import os
from typing import Any


def test_local_session_binds_locally_with_a_longer_python_handshake(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.python.authenticate.socketTimeout") == "120s"
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    # A Python worker (forked by the daemon) starts and answers through the bound driver.
    assert spark.sparkContext.parallelize(range(10), 2).map(lambda x: x * 2).sum() == 90
