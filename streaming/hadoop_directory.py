"""Files kept with Spark's checkpoint, through Hadoop's FileSystem API, so
they work wherever the checkpoint does (local disk, HDFS, S3)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class HadoopDirectory:
    """A directory through Hadoop's FileSystem API (the driver's JVM, over py4j)."""

    def __init__(self, spark: SparkSession, uri: str):
        jvm: Any = spark._jvm
        self._jvm = jvm
        self._path = jvm.org.apache.hadoop.fs.Path(uri)
        self._fs = self._path.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore[union-attr]

    def _child(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._path, name)

    def names(self) -> list[str]:
        if not self._fs.exists(self._path):
            return []
        return [str(status.getPath().getName()) for status in self._fs.listStatus(self._path)]

    def read(self, name: str) -> bytes:
        stream = self._fs.open(self._child(name))
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def create(self, name: str, data: bytes) -> None:
        """Write ``name`` whole or not at all (a temporary file, then a rename); keep an existing one."""
        final = self._child(name)
        if self._fs.exists(final):
            return
        self._fs.mkdirs(self._path)
        temporary = self._child(f".{name}.tmp")
        out = self._fs.create(temporary, True)
        try:
            out.write(bytearray(data))
            out.hsync()
        finally:
            out.close()
        if not self._fs.rename(temporary, final):
            raise OSError(f"could not rename {temporary} to {final}")

    def delete(self, name: str) -> None:
        self._fs.delete(self._child(name), False)
