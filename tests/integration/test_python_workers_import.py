"""Spark's Python processes import the installed, compiled pyspark, not the
wheel's zip (streaming/spark_home.py), in a real session."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from streaming.spark_home import compiled_spark_home

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def test_a_python_worker_of_the_session_imports_the_installed_pyspark(spark: SparkSession) -> None:
    from pyspark.sql.functions import udf

    def origin() -> str:
        import pyspark

        return f"{pyspark.__file__}\n{os.environ.get('PYTHONPATH', '')}"

    where, path = spark.range(1).select(udf(origin)()).collect()[0][0].split("\n")
    assert where.endswith(os.path.join("site-packages", "pyspark", "__init__.py")), where
    # Spark still names its zips first; they are not there to import from.
    first = path.split(os.pathsep)[0]
    assert first.startswith(compiled_spark_home()) and first.endswith("pyspark.zip"), path
    assert not os.path.exists(first)
