"""A Spark home whose Python workers import the installed, compiled pyspark.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the
PYTHONPATH of every Python process it starts (spark-core's
``PythonUtils.sparkPythonPath``). The pyspark wheel ships those zips inside the
package it installs, and Python imports from a zip without bytecode: every such
process compiles pyspark from source. Importing the stream source's process
module that way took 6.4-7.9 CPU-s on this machine kind, against 1.0-2.7 CPU-s
from the installed package, and Spark gives that process 10 s to connect back
(streaming/query_start.py). So a query's start failed whenever the cores were
busy, and every daemon Spark forks its Python workers from paid the same.

The home made here links every entry of the wheel's Spark home (bin, jars,
sbin...) but ``python``: Spark finds its scripts and jars as before, and the
zips it names do not exist, so Python imports pyspark from site-packages.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

# What the JVM's side reads under SPARK_HOME and the home must not have.
_LEFT_OUT = "python"


def compiled_spark_home(parent: str | None = None) -> str:
    """The directory to use as SPARK_HOME, made once per pyspark install and
    user in ``parent`` (default: the system's temporary directory)."""
    import pyspark

    wheel_home = Path(pyspark.__file__).resolve().parent
    digest = hashlib.sha256(str(wheel_home).encode()).hexdigest()[:12]
    home = Path(parent or tempfile.gettempdir()) / f"fencewatch-spark-home-{os.getuid()}-{digest}"
    if _links_to(home, wheel_home):
        return str(home)
    # Built aside and renamed into place, so that processes starting at once
    # never see a half-made home; whichever rename comes second gives way.
    draft = Path(tempfile.mkdtemp(prefix=f"{home.name}-", dir=home.parent))
    for entry in wheel_home.iterdir():
        if entry.name != _LEFT_OUT:
            (draft / entry.name).symlink_to(entry)
    if home.exists() and not _links_to(home, wheel_home):
        shutil.rmtree(home, ignore_errors=True)
    try:
        draft.rename(home)
    except OSError:
        shutil.rmtree(draft, ignore_errors=True)
        if not _links_to(home, wheel_home):
            raise
    return str(home)


def _links_to(home: Path, wheel_home: Path) -> bool:
    """Whether ``home`` is a finished home of ``wheel_home`` (its jars the wheel's)."""
    jars = home / "jars"
    return jars.is_symlink() and jars.resolve() == wheel_home / "jars" and not (home / _LEFT_OUT).exists()
