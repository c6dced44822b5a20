"""Spark's Python Data Source API over the state store: the snapshot-read and MV-write
halves of one backfill epoch.

Why the Python Data Source and not JDBC: JDBC reads raw rows faster
(``bench/HISTORY.md#the-python-data-source-not-jdbc``), and we still choose the Python
source because:
each epoch reads every vnode *after its own position* with its own row limit, which
JDBC's partitioning (a WHERE clause per partition) cannot express; the writer must be
fenced by the graph's recovery sequence and must send back, per vnode, how many rows
it read and the last key (the executor's ``current_pos``), which a JDBC sink cannot;
and the embedded Postgres listens on a unix socket only, which the JDBC driver cannot
reach (it also needs a jar that pip does not ship). The reader streams
``COPY ... TO STDOUT (FORMAT csv)`` into Arrow's CSV parser and the writer filters with
Arrow kernels and writes CSV through COPY, so no Python code runs per row on either side
(except to convert bytea values and to test numeric or jsonb filter leaves).

Format ``backfill_store``; one option ``plan`` (``backfill_core.protocol.TablePlan`` as
JSON text, built by ``spark_path``):
reading yields ``(_vnode, <upstream columns>)`` for each partition's vnode reads, in
(vnode, pk) order; writing (append) applies the view (filter and projection) to those
rows, writes the MV rows at the plan's write epoch under the fence, and sends the
per-vnode ``(count, last pk)`` of the rows *read* back through ``summary`` (a file the
driver reads after the job: commit runs on the driver's host).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from backfill_core.protocol import TablePlan
from backfill_core.schema import ColumnType, TableSchema, value_to_json
from state_store.options import worker_dsn

FORMAT = "backfill_store"

# the Spark type of each store type (imports read files as these too)
SPARK_TYPES = {
    ColumnType.SMALLINT: "SMALLINT",
    ColumnType.INT: "INT",
    ColumnType.BIGINT: "BIGINT",
    ColumnType.DOUBLE: "DOUBLE",
    ColumnType.NUMERIC: "STRING",  # exact as text: Spark's decimals stop at 38 digits
    ColumnType.TEXT: "STRING",
    ColumnType.BOOLEAN: "BOOLEAN",
    ColumnType.DATE: "DATE",
    ColumnType.TIMESTAMP: "TIMESTAMP_NTZ",
    ColumnType.TIMESTAMPTZ: "TIMESTAMP",
    ColumnType.JSONB: "STRING",
    ColumnType.BYTEA: "BINARY",
}


def quoted(name: str) -> str:
    """``name`` as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def spark_ddl(schema: TableSchema) -> str:
    cols = ["`_vnode` SMALLINT"]
    for c in schema.columns:
        cols.append(f"{quoted(c.name)} {SPARK_TYPES[c.type]}")
    return ", ".join(cols)


def _arrow_types(schema: TableSchema) -> list[Any]:
    import pyarrow as pa

    m = {
        ColumnType.SMALLINT: pa.int16(),
        ColumnType.INT: pa.int32(),
        ColumnType.BIGINT: pa.int64(),
        ColumnType.DOUBLE: pa.float64(),
        ColumnType.NUMERIC: pa.string(),
        ColumnType.TEXT: pa.string(),
        ColumnType.BOOLEAN: pa.bool_(),
        ColumnType.DATE: pa.date32(),
        ColumnType.TIMESTAMP: pa.timestamp("us"),
        ColumnType.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
        ColumnType.JSONB: pa.string(),
        ColumnType.BYTEA: pa.binary(),
    }
    return [pa.int16(), *(m[c.type] for c in schema.columns)]


def _from_spark(t: ColumnType) -> Any:
    """Arrow value (as Spark hands it to a writer) -> the core's value type."""
    if t is ColumnType.NUMERIC:
        return Decimal
    if t is ColumnType.JSONB:
        return json.loads
    if t is ColumnType.TIMESTAMPTZ:
        # the session runs in UTC; Spark hands timestamps over without a zone
        return lambda v: v if v.tzinfo is not None else v.replace(tzinfo=dt.UTC)
    return None


