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
    from queueflow.spark.session import local_session

    session = local_session(
        "queueflow-tests",
        work_dir=tmp_path_factory.mktemp("spark"),
        conf={"spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"},
    )
    try:
        yield session
    finally:
        session.stop()
