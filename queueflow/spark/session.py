"""A local SparkSession set up for a small machine, with queueflow's formats registered.

For tests, examples and benchmarks: Spark's Python workers run this interpreter (so they find
pyarrow and queueflow), the UI and progress bar are off, and shuffles use as many partitions as
there are cores.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["local_session"]


def local_session(
    app_name: str,
    *,
    cores: int = 2,
    work_dir: Path | None = None,
    conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
) -> Any:
    """Start (or get) a ``local[cores]`` :class:`pyspark.sql.SparkSession` and register
    queueflow's data sources on it.

    Args:
        app_name: Spark's application name.
        cores: Spark's local cores, also its shuffle partitions and default parallelism.
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

    require_pyspark()
    ensure_java()
    from pyspark.sql import SparkSession

    settings: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.driver.memory": "1g",
    }
    if work_dir is not None:
        settings["spark.sql.warehouse.dir"] = str(work_dir / "warehouse")
        settings["spark.local.dir"] = str(work_dir / "spark-tmp")
    settings.update(conf or {})
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    queueflow.spark.register(session)
    return session