@dataclass
class VnodeReads(InputPartition):  # type: ignore[misc]
    index: int


class StoreDataSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return spark_ddl(TablePlan.from_text(self.options["plan"]).upstream_schema)

    def reader(self, schema: Any) -> DataSourceReader:
        return SnapshotReader(self.options["plan"])

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return MvWriter(self.options["plan"], self.options["summary"])


class SnapshotReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, plan: str) -> None:
        self.plan_text = plan

    def partitions(self) -> list[InputPartition]:
        return [VnodeReads(i) for i in range(len(TablePlan.from_text(self.plan_text).partitions))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The partition's reads as one ``COPY ... TO STDOUT (FORMAT csv)``, parsed by
        Arrow's CSV reader as it streams in: no Python step per row."""
        import psycopg2
        from psycopg2 import sql

        from state_store.versioned import VersionedTable

        plan = TablePlan.from_text(self.plan_text)
        up = VersionedTable(plan.upstream_table, plan.upstream_schema)
        reads = [(v, plan.pk_from_json(a), n) for v, a, n in plan.partitions[partition.index]]
        if not reads:
            return
        conn = psycopg2.connect(worker_dsn(plan.write.dsn))
        try:
            with conn.cursor() as cur:
                # one process per branch keeps each vnode's rows in pk order
                cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
                # the key index gives the order: past a position the planner would sort
                # each vnode's whole rest to return one limited read (VersionedTable)
                cur.execute("SET LOCAL enable_sort = off")
                q, params = up.snapshot_reads_query(plan.read_epoch, reads, as_text=True)
                # COPY takes no parameters: the driver quotes our own positions
                copy = sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv)").format(
                    sql.SQL(cur.mogrify(q, params).decode())
                )
                yield from _stream_csv(cur, copy, plan.upstream_schema)
        finally:
            conn.close()


def _stream_csv(cur: Any, copy: Any, schema: TableSchema) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    types = _arrow_types(schema)
    names = ["_vnode", *schema.names]
    wire = list(types)
    for i, c in enumerate(schema.columns):
        if c.type is ColumnType.TIMESTAMPTZ:
            wire[i + 1] = pa.timestamp("us")  # UTC wall time on the wire
        elif c.type is ColumnType.BYTEA:
            wire[i + 1] = pa.string()  # \x hex on the wire
    bytea = [i + 1 for i, c in enumerate(schema.columns) if c.type is ColumnType.BYTEA]
    read_opts = pacsv.ReadOptions(column_names=names, block_size=4 << 20)
    convert_opts = pacsv.ConvertOptions(
        column_types=dict(zip(names, wire, strict=True)),
        true_values=["t"],
        false_values=["f"],
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )
    r, w = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(w, "wb") as sink:
                cur.copy_expert(copy, sink)
        except BaseException as e:  # surfaced by the consumer below
            failure.append(e)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        with os.fdopen(r, "rb") as source:
            # no bytes, no rows: pyarrow refuses an empty CSV (a producer's error is below)
            reader = (
                pacsv.open_csv(source, read_options=read_opts, convert_options=convert_opts)
                if source.peek(1)
                else ()
            )
            for batch in reader:
                cols = list(batch.columns)
                for i in bytea:
                    cols[i] = pa.array(
                        [None if v is None else bytes.fromhex(v[2:]) for v in cols[i].to_pylist()],
                        type=pa.binary(),
                    )
                yield _canonical(pa.RecordBatch.from_arrays(cols, names=names), types)
    finally:
        producer.join()
    if failure:
        raise failure[0]


@dataclass
class VnodeSummary(WriterCommitMessage):  # type: ignore[misc]
    rows: dict[int, tuple[int, Any]]  # vnode -> (rows read, last pk as JSON)
    written: int


class MvWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, plan: str, summary: str) -> None:
        self.plan_text = plan
        self.summary_path = summary

    def write(self, iterator: Iterator[Any]) -> VnodeSummary:
        import psycopg2
        import pyarrow.compute as pc

        from spark_workers.arrow_view import compile_arrow_filter, mv_copy_csv
        from state_store.versioned import VersionedTable

        plan = TablePlan.from_text(self.plan_text)
        schema = plan.upstream_schema
        types = _arrow_types(schema)
        fixes = {i: f for i, c in enumerate(schema.columns) if (f := _from_spark(c.type))}
        write = plan.write
        keep = compile_arrow_filter(write.filter, schema, fixes)
        mv = VersionedTable(write.mv_table, write.mv_schema)
        pk_cols = [schema.index_of(n) + 1 for n in schema.primary_key]
        pk_types = schema.pk_types
        counts: dict[int, int] = {}
        last: dict[int, list[Any]] = {}
        written = 0
        conn: Any = None
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                if conn is None:  # an empty partition (a warm-up) needs no connection
                    conn = psycopg2.connect(worker_dsn(write.dsn))
                    fence_task(conn.cursor(), write.graph_id, write.recovery_seq)
                with conn.cursor() as cur:
                    batch = _canonical(batch, types)
                    # rows come in (vnode, pk) order: each vnode's run ends at its last pk
                    runs = pc.run_end_encode(batch.column(0))
                    start = 0
                    for v, end in zip(
                        runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True
                    ):
                        counts[v] = counts.get(v, 0) + end - start
                        key = []
                        for k, t in zip(pk_cols, pk_types, strict=True):
                            x = batch.column(k)[end - 1].as_py()
                            f = fixes.get(k - 1)
                            key.append(value_to_json(t, f(x) if f and x is not None else x))
                        last[v] = key
                        start = end
                    kept = batch if keep is None else batch.filter(keep(batch))
                    if kept.num_rows:
                        mv.write_csv(
                            cur, mv_copy_csv(kept, schema, write.mv_schema, write.write_epoch)
                        )
                        written += kept.num_rows
            if conn is not None:
                conn.commit()
        finally:
            if conn is not None:
                conn.close()
        return VnodeSummary({v: (n, last[v]) for v, n in counts.items()}, written)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows: dict[int, Any] = {}
        written = 0
        for m in messages:
            if isinstance(m, VnodeSummary):
                rows.update(m.rows)
                written += m.written
        tmp = self.summary_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"vnodes": {str(v): r for v, r in rows.items()}, "written": written}, f)
        os.replace(tmp, self.summary_path)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # the rows written at the open epoch go with the recovery that this failure causes
        pass


def _canonical(batch: Any, types: list[Any]) -> Any:
    """Spark may hand over other Arrow types than the reader produced (timestamps
    without their zone, for one); cast back to the reader's types."""
    import pyarrow as pa

    if all(c.type == t for c, t in zip(batch.columns, types, strict=True)):
        return batch
    cols = [c if c.type == t else c.cast(t) for c, t in zip(batch.columns, types, strict=True)]
    return pa.RecordBatch.from_arrays(cols, names=batch.schema.names)


def fence_task(cur: Any, graph_id: int, recovery_seq: int) -> None:
    """As the driver path: no rows from an actor incarnation a recovery superseded."""
    cur.execute("SELECT recovery_seq FROM graphs WHERE id = %s FOR SHARE", [graph_id])
    row = cur.fetchone()
    if row is None or row[0] != recovery_seq:
        raise fenced_off(graph_id)


class FencedOff(RuntimeError):
    """A Spark task's fence found its graph recovered. It reaches the driver as text
    only (through Py4J), so the driver does not parse it: it looks at the graph itself
    (``Worker._recovered_graph``)."""


def fenced_off(graph_id: int) -> FencedOff:
    return FencedOff(f"graph {graph_id} recovered past this write; the task stops")
