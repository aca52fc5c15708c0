"""A JSON log formatter for the host's ``LOGGING``: one object per line with the time, level,
logger, message, the traceback of a failure and every field a record carries in ``extra``
(Tenure's own are the ``tenure_*`` keys: job id, type, queue, attempt, fence, outcome...).

``docs/reference/logging.md`` lists Tenure's loggers and shows the ``LOGGING`` recipe.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)
"""The attributes every record has; anything else came in ``extra``."""


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON.

    Keys: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, ``exception`` (the
    formatted traceback, when the record has one), ``stack`` (when ``stack_info`` was asked
    for), then each field of ``extra`` under its own name; a value JSON cannot hold is written
    as its ``str()``.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        return json.dumps(out, default=str, ensure_ascii=False)
