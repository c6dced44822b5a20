"""The worker's id on every line its process logs (``docs/operations.md#logs``): the
control plane's formatters print the ids a record carries. Process-wide, because a
worker process is one worker and its lines come from several threads."""

from __future__ import annotations

import logging
from typing import Any

_ORIGINAL = logging.getLogRecordFactory()
_IDS: dict[str, Any] = {}


def _factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record = _ORIGINAL(*args, **kwargs)
    for key, value in _IDS.items():
        setattr(record, key, value)
    return record


def label_log_records(**ids: Any) -> None:
    """Every record logged from now on carries ``ids`` (an ``extra=`` of a call wins,
    as it is set after the factory)."""
    _IDS.update(ids)
    logging.setLogRecordFactory(_factory)


def forget_log_labels() -> None:
    """Records logged from now on carry no ids of this module (a stopped worker's)."""
    _IDS.clear()
    logging.setLogRecordFactory(_ORIGINAL)
