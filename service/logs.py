"""Logging by convention: one level for every logger (uvicorn's included), plain text or
JSON lines (``BACKFILL_LOG_FORMAT``), and on every line the ids of what it is about
(request, job, actor, worker) taken from the context the line is logged in
(docs/operations.md#logs)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
LEVEL_PATTERN = rf"^({'|'.join(LEVELS)})$"
FORMAT_PATTERN = rf"^({'|'.join(FORMATS)})$"
CONTEXT_KEYS = ("request_id", "job_id", "actor_id", "worker_id")
# chatty below a warning whatever the level, unless it is debug
QUIET = ("pgserver", "alembic", "httpx", "httpcore", "py4j", "multipart")

_NO_IDS: Mapping[str, Any] = MappingProxyType({})
_CONTEXT: ContextVar[Mapping[str, Any]] = ContextVar("backfill_log_context", default=_NO_IDS)


class LogSettingsError(ValueError):
    pass


@contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Lines logged inside carry ``ids`` (None values are left out)."""
    token = _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def set_log_context(**ids: Any) -> None:
    """``log_context`` for the rest of the current context (an ASGI request's task)."""
    _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in ids.items() if v is not None}})


class ContextFilter(logging.Filter):
    """Puts the context's ids on the record (an ``extra=`` of the call wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _CONTEXT.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def _ids(record: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(record, k) for k in CONTEXT_KEYS if getattr(record, k, None) is not None}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_ids(record),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = _ids(record)
        if not ids:
            return line
        head, sep, tail = line.partition("\n")  # after the message, before a traceback
        return f"{head} [{' '.join(f'{k}={v}' for k, v in ids.items())}]{sep}{tail}"


def configure_logging(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """One handler on the root logger; every other logger (uvicorn's too) propagates to
    it, so one level and one format hold for all."""
    if level not in LEVELS:
        raise LogSettingsError(f"BACKFILL_LOG_LEVEL must be one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise LogSettingsError(f"BACKFILL_LOG_FORMAT must be one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    numeric = getattr(logging, level.upper())
    root.setLevel(numeric)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))


def configure_logging_from_env(environ: Mapping[str, str] = os.environ) -> None:
    configure_logging(
        environ.get("BACKFILL_LOG_LEVEL", "info").lower(),
        environ.get("BACKFILL_LOG_FORMAT", "text").lower(),
    )
