"""A streaming query's id before it starts, read from (or given to) its local checkpoint.

`project` claims its leases *before* it starts the query, so that a projection
running elsewhere fails the call at once rather than every task later, and
the lease owner is what `slicejournal status` and the telemetry show. Spark
keeps a query's id in `<checkpoint>/metadata` (`{"id":"..."}`) and reuses it on
every restart from that checkpoint; a new checkpoint gets a new id when the
query starts. Reading that file first, or writing a new id into it in Spark's
own format when the checkpoint is new, lets the owner be `spark:<query id>` —
the id of Spark's UI, logs and listeners.

Only a checkpoint on the driver's own file system is read or written here (a
URL with another scheme, or a Spark Connect session whose checkpoints live on
its server, gets a run id instead); anything unexpected in the file leaves it
alone.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from urllib.parse import urlparse

_METADATA = "metadata"


def query_id(checkpoint_location: str) -> str | None:
    """The id the query over `checkpoint_location` will have, or None if it cannot be
    known here (a remote file system, an unreadable or foreign metadata file)."""
    parsed = urlparse(checkpoint_location)
    if parsed.scheme == "file":
        directory = Path(parsed.path)
    elif parsed.scheme == "" or len(parsed.scheme) == 1:  # a path (or a Windows drive)
        directory = Path(checkpoint_location)
    else:
        return None
    metadata = directory / _METADATA
    try:
        if metadata.exists():
            return _valid(json.loads(metadata.read_text(encoding="utf-8")).get("id"))
        directory.mkdir(parents=True, exist_ok=True)
        new = str(uuid.uuid4())
        partial = directory / f".{_METADATA}.{new}.tmp"
        partial.write_text(json.dumps({"id": new}, separators=(",", ":")), encoding="utf-8")
        os.replace(partial, metadata)
        return new
    except (OSError, ValueError, AttributeError):
        return None


def _valid(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None
