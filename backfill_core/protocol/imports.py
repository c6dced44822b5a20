"""Import work between the control plane and the workers: a worker claims a queued
import (``ImportTask``), reports on it while its Spark job loads the files into the
import's staging table and once that is over (``ImportReport``); the answer
(``ImportReportAnswer``) says the import's state after the report: ``cancelled`` tells
the worker to stop, and a report that the rows are staged is answered once the control
plane published them (``succeeded``) or refused them (``failed``, with the error)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from backfill_core.protocol.decode import MalformedMessage, get, integer, obj, opt_integer, text


class ImportState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (ImportState.SUCCEEDED, ImportState.FAILED, ImportState.CANCELLED)


FORMATS = ("parquet", "csv", "json")


def _state(d: Mapping[str, Any]) -> ImportState:
    value = text(d, "state")
    try:
        return ImportState(value)
    except ValueError:
        raise MalformedMessage(f"state {value!r} is not an import's state") from None


def _opt_text(d: Mapping[str, Any], key: str) -> str | None:
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        raise MalformedMessage(f"{key} is not a string")
    return value


@dataclass(frozen=True)
class ImportTask:
    """A claimed import: the ``format`` files under ``path``, read with the table's
    schema (``table_schema`` in its JSON form) and written in the storage layout of
    ``storage_table`` into ``staging_table`` (of the store's schema), which the control
    plane created with the claim and publishes from at one epoch."""

    id: int
    relation: str
    storage_table: str
    table_schema: dict[str, Any]
    format: str
    path: str
    staging_table: str

    @classmethod
    def from_json(cls, value: Any) -> ImportTask:
        d = obj(value, "import task")
        return cls(
            integer(d, "id"),
            text(d, "relation"),
            text(d, "storage_table"),
            dict(obj(get(d, "table_schema"), "table_schema")),
            text(d, "format"),
            text(d, "path"),
            text(d, "staging_table"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "relation": self.relation,
            "storage_table": self.storage_table,
            "table_schema": self.table_schema,
            "format": self.format,
            "path": self.path,
            "staging_table": self.staging_table,
        }


@dataclass(frozen=True)
class ImportReport:
    """Where a claimed import stands: ``running`` while its job runs, then how it ended
    on the worker: ``succeeded`` with the rows staged (the control plane then publishes
    them), ``failed`` with the error (``error_code`` and ``details``: what is wrong and
    where, e.g. the file and row of a bad row), or ``cancelled`` once the job stopped."""

    state: ImportState
    rows: int | None = None
    error: str | None = None
    error_code: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: Any) -> ImportReport:
        d = obj(value, "import report")
        state = _state(d)
        if state is ImportState.QUEUED:
            raise MalformedMessage("a worker cannot put an import back in the queue")
        details = d.get("details") or {}
        if not isinstance(details, dict):
            raise MalformedMessage("details is not an object")
        return cls(
            state,
            opt_integer(d, "rows"),
            _opt_text(d, "error"),
            _opt_text(d, "error_code"),
            dict(details),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "rows": self.rows,
            "error": self.error,
            "error_code": self.error_code,
            "details": self.details,
        }


@dataclass(frozen=True)
class ImportReportAnswer:
    """The import's state after the report, and its error if it failed."""

    state: ImportState
    error: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> ImportReportAnswer:
        d = obj(value, "import report answer")
        return cls(_state(d), _opt_text(d, "error"))

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "error": self.error}
