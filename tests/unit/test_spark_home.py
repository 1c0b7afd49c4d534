"""The Spark home the job runs Spark from (streaming/spark_home.py): the
wheel's scripts and jars, without the python/ directory whose zips Spark puts
first on its Python workers' path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyspark

from streaming.spark_home import compiled_spark_home

WHEEL_HOME = Path(pyspark.__file__).resolve().parent


def test_the_home_has_the_wheels_scripts_and_jars_and_no_python_directory(tmp_path: Path) -> None:
    home = Path(compiled_spark_home(str(tmp_path)))
    assert (home / "bin" / "spark-submit").resolve() == WHEEL_HOME / "bin" / "spark-submit"
    assert (home / "jars").resolve() == WHEEL_HOME / "jars"
    assert (WHEEL_HOME / "python" / "lib" / "pyspark.zip").exists(), "the wheel no longer ships the zip"
    assert not (home / "python").exists()
    assert compiled_spark_home(str(tmp_path)) == str(home)
    assert [p.name for p in tmp_path.iterdir()] == [home.name], "a draft was left behind"


def test_a_half_made_home_is_made_again(tmp_path: Path) -> None:
    home = Path(compiled_spark_home(str(tmp_path)))
    shutil.rmtree(home)
    home.mkdir()
    (home / "bin").mkdir()
    assert compiled_spark_home(str(tmp_path)) == str(home)
    assert (home / "jars").resolve() == WHEEL_HOME / "jars"
