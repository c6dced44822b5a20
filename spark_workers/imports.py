"""Imports on a worker: a thread of its own claims queued imports from the control plane
and runs each as one Spark job, beside the actors' work and the exports.

The job reads the files with the table's schema (``import_frame``: CSV and JSON in
Spark's PERMISSIVE mode with a corrupt-record column; Parquet with the files' own types,
each column cast to the table's with ``try_cast``) and its tasks COPY the rows into the
import's staging table (``spark_workers.import_source``). A bad row fails the job; its
file and row (or line, found on this failure path only) become the import's error. Once
the job staged every row the worker reports ``succeeded``: the control plane publishes
the rows at one epoch and answers. While the job runs, the worker reports every
``report_s``; an answer other than ``running`` (cancelled, or given up as lost) cancels
the job's group, as for exports.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

from backfill_core.protocol import ImportReport, ImportReportAnswer, ImportState, ImportTask
from backfill_core.schema import ColumnType, TableSchema
from spark_workers.claimed import ClaimedJobs, spark_error_message
from spark_workers.datasource import SPARK_TYPES, quoted
from spark_workers.import_source import BAD, FILE, FORMAT, ROW, bad_row_of
from spark_workers.spark_path import SparkPath

log = logging.getLogger(__name__)

CORRUPT = "_corrupt_record"


class ImportFailed(Exception):
    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = details or {}


def import_frame(session: Any, task: ImportTask) -> Any:
    """The files as a frame of the table's columns, then ``_bad``, ``_file``, ``_row``."""
    from pyspark.sql import functions as F

    schema = TableSchema.from_json(task.table_schema)
    if task.format == "parquet":
        raw = session.read.parquet(task.path)
        present = {n.lower() for n in raw.columns}
        cols, bad = [], []
        for c in schema.columns:
            if c.name.lower() not in present:
                if not c.nullable:  # (a missing nullable column is null in every row)
                    raise ImportFailed(
                        "missing_column",
                        f"the files have no column {c.name!r}, which is not nullable",
                        {"column": c.name},
                    )
                cols.append(F.lit(None).cast(SPARK_TYPES[c.type]).alias(c.name))
                continue
            src = F.col(quoted(c.name))
            cast = src.try_cast(SPARK_TYPES[c.type])
            cols.append(cast.alias(c.name))
            why = F.concat(F.lit(f"column {c.name!r}: cannot read "), src.try_cast("STRING"))
            bad.append(F.when(src.isNotNull() & cast.isNull(), why))
        return raw.select(
            *cols,
            F.coalesce(*bad, F.lit(None).cast("STRING")).alias(BAD),
            F.col("_metadata.file_path").alias(FILE),
            F.col("_metadata.row_index").alias(ROW),
        )
    # bytea as its hex text: neither the CSV nor the JSON reader takes binary
    types = {t: ("STRING" if t is ColumnType.BYTEA else s) for t, s in SPARK_TYPES.items()}
    ddl = ", ".join(f"{quoted(c.name)} {types[c.type]}" for c in schema.columns)
    reader = (
        session.read.schema(f"{ddl}, {quoted(CORRUPT)} STRING")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
    )
    if task.format == "csv":
        # the header names the table's columns (Spark checks it against the schema)
        reader = reader.option("header", "true").option("enforceSchema", "false")
    df = reader.format(task.format).load(task.path)
    return df.select(
        *(F.col(quoted(c.name)) for c in schema.columns),
        F.col(CORRUPT).alias(BAD),
        F.input_file_name().alias(FILE),
        F.lit(None).cast("BIGINT").alias(ROW),
    )


