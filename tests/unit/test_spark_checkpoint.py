"""The streaming query's id known before it starts, from its local checkpoint."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from projections.spark.checkpoint import query_id


def test_a_new_local_checkpoint_gets_an_id_in_sparks_own_format(tmp_path: Path) -> None:
    checkpoint = tmp_path / "a" / "ckpt"
    given = query_id(str(checkpoint))
    assert given is not None
    # What Spark's StreamMetadata reads: one JSON object with the id, nothing else.
    assert json.loads((checkpoint / "metadata").read_text()) == {"id": given}
    assert query_id(str(checkpoint)) == given  # a restart keeps it
    assert query_id(checkpoint.as_uri()) == given
    assert [p.name for p in checkpoint.iterdir()] == ["metadata"]


def test_an_existing_id_is_read_and_anything_else_left_alone(tmp_path: Path) -> None:
    existing = str(uuid.uuid4())
    (tmp_path / "metadata").write_text(json.dumps({"id": existing}))
    assert query_id(str(tmp_path)) == existing
    (tmp_path / "metadata").write_text("not json")
    assert query_id(str(tmp_path)) is None
    assert (tmp_path / "metadata").read_text() == "not json"
    assert query_id("s3a://bucket/ckpt") is None
    assert query_id("hdfs://nn/ckpt") is None
