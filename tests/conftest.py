"""The one fixture both test tiers share: a local SparkSession, started once
per session (unit tests pin Spark SQL expressions with it; integration tests
run the job on it)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from streaming.spark_home import compiled_spark_home

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession: 2 shuffle partitions, no UI, temp warehouse."""
    from pyspark.sql import SparkSession

    # Spark starts its Python workers from the JVM's environment: they must use
    # this interpreter (the venv's packages) and import this checkout's code.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        # ... importing the installed, compiled pyspark, not the wheel's zip (streaming/spark_home.py).
        env.setenv("SPARK_HOME", os.environ.get("SPARK_HOME") or compiled_spark_home())
        env.setenv(
            "PYTHONPATH",
            os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        )
        session = (
            SparkSession.builder.master("local[2]")
            .appName("fencewatch-integration-tests")
            .config("spark.ui.enabled", "false")
            # Its refresh thread took 2 s of CPU in 20 s of this session idle (10% of a core).
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()
