"""The write half of an import's Spark job: a Python data source (format
``backfill_import``) whose tasks check the rows read from the files and COPY them, in
the table's storage layout, into the import's staging table, each task in one
transaction of its own (``docs/api.md#imports``).

The frame written holds the table's columns, then ``_bad`` (why the row cannot be
imported, or null: the reader's corrupt record of a CSV or JSON line, or the column a
Parquet value does not fit), ``_file`` and ``_row`` (its row in the file, from 0, where
the reader knows it: Parquet). A task that meets a bad row raises ``BadRow``, whose
message carries ``MARKER`` and the row's whereabouts as one line of JSON: the driver
finds it in Spark's error (``bad_row_of``). Options: ``task``, the ``ImportTask``'s JSON;
``dsn``, the store's; ``summary``: a file the commit (on the driver's host) writes the rows staged into.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from backfill_core.protocol import ImportTask
from backfill_core.schema import ColumnType, TableSchema
from backfill_core.vnode import vnodes_hasher
from state_store.options import worker_dsn

FORMAT = "backfill_import"
MARKER = "IMPORT-BAD-ROW "
BAD, FILE, ROW = "_bad", "_file", "_row"
_FOUND = re.compile(re.escape(MARKER) + r"(\{[^\n]*?\})(?:\n|$)")
_COPY_LINE = re.compile(r"COPY [^,]+, line (\d+)")


class BadRow(Exception):
    """A row that cannot be imported: ``where`` holds ``file``, ``row`` (from 0) or
    ``record`` (its text) where known, ``column`` and ``why``."""

    def __init__(self, where: dict[str, Any]) -> None:
        super().__init__(MARKER + json.dumps(where, default=str))
        self.where = where


def bad_row_of(error_text: str) -> dict[str, Any] | None:
    """The whereabouts of the bad row a task raised, found in Spark's error."""
    found = _FOUND.search(error_text)
    if found is None:
        return None
    try:
        value = json.loads(found.group(1))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class Staged(WriterCommitMessage):  # type: ignore[misc]
    rows: int


class ImportDataSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return ImportWriter(self.options["task"], self.options["dsn"], self.options["summary"])


class ImportWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, task: str, dsn: str, summary: str) -> None:
        self.task_text = task
        self.dsn = dsn
        self.summary_path = summary

    def write(self, iterator: Iterator[Any]) -> Staged:
        import psycopg2

        from state_store.staging import copy_into_staging
        from state_store.versioned import VersionedTable

        task = ImportTask.from_json(json.loads(self.task_text))
        schema = TableSchema.from_json(task.table_schema)
        table = VersionedTable(task.storage_table, schema)
        to_csv = _StagingCsv(schema)
        staged = 0
        conn: Any = None
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                _check(batch, schema)
                data = to_csv(batch)
                if conn is None:  # an empty partition needs no connection
                    conn = psycopg2.connect(worker_dsn(self.dsn))
                with conn.cursor() as cur:
                    try:
                        copy_into_staging(cur, table, task.staging_table, io.BytesIO(data))
                    except psycopg2.DataError as e:
                        raise _copy_bad_row(e, batch) from None
                staged += batch.num_rows
            if conn is not None:
                conn.commit()
        finally:
            if conn is not None:
                conn.close()
        return Staged(staged)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, Staged))
        tmp = self.summary_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"rows": rows}, f)
        os.replace(tmp, self.summary_path)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # the staging table goes with the failed import


def _where(batch: Any, i: int) -> dict[str, Any]:
    names = batch.schema.names
    where: dict[str, Any] = {"file": batch.column(names.index(FILE))[i].as_py()}
    row = batch.column(names.index(ROW))[i].as_py()
    if row is not None:
        where["row"] = int(row)
    return where


