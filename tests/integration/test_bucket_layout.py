"""A checkpoint keeps the bucket count it started with (streaming/bucket_layout.py),
through Hadoop's file system API on the real local Spark session."""

from __future__ import annotations

from pathlib import Path

import pytest

from streaming.bucket_layout import DEFAULT_BUCKETS, LAYOUT_FILE, LayoutMismatch, resolve_buckets

pytestmark = pytest.mark.integration


def test_a_new_checkpoint_records_its_count_and_refuses_another(spark, tmp_path: Path):
    checkpoint = str(tmp_path / "ck")
    assert resolve_buckets(spark, checkpoint, None) == DEFAULT_BUCKETS
    assert (tmp_path / "ck" / LAYOUT_FILE).exists()
    assert resolve_buckets(spark, checkpoint, None) == DEFAULT_BUCKETS
    assert resolve_buckets(spark, checkpoint, DEFAULT_BUCKETS) == DEFAULT_BUCKETS
    with pytest.raises(LayoutMismatch, match=f"written with --buckets {DEFAULT_BUCKETS}, not 3"):
        resolve_buckets(spark, checkpoint, 3)
    other = str(tmp_path / "other")
    assert resolve_buckets(spark, other, 3) == 3
    assert resolve_buckets(spark, other, None) == 3


def test_a_checkpoint_from_before_buckets_runs_with_one(spark, tmp_path: Path):
    (tmp_path / "ck" / "offsets").mkdir(parents=True)  # Spark's offset log: the query has run
    checkpoint = str(tmp_path / "ck")
    with pytest.raises(LayoutMismatch, match="predates buckets and runs with --buckets 1, not 8"):
        resolve_buckets(spark, checkpoint, 8)
    assert resolve_buckets(spark, checkpoint, None) == 1
    assert resolve_buckets(spark, checkpoint, 1) == 1
    with pytest.raises(LayoutMismatch, match="written with --buckets 1"):  # recorded now
        resolve_buckets(spark, checkpoint, 8)
