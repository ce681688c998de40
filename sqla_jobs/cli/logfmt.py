"""Structured log lines for the command line, one per record: logfmt
(``ts=... level=... event=... msg=...``) or JSON (``{"ts": ..., "level": ..., "event": ...}``).

Both carry ``event``, ``job_id``, ``kind``, ``state`` and ``duration_ms`` when the record has them
(``extra=``). Payloads are never logged; job ids, kinds and states are. The worker command sends
every logger's records through one of these, so a handler's own ``logging`` calls come out in the
same format as the worker's.
"""

from __future__ import annotations

import importlib
import json
import logging
import logging.config
import sys
import time
from pathlib import Path
from typing import Any

_FIELDS = ("event", "job_id", "kind", "state", "duration_ms")
#: The levels ``--log-level`` takes.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("logfmt", "json")


class LoggingSetupError(ValueError):
    """A log level, format or config file that cannot be used; the message is one line."""


def _timestamp(record: logging.LogRecord) -> str:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{ts}.{int(record.msecs):03d}Z"


def _own(record: logging.LogRecord) -> bool:
    return record.name == "sqla_jobs" or record.name.startswith("sqla_jobs.")


def _quote(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' ="\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class LogfmtFormatter(logging.Formatter):
    """One ``key=value`` line per record; records of loggers outside sqla-jobs (a handler's own)
    also name their ``logger``."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"ts={_timestamp(record)}", f"level={record.levelname.lower()}"]
        if not _own(record):
            parts.append(f"logger={_quote(record.name)}")
        for key in _FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                parts.append(f"{key}={_quote(value)}")
        parts.append(f"msg={_quote(record.getMessage())}")
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``ts``, ``level``, ``logger``, the fields above
    when present, ``msg``, and ``exc`` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        for key in _FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value if isinstance(value, int | float | bool) else str(value)
        out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def check_level(level: str) -> str:
    """``level`` in upper case if it is one of :data:`LEVELS`, else :class:`LoggingSetupError`."""
    upper = level.upper()
    if upper not in LEVELS:
        raise LoggingSetupError(
            f"invalid log level {level!r}: use one of {', '.join(LEVELS)} (--log-level)"
        )
    return upper


def load_config(path: str) -> dict[str, Any]:
    """The dictConfig in ``path``: TOML if it ends in ``.toml``, else JSON."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise LoggingSetupError(f"cannot read log config {path}: {exc.strerror}") from None
    try:
        if file.suffix == ".toml":
            config: object = _toml(path, raw.decode("utf-8"))
        else:
            config = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        kind = "TOML" if file.suffix == ".toml" else "JSON"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LoggingSetupError(f"log config {path} is not valid {kind}: {first}") from None
    if not isinstance(config, dict) or "version" not in config:
        raise LoggingSetupError(
            f"log config {path} is not a logging.config.dictConfig (no 'version' key)"
        )
    return config


def _toml(path: str, text: str) -> Any:
    if sys.version_info < (3, 11):
        raise LoggingSetupError(f"log config {path}: TOML needs Python 3.11 or later; use JSON")
    # Imported by name: the package's typing targets 3.10, which has no tomllib.
    return importlib.import_module("tomllib").loads(text)


def configure(level: str = "INFO", fmt: str = "logfmt", config_file: str | None = None) -> None:
    """Send every logger's records to stderr, one line each, as ``fmt`` (logfmt or json) at
    ``level``; or, with ``config_file``, apply that dictConfig instead. Everything is checked
    before anything is changed: a bad argument raises :class:`LoggingSetupError` and leaves the
    logging setup as it was."""
    upper = check_level(level)
    if fmt not in FORMATS:
        raise LoggingSetupError(
            f"invalid log format {fmt!r}: use one of {', '.join(FORMATS)} (--log-format)"
        )
    if config_file is not None:
        config = load_config(config_file)
        # The worker's loggers exist by now; dictConfig's default would silence them.
        config.setdefault("disable_existing_loggers", False)
        try:
            logging.config.dictConfig(config)
        except (ValueError, TypeError, AttributeError, ImportError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise LoggingSetupError(
                f"log config {config_file} cannot be applied: {first}"
            ) from None
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(upper)
    # The package's loggers go through the root's handler like everyone else's.
    own = logging.getLogger("sqla_jobs")
    own.handlers[:] = []
    own.setLevel(logging.NOTSET)
    own.propagate = True
