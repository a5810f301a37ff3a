"""One SparkSession (local[2]) per test session, with the venv's interpreter for its Python
workers; the Kafka broker fixtures come from tests/conftest.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_SPARK_DIR = Path(__file__).resolve().parent

# Python workers must run this interpreter (the venv's): the system python3 has no pyarrow and
# the source fails with ModuleNotFoundError inside Spark, where nobody sees it.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _SPARK_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local[2] SparkSession with queueflow's data sources registered."""
    from pyspark.sql import SparkSession

    import queueflow.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("queueflow-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    queueflow.spark.register(session)
    try:
        yield session
    finally:
        session.stop()