def _check(batch: Any, schema: TableSchema) -> None:
    """Raise ``BadRow`` for the first row that cannot be imported."""
    import pyarrow.compute as pc

    names = batch.schema.names
    bad = batch.column(names.index(BAD))
    if bad.null_count < len(bad):
        i = pc.index(pc.is_valid(bad), True).as_py()
        why = str(bad[i].as_py())
        where = _where(batch, i)
        if "row" in where:  # Parquet: the column that does not fit
            where["why"] = why
        else:  # CSV, JSON: the reader's corrupt record
            where |= {"why": "cannot read the record as the table's columns", "record": why}
        raise BadRow(where)
    for c in schema.columns:
        col = batch.column(names.index(c.name))
        if not c.nullable and col.null_count:
            i = pc.index(pc.is_null(col), True).as_py()
            why = "a primary key column is null" if c.name in schema.primary_key else "null"
            raise BadRow(_where(batch, i) | {"column": c.name, "why": why} | _values(batch, i))
        if c.type is ColumnType.DOUBLE:
            nonfinite = pc.invert(pc.is_finite(col))
            if pc.any(nonfinite).as_py():
                i = pc.index(nonfinite, True).as_py()
                why = "NaN and infinity are not accepted"
                raise BadRow(_where(batch, i) | {"column": c.name, "why": why} | _values(batch, i))


def _values(batch: Any, i: int) -> dict[str, Any]:
    """The row's values, to name a row whose place in its file the reader does not know."""
    names = batch.schema.names
    if batch.column(names.index(ROW))[i].as_py() is not None:
        return {}
    skip = {BAD, FILE, ROW}
    return {"values": {n: batch.column(n)[i].as_py() for n in names if n not in skip}}


def _copy_bad_row(e: Any, batch: Any) -> Exception:
    """Postgres refused a value of the batch (a numeric, jsonb or bytea text): the row."""
    found = _COPY_LINE.search(e.diag.context or "")
    if found is None:
        return e  # type: ignore[no-any-return]
    i = int(found.group(1)) - 1
    return BadRow(_where(batch, i) | {"why": e.diag.message_primary} | _values(batch, i))


class _StagingCsv:
    """A batch as CSV in the storage layout ``_vnode, <pk>, _epoch, _deleted, <values>``
    (Arrow's CSV writer; Python runs per row only to read the key's values)."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self.pk = list(schema.primary_key)
        self.values = [c.name for c in schema.value_columns]
        self.vnodes_of = vnodes_hasher(
            list(schema.dist_types),
            schema.vnode_count,
            [self.pk.index(n) for n in schema.distribution_key],
        )
        self.key_fix = [_key_fix(schema.column(n).type) for n in self.pk]

    def __call__(self, batch: Any) -> bytes:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        n = batch.num_rows
        keys = []
        for name, fix in zip(self.pk, self.key_fix, strict=True):
            values = batch.column(name).to_pylist()
            keys.append(values if fix is None else [fix(v) for v in values])
        cols = [pa.array(self.vnodes_of(keys), pa.int16())]
        cols += [self._ready(batch, name) for name in self.pk]
        cols += [pa.nulls(n, pa.int64()).fill_null(0), pa.nulls(n, pa.bool_()).fill_null(False)]
        cols += [self._ready(batch, name) for name in self.values]
        names = ["_vnode", *self.pk, "_epoch", "_deleted", *self.values]
        buf = io.BytesIO()
        pacsv.write_csv(
            pa.RecordBatch.from_arrays(cols, names=names),
            buf,
            pacsv.WriteOptions(include_header=False, quoting_style="needed"),
        )
        return buf.getvalue()

    def _ready(self, batch: Any, name: str) -> Any:
        import pyarrow as pa

        col = batch.column(name)
        t = self.schema.column(name).type
        if t is ColumnType.TIMESTAMPTZ and getattr(col.type, "tz", None) is None:
            # Spark hands timestamps over without their zone (the session's is UTC)
            return col.cast(pa.timestamp("us", tz="UTC"))
        if t is ColumnType.BYTEA and pa.types.is_binary(col.type):
            return pa.array(
                [None if v is None else "\\x" + v.hex() for v in col.to_pylist()], pa.string()
            )
        return col


def _key_fix(t: ColumnType) -> Any:
    """Arrow's Python value -> the core's, for hashing a key into its vnode."""
    import datetime as dt

    if t is ColumnType.NUMERIC:
        return lambda v: None if v is None else Decimal(v)
    if t is ColumnType.TIMESTAMPTZ:
        return lambda v: v if v is None or v.tzinfo is not None else v.replace(tzinfo=dt.UTC)
    if t is ColumnType.BYTEA:
        return lambda v: v if v is None or isinstance(v, bytes) else bytes.fromhex(v[2:])
    return None
