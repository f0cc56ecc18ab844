"""Log setup for ``homing worker``: one line per job, as text or as JSON."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# One encoder for every record (``json.dumps`` with options builds one per call).
_RECORD = json.JSONEncoder(default=str)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the job's fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "homing", None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return _RECORD.encode(data)


def configure(fmt: str = "text", level: str = "info") -> None:
    """Send homing's logs to stderr in ``fmt`` ("text" or "json") at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("homing")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
