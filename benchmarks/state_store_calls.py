"""What one state-store call costs from the job's stateful operator.

    .venv/bin/python benchmarks/state_store_calls.py --calls 20000

The job keeps each partition's history under its own MapState key
(streaming/state.py), so tracking a new partition costs a ``getValue`` (it
is not there yet) and an ``updateValue``. This starts local Spark with the
job's settings, runs one ``transformWithStateInPandas`` batch whose operator
makes ``--calls`` of each call with the job's key and value schemas (300-byte
values), and prints the mean time per call as the operator measured it.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from typing import Any

CALLS = ("getValue, key absent", "updateValue", "getValue, key present")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--calls", type=int, default=20_000, help="calls of each kind (default %(default)s)")
    args = p.parse_args(argv)
    calls = args.calls

    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from streaming.job import ROCKSDB_PROVIDER, spark_session
    from streaming.state import PARTITION_KEY_SCHEMA, PARTITION_VALUE_SCHEMA

    class Timed(StatefulProcessor):  # defined here so that cloudpickle ships it to the workers
        def init(self, handle: Any) -> None:
            self.partitions = handle.getMapState("partitions", PARTITION_KEY_SCHEMA, PARTITION_VALUE_SCHEMA)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            list(rows)
            keys = [(f"topic-{i // 1000}", i % 1000) for i in range(calls)]
            value = (b"x" * 300,)
            marks = [time.perf_counter()]
            for k in keys:
                self.partitions.getValue(k)
            marks.append(time.perf_counter())
            for k in keys:
                self.partitions.updateValue(k, value)
            marks.append(time.perf_counter())
            for k in keys:
                self.partitions.getValue(k)
            marks.append(time.perf_counter())
            micros = [(b - a) / calls * 1e6 for a, b in itertools.pairwise(marks)]
            yield pd.DataFrame({"call": list(CALLS), "micros": micros})

        def close(self) -> None:
            pass

    spark = spark_session("local[2]")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    one_row = spark.readStream.format("rate").option("rowsPerSecond", 1).load().selectExpr("'c' AS k")
    query = (
        one_row.groupBy("k")
        .transformWithStateInPandas(Timed(), "call string, micros double", "Append", "None")
        .writeStream.format("memory")
        .queryName("state_store_calls")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="fencewatch-calls-"))
        .start()
    )
    try:
        while not spark.table("state_store_calls").count():
            if query.awaitTermination(1):
                raise RuntimeError(f"query stopped: {query.exception()}")
    finally:
        query.stop()
    for row in spark.table("state_store_calls").collect():
        print(f"{row.call:<24} {row.micros:8.0f} us per call  ({calls:,} calls)")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
