"""Export work between the control plane and the workers: a worker claims a queued
export (``ExportTask``), reports on it while its Spark job runs and once it is over
(``ExportReport``), and learns from each answer whether the export was cancelled
(``ExportReportAnswer``). Decoded once at each end, like the other messages; what
exports share with imports is in ``backfill_core.protocol.claimed``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backfill_core.protocol.claimed import ClaimedTask, TaskReport, TaskState, decode_state
from backfill_core.protocol.decode import integer, obj, text

ExportState = TaskState


@dataclass(frozen=True)
class ExportTask(ClaimedTask):
    """A claimed export: the snapshot of ``storage_table`` at ``epoch``, pinned against
    garbage collection until the export ends, written as ``format`` files under ``path``."""

    epoch: int
    format: str
    path: str

    @classmethod
    def from_json(cls, value: Any) -> ExportTask:
        d = obj(value, "export task")
        return cls(*cls.decode_claimed(d), integer(d, "epoch"), text(d, "format"), text(d, "path"))

    def to_json(self) -> dict[str, Any]:
        return self.claimed_json() | {"epoch": self.epoch, "format": self.format, "path": self.path}


@dataclass(frozen=True)
class ExportReport(TaskReport):
    """Where a claimed export stands: ``running`` while its job runs, then how it ended
    (``succeeded`` with the rows written, ``failed`` with the error, or ``cancelled``
    once the worker stopped it)."""

    @classmethod
    def from_json(cls, value: Any) -> ExportReport:
        return cls(*cls.decode_report(obj(value, "export report"), "export"))

    def to_json(self) -> dict[str, Any]:
        return self.report_json()


@dataclass(frozen=True)
class ExportReportAnswer:
    """The export's state after the report: ``cancelled`` tells the worker to stop."""

    state: TaskState

    @classmethod
    def from_json(cls, value: Any) -> ExportReportAnswer:
        return cls(decode_state(obj(value, "export report answer"), "export"))

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value}
