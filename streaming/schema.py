"""The one schema module of the streaming job: what the stateful operator
emits, and how alerts and dead letters become rows."""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from detectors.alerts import Alert
from detectors.envelope import DeadLetter, dumps

ALERT, DEAD_LETTER, STATS, CLOCKS = "alert", "dead_letter", "stats", "clock_evidence"

# record_type: ALERT, DEAD_LETTER, STATS or CLOCKS; id: alert_id, the record's
# position, or the cluster; payload: the SPEC section 3 alert JSON, the dead
# letter JSON, the cluster's detector snapshot (detectors.stats) for the
# driver's metrics, or the clock bounds a bucket measured for the others
# (detectors.clock_exchange.take_shared), which the driver publishes.
OUTPUT_SCHEMA = StructType(
    [
        StructField("record_type", StringType(), False),
        StructField("cluster", StringType(), False),
        StructField("id", StringType(), False),
        StructField("ts_ms", LongType(), True),
        StructField("source_partition", IntegerType(), True),
        StructField("source_offset", LongType(), True),
        StructField("payload", StringType(), False),
    ]
)
OUTPUT_COLUMNS = [f.name for f in OUTPUT_SCHEMA.fields]


def alert_row(alert: Alert) -> dict[str, Any]:
    return {
        "record_type": ALERT,
        "cluster": alert.cluster,
        "id": alert.alert_id,
        "ts_ms": alert.ts_ms,
        "source_partition": None,
        "source_offset": None,
        "payload": dumps(alert.to_dict()),
    }


def stats_row(cluster: str, snapshot: dict[str, Any]) -> dict[str, Any]:
    return {
        "record_type": STATS,
        "cluster": cluster,
        "id": cluster,
        "ts_ms": snapshot["newest_event_ts_ms"],
        "source_partition": None,
        "source_offset": None,
        "payload": dumps(snapshot),
    }


def clock_evidence_row(cluster: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "record_type": CLOCKS,
        "cluster": cluster,
        "id": cluster,
        "ts_ms": None,
        "source_partition": None,
        "source_offset": None,
        "payload": dumps(body),
    }


def dead_letter_row(
    cluster: str, letter: DeadLetter, partition: int | None, offset: int | None
) -> dict[str, Any]:
    """``partition``/``offset``: where the record was read, None for a record
    the detector held and released later (its letter's position names it)."""
    record = {
        **letter.to_dict(),
        "cluster": cluster or None,
        "source_partition": partition,
        "source_offset": offset,
    }
    return {
        "record_type": DEAD_LETTER,
        "cluster": cluster,
        "id": letter.position,
        "ts_ms": None,
        "source_partition": partition,
        "source_offset": offset,
        "payload": dumps(record),
    }
