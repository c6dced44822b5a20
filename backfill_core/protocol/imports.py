"""Import work between the control plane and the workers: a worker claims a queued
import (``ImportTask``), reports on it while its Spark job loads the files into the
import's staging table and once that is over (``ImportReport``); the answer
(``ImportReportAnswer``) says the import's state after the report: ``cancelled`` tells
the worker to stop, and a report that the rows are staged is answered once the control
plane published them (``succeeded``) or refused them (``failed``, with the error). What
imports share with exports is in ``backfill_core.protocol.claimed``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backfill_core.protocol.claimed import (
    ClaimedTask,
    TaskReport,
    TaskState,
    decode_state,
    opt_text,
)
from backfill_core.protocol.decode import MalformedMessage, obj, text

ImportState = TaskState

FORMATS = ("parquet", "csv", "json")


@dataclass(frozen=True)
class ImportTask(ClaimedTask):
    """A claimed import: the ``format`` files under ``path``, read with the table's
    schema and written in the storage layout of ``storage_table`` into
    ``staging_table`` (of the store's schema), which the control plane created with the
    claim and publishes from at one epoch."""

    format: str
    path: str
    staging_table: str

    @classmethod
    def from_json(cls, value: Any) -> ImportTask:
        d = obj(value, "import task")
        return cls(
            *cls.decode_claimed(d), text(d, "format"), text(d, "path"), text(d, "staging_table")
        )

    def to_json(self) -> dict[str, Any]:
        return self.claimed_json() | {
            "format": self.format,
            "path": self.path,
            "staging_table": self.staging_table,
        }


@dataclass(frozen=True)
class ImportReport(TaskReport):
    """Where a claimed import stands: ``running`` while its job runs, then how it ended
    on the worker: ``succeeded`` with the rows staged (the control plane then publishes
    them), ``failed`` with the error (``error_code`` and ``details``: what is wrong and
    where, e.g. the file and row of a bad row), or ``cancelled`` once the job stopped."""

    error_code: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: Any) -> ImportReport:
        d = obj(value, "import report")
        state, rows, error = cls.decode_report(d, "import")
        details = d.get("details") or {}
        if not isinstance(details, dict):
            raise MalformedMessage("details is not an object")
        return cls(state, rows, error, opt_text(d, "error_code"), dict(details))

    def to_json(self) -> dict[str, Any]:
        return self.report_json() | {"error_code": self.error_code, "details": self.details}


@dataclass(frozen=True)
class ImportReportAnswer:
    """The import's state after the report, and its error if it failed."""

    state: TaskState
    error: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> ImportReportAnswer:
        d = obj(value, "import report answer")
        return cls(decode_state(d, "import"), opt_text(d, "error"))

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "error": self.error}
