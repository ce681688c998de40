"""Structured log lines (logfmt) for the command line: ``ts=... level=... event=... msg=...``.

Payloads are never logged; job ids, kinds and states are.
"""

from __future__ import annotations

import logging
import sys
import time

_FIELDS = ("event", "job_id", "kind", "state")


def _quote(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' ="\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class LogfmtFormatter(logging.Formatter):
    """One ``key=value`` line per record."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"ts={ts}.{int(record.msecs):03d}Z", f"level={record.levelname.lower()}"]
        for key in _FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                parts.append(f"{key}={_quote(value)}")
        parts.append(f"msg={_quote(record.getMessage())}")
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure(level: str = "INFO") -> None:
    """Send ``sqla_jobs`` logs to stderr as logfmt at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    logger = logging.getLogger("sqla_jobs")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