def load_import(spark: SparkPath, task: ImportTask, group: str) -> int:
    """Stage the import's rows as one Spark job group; the rows staged. ``ImportFailed``
    when the files cannot be read or hold a bad row."""
    session = spark.session()
    sc = session.sparkContext
    sc.setJobGroup(group, f"import {task.id} into {task.relation}", interruptOnCancel=True)
    # a write looks its Python data source up in the thread's active session (as warm_up)
    session._jvm.SparkSession.setActiveSession(session._jsparkSession)
    try:
        with tempfile.TemporaryDirectory(prefix="import-") as tmp:
            summary = os.path.join(tmp, "summary.json")
            try:
                df = import_frame(session, task)
                df.write.format(FORMAT).option("task", json.dumps(task.to_json())).option(
                    "dsn", spark.dsn
                ).option("summary", summary).mode("append").save()
            except Exception as e:
                raise _failure(session, task, e) from e
            with open(summary) as f:
                return int(json.load(f)["rows"])
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


def _failure(session: Any, task: ImportTask, e: Exception) -> Exception:
    if isinstance(e, ImportFailed):
        return e
    text = str(e)
    where = bad_row_of(text)
    if where is not None:
        return _bad_row(session, where)
    if "PATH_NOT_FOUND" in text or "Path does not exist" in text:
        return ImportFailed("unreadable_path", f"path {task.path!r} does not exist")
    return e


def _bad_row(session: Any, where: dict[str, Any]) -> ImportFailed:
    """The error of a bad row: its file and row (Parquet, from 1), or its line (the line
    of its record's text in the file, from 1, found by reading the file again)."""
    details: dict[str, Any] = {"file": where.get("file")}
    if "row" in where:
        details["row"] = int(where["row"]) + 1
        at = f"row {details['row']}"
    elif "record" in where:
        details["record"] = where["record"]
        line = _line_of(session, str(where["file"]), str(where["record"]))
        if line is not None:
            details["line"] = line
        at = f"line {line}" if line is not None else f"record {where['record']!r}"
    else:
        details["values"] = where.get("values")
        at = f"the row {json.dumps(where.get('values'), default=str)}"
    if "column" in where:
        details["column"] = where["column"]
    why = str(where.get("why", "cannot be imported"))
    column = f" (column {where['column']!r})" if "column" in where else ""
    details["why"] = why
    return ImportFailed("bad_row", f"{details['file']}, {at}: {why}{column}", details)


def _line_of(session: Any, file: str, record: str) -> int | None:
    """The first line of ``file`` that is ``record``, from 1 (None for a record over
    several lines)."""
    try:
        lines = session.read.text(file).rdd.zipWithIndex()
        hits = lines.filter(lambda p: p[0][0] == record).map(lambda p: p[1]).take(1)
    except Exception as e:
        log.warning("could not find the bad record in %s: %s", file, e)
        return None
    return int(hits[0]) + 1 if hits else None


class ImportRunner(ClaimedJobs[ImportTask, ImportReport]):
    """Claims and runs imports one at a time until ``stop`` is set."""

    kind = "import"
    report_type = ImportReport

    def claim(self) -> ImportTask | None:
        return self.client.claim_import()

    def report(self, task: ImportTask, report: ImportReport) -> ImportReportAnswer:
        # an end not reported: the leader fails the import once this worker is gone, and
        # drops its staging table
        return self.client.report_import(task.id, report)

    def execute(self, spark: SparkPath, task: ImportTask, group: str) -> ImportReport:
        log.info(
            "import %s of %s files at %s into %s", task.id, task.format, task.path, task.relation
        )
        return ImportReport(ImportState.SUCCEEDED, load_import(spark, task, group))

    def failed(self, task: ImportTask, error: Exception) -> ImportReport:
        if isinstance(error, ImportFailed):  # a bad file or row: the import's own error
            log.warning("import %s failed: %s", task.id, error)
            return ImportReport(
                ImportState.FAILED, None, str(error)[:2000], error.code, error.details
            )
        log.error("import %s failed", task.id, exc_info=error)
        return ImportReport(ImportState.FAILED, None, spark_error_message(error), "spark")

    def report_end(self, task: ImportTask, final: ImportReport) -> None:
        answer = self.report(task, final)
        log.info("import %s: %s %s", task.id, answer.state, answer.error or "")
