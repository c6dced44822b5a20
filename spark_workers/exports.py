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
import threading
from collections.abc import Callable
from typing import Any

from backfill_core.protocol import (
    ExportReport,
    ExportState,
    ExportTask,
    MvWrite,
    TablePlan,
    VnodeRead,
)
from backfill_core.schema import TableSchema
from spark_workers.client import ControlPlaneClient
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


class ExportRunner:
    """Claims and runs exports one at a time until ``stop`` is set."""

    def __init__(
        self,
        client: ControlPlaneClient,
        spark: Callable[[], SparkPath | None],
        stop: threading.Event,
        *,
        claim_s: float = 1.0,
        report_s: float = 1.0,
    ) -> None:
        self.client = client
        self.spark = spark
        self.stop = stop
        self.claim_s = claim_s
        self.report_s = report_s
        self.exports = 0  # exports run to an end, however it ended

    def run(self) -> None:
        while not self.stop.wait(self.claim_s):
            spark = self.spark()
            if spark is None or self.client.worker_id is None:
                continue  # not registered yet, or Spark is off on this worker
            try:
                task = self.client.claim_export()
            except Exception as e:  # the main loop handles the control plane's absence
                log.debug("could not claim an export: %s", e)
                continue
            if task is not None:
                self.run_export(spark, task)

    def run_export(self, spark: SparkPath, task: ExportTask) -> None:
        log.info("export %s of %s at epoch %s to %s", task.id, task.relation, task.epoch, task.path)
        group = f"export-{task.id}"
        done = threading.Event()
        stopped = threading.Event()  # the control plane answered other than running

        def watch() -> None:
            while not done.wait(self.report_s):
                if stopped.is_set():
                    # again until the write ends: a job submitted after a cancel (the
                    # session or its Python workers were still starting) is not cancelled
                    spark.session().sparkContext.cancelJobGroup(group)
                    continue
                try:
                    answer = self.client.report_export(task.id, ExportReport(ExportState.RUNNING))
                except Exception as e:
                    log.warning("could not report on export %s: %s", task.id, e)
                    continue
                if answer.state is not ExportState.RUNNING:
                    log.info("export %s is %s: stopping its job", task.id, answer.state)
                    stopped.set()
                    spark.session().sparkContext.cancelJobGroup(group)

        watcher = threading.Thread(target=watch, name=f"export-{task.id}-watch", daemon=True)
        watcher.start()
        final: ExportReport
        try:
            rows = write_export(spark, task, group)
            final = ExportReport(ExportState.SUCCEEDED, rows)
        except Exception as e:
            if stopped.is_set():
                final = ExportReport(ExportState.CANCELLED)
            else:
                log.exception("export %s failed", task.id)
                final = ExportReport(ExportState.FAILED, error=spark_error_message(e))
        finally:
            done.set()
            watcher.join()
        self._report_end(task, final)
        self.exports += 1

    def _report_end(self, task: ExportTask, final: ExportReport) -> None:
        for attempt in range(5):  # the client retries transport errors itself
            try:
                self.client.report_export(task.id, final)
                return
            except Exception as e:
                log.warning("could not report the end of export %s (%s): %s", task.id, attempt, e)
                if self.stop.wait(1.0):
                    return
        # the leader fails it once this worker is gone; until then its pin stays


def spark_error_message(e: Exception) -> str:
    """The first line of Spark's error (a Py4J error carries the whole JVM stack)."""
    text: Any = getattr(e, "desc", None) or str(e) or type(e).__name__
    first = str(text).strip().splitlines()
    return (first[0] if first else type(e).__name__)[:2000]
