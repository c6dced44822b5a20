"""Exports on a worker: a thread of its own claims queued exports from the control plane
and runs each as one Spark job, beside the actors' work (Spark runs jobs of several
threads at once).

The job reads the relation's snapshot at the export's epoch through the store's data
source (``spark_workers.datasource``, every vnode from its start) and writes it with
``df.write.parquet(path)``; the control plane pinned that epoch when the export was
queued, so garbage collection keeps every version the reads need until the worker
reports the end. While the job runs, the worker reports every ``report_s``; an answer
other than ``running`` (the export was cancelled, or given up as lost) cancels the
job's group.
"""

from __future__ import annotations

import logging

from backfill_core.protocol import (
    ExportReport,
    ExportReportAnswer,
    ExportState,
    ExportTask,
    MvWrite,
    TablePlan,
    VnodeRead,
)
from backfill_core.schema import TableSchema
from spark_workers.claimed import ClaimedJobs, spark_error_message
from spark_workers.datasource import FORMAT
from spark_workers.spark_path import SparkPath

log = logging.getLogger(__name__)

ALL_ROWS = 1 << 62  # a read's limit that no vnode reaches


def export_plan(dsn: str, task: ExportTask, partitions: int) -> TablePlan:
    """The snapshot read of the export: every vnode from its start at the export's
    epoch, in ``partitions`` contiguous vnode ranges. Only the plan's read half is used
    (no view is written), so its write half names the relation and writes nothing."""
    schema = TableSchema.from_json(task.table_schema)
    n = schema.vnode_count
    parts = max(1, min(partitions, n))
    bounds = [(k * n // parts, (k + 1) * n // parts) for k in range(parts)]
    write = MvWrite(dsn, task.storage_table, schema, list(schema.names), None, 0, 0, task.epoch)
    return TablePlan(
        write,
        task.storage_table,
        schema,
        task.epoch,
        [[VnodeRead(v, None, ALL_ROWS) for v in range(lo, hi)] for lo, hi in bounds],
    )


def write_export(spark: SparkPath, task: ExportTask, group: str) -> int:
    """Write the export's files as one Spark job group; the rows written."""
    session = spark.session()
    sc = session.sparkContext
    sc.setJobGroup(group, f"export {task.id} of {task.relation}", interruptOnCancel=True)
    try:
        plan = export_plan(spark.dsn, task, int(sc.defaultParallelism))
        df = session.read.format(FORMAT).option("plan", plan.to_text()).load().drop("_vnode")
        df.write.parquet(task.path)  # (mode "error": a path that exists fails the export)
        # Parquet footers hold the row counts: counting reads no data
        return int(session.read.parquet(task.path).count())
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


class ExportRunner(ClaimedJobs[ExportTask, ExportReport]):
    """Claims and runs exports one at a time until ``stop`` is set."""

    kind = "export"
    report_type = ExportReport

    def claim(self) -> ExportTask | None:
        return self.client.claim_export()

    def report(self, task: ExportTask, report: ExportReport) -> ExportReportAnswer:
        # until a report of its end, or its worker is gone, the export's pin stays
        return self.client.report_export(task.id, report)

    def execute(self, spark: SparkPath, task: ExportTask, group: str) -> ExportReport:
        log.info("export %s of %s at epoch %s to %s", task.id, task.relation, task.epoch, task.path)
        return ExportReport(ExportState.SUCCEEDED, write_export(spark, task, group))

    def failed(self, task: ExportTask, error: Exception) -> ExportReport:
        log.error("export %s failed", task.id, exc_info=error)
        return ExportReport(ExportState.FAILED, error=spark_error_message(error))
