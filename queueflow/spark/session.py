"""A SparkSession on this machine set up for a small (and possibly busy) machine, with
queueflow's formats registered.

For tests, examples and benchmarks: Spark's Python workers run this interpreter (so they find
pyarrow and queueflow), the UI and progress bar are off, shuffles use as many partitions as
there are cores, the driver binds to 127.0.0.1 when its executors run on this machine, and the
Python workers' handshake tolerates a loaded machine (:mod:`queueflow.spark.startup`). The
master is ``local[cores]`` (executors in the driver's JVM) or a standalone master's
``spark://`` URL (executors in their own JVMs; ``queueflow.devtools.spark_standalone`` starts
one).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["local_session"]


def local_session(
    app_name: str,
    *,
    cores: int = 2,
    master: str | None = None,
    work_dir: Path | None = None,
    conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
) -> Any:
    """Start (or get) a ``local[cores]`` :class:`pyspark.sql.SparkSession` and register
    queueflow's data sources on it.

    Args:
        app_name: Spark's application name.
        cores: Spark's local cores (or the cores the app takes on a cluster), also its
            shuffle partitions and default parallelism.
        master: Spark's master URL; default ``local[cores]``. A ``spark://host:port`` of a
            standalone cluster on this machine runs one executor per core, each with
            ``spark.executor.memory`` 512m unless ``conf`` says otherwise.
        work_dir: where the warehouse and Spark's local files go (default: Spark's).
        conf: further Spark settings (they win over the defaults here), e.g.
            ``{"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}``.
        log_level: the SparkContext's log level.

    Raises:
        ConfigurationError: pyspark is missing or older than 4.2, or no Java 17+ is found.
    """
    # Python workers must run this interpreter: the system python3 has no pyarrow, and the
    # source would fail with ModuleNotFoundError inside Spark, where nobody sees it.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import queueflow.spark
    from queueflow.spark.runtime import ensure_java, require_pyspark
    from queueflow.spark.startup import (
        PYTHON_WORKER_CONF,
        bind_choice,
        host_name_is_loopback,
        log,
    )

    require_pyspark()
    ensure_java()
    from pyspark.sql import SparkSession

    master = master or f"local[{cores}]"
    settings: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.driver.memory": "1g",
        **PYTHON_WORKER_CONF,
    }
    if not master.startswith("local"):
        settings |= {
            "spark.cores.max": str(cores),
            "spark.executor.cores": "1",
            "spark.executor.memory": "512m",
        }
    if work_dir is not None:
        settings["spark.sql.warehouse.dir"] = str(work_dir / "warehouse")
        if master.startswith("local"):  # a cluster's workers choose their executors' own
            settings["spark.local.dir"] = str(work_dir / "spark-tmp")
    settings.update(conf or {})
    host_name = socket.gethostname()
    bind = bind_choice(
        master,
        env=os.environ,
        conf=settings,
        host_name=host_name,
        loopback_host=host_name_is_loopback(host_name),
    )
    settings.update(bind.conf)
    os.environ.update(bind.env)  # read by the JVM spark-submit launches below
    log.info("spark_session_binding", master=master, conf=dict(bind.conf), reason=bind.reason)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    queueflow.spark.register(session)
    return session
