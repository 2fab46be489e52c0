"""The CLI's log output: text for people, or JSON lines for a log pipeline.

The library only logs (under `slicejournal.*`, with each lifecycle line's
fields — `projection`, `range`, `worker`, `epoch`, `event`, ... — passed as
`extra=`); it installs no handler. The `slicejournal` command does, on
stderr, and `--log-format json` makes every record one JSON object carrying
those fields as keys, so a collector (Loki, Elasticsearch, CloudWatch) can
filter a range's or a worker's history without parsing messages.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("text", "json")

# The attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD: Final = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the
    record's `extra=` fields, and the traceback (`exception`) if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr from `level` on, as text lines or (`json`) JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def add_log_options(parser: argparse.ArgumentParser, *, top_level: bool = False) -> None:
    """`--log-level` and `--log-format`, accepted before the subcommand (`top_level`: the
    defaults live there) and after it (no defaults: one given after the subcommand
    wins, one not given leaves the top level's value alone)."""
    default_level: object = "warning" if top_level else argparse.SUPPRESS
    default_format: object = "text" if top_level else argparse.SUPPRESS
    parser.add_argument(
        "--log-level",
        default=default_level,
        type=str.lower,
        choices=LOG_LEVELS,
        help="log to stderr from this level on (default: warning; info shows the "
        "projections' lifecycle)",
    )
    parser.add_argument(
        "--log-format",
        default=default_format,
        type=str.lower,
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line with each lifecycle line's fields "
        "(projection, range, worker, epoch, event) as keys (default: text)",
    )
