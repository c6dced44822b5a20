"""Export work between the control plane and the workers: a worker claims a queued
export (``ExportTask``), reports on it while its Spark job runs and once it is over
(``ExportReport``), and learns from each answer whether the export was cancelled
(``ExportReportAnswer``). Decoded once at each end, like the other messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backfill_core.protocol.decode import MalformedMessage, get, integer, obj, opt_integer, text


class ExportState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (ExportState.SUCCEEDED, ExportState.FAILED, ExportState.CANCELLED)


def _state(d: Mapping[str, Any]) -> ExportState:
    value = text(d, "state")
    try:
        return ExportState(value)
    except ValueError:
        raise MalformedMessage(f"state {value!r} is not an export's state") from None


@dataclass(frozen=True)
class ExportTask:
    """A claimed export: the snapshot of ``storage_table`` (``table_schema`` in its JSON form,
    ``backfill_core.schema.TableSchema.from_json``) at ``epoch``, pinned against garbage
    collection until the export ends, written as ``format`` files under ``path``."""

    id: int
    relation: str
    storage_table: str
    table_schema: dict[str, Any]
    epoch: int
    format: str
    path: str

    @classmethod
    def from_json(cls, value: Any) -> ExportTask:
        d = obj(value, "export task")
        return cls(
            integer(d, "id"),
            text(d, "relation"),
            text(d, "storage_table"),
            dict(obj(get(d, "table_schema"), "table_schema")),
            integer(d, "epoch"),
            text(d, "format"),
            text(d, "path"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "relation": self.relation,
            "storage_table": self.storage_table,
            "table_schema": self.table_schema,
            "epoch": self.epoch,
            "format": self.format,
            "path": self.path,
        }


@dataclass(frozen=True)
class ExportReport:
    """Where a claimed export stands: ``running`` while its job runs, then how it ended
    (``succeeded`` with the rows written, ``failed`` with the error, or ``cancelled``
    once the worker stopped it)."""

    state: ExportState
    rows: int | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> ExportReport:
        d = obj(value, "export report")
        state = _state(d)
        if state is ExportState.QUEUED:
            raise MalformedMessage("a worker cannot put an export back in the queue")
        error = d.get("error")
        if error is not None and not isinstance(error, str):
            raise MalformedMessage("error is not a string")
        return cls(state, opt_integer(d, "rows"), error)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "rows": self.rows, "error": self.error}


@dataclass(frozen=True)
class ExportReportAnswer:
    """The export's state after the report: ``cancelled`` tells the worker to stop."""

    state: ExportState

    @classmethod
    def from_json(cls, value: Any) -> ExportReportAnswer:
        return cls(_state(obj(value, "export report answer")))

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value}
