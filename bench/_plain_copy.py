"""The "without us" baseline for MV creation: a plain PySpark copy job, as a user with
PySpark 4 and no backfill service would write it against the same server.

A small Python Data Source (format ``plain_pg_copy``): the reader splits the source
table into primary-key ranges, one Spark partition each, and streams every range out
with ``COPY (SELECT ...) TO STDOUT (FORMAT csv)`` parsed by Arrow; the writer (an Arrow
writer) sends each partition's batches back with ``COPY ... FROM STDIN (FORMAT csv)``
into a plain table and commits once per partition. It is the same technique as the
service's own Spark path (COPY csv <-> Arrow, no Python step per row) without versions,
vnodes, epochs, barriers or progress, so the ratio is the price of those.

Why not Spark's JDBC reader and writer: the embedded Postgres listens on a unix socket
only, which the JDBC driver cannot reach (``bench_spark_path`` compares JDBC reads where
a TCP server and the jar exist).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

FORMAT = "plain_pg_copy"


@dataclass
class KeyRange(InputPartition):  # type: ignore[misc]
    lo: int
    hi: int


@dataclass
class Written(WriterCommitMessage):  # type: ignore[misc]
    rows: int


class PlainCopySource(DataSource):  # type: ignore[misc]
    """Options: ``spec``, JSON with dsn, source, target, ddl (Spark schema), arrow
    (the columns' Arrow type names, in order), key and ranges ([lo, hi) of the key)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return str(json.loads(self.options["spec"])["ddl"])

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(json.loads(self.options["spec"]))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return _Writer(json.loads(self.options["spec"]))


class _Reader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def partitions(self) -> list[InputPartition]:
        return [KeyRange(lo, hi) for lo, hi in self.spec["ranges"]]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import psycopg2
        import pyarrow as pa
        import pyarrow.csv as pacsv

        s = self.spec
        names = list(s["arrow"])
        cols = ", ".join(names)
        query = (
            f"COPY (SELECT {cols} FROM {s['source']} WHERE {s['key']} >= {int(partition.lo)} "
            f"AND {s['key']} < {int(partition.hi)}) TO STDOUT WITH (FORMAT csv)"
        )
        buf = io.BytesIO()
        conn = psycopg2.connect(s["dsn"])
        try:
            conn.cursor().copy_expert(query, buf)
        finally:
            conn.close()
        if not buf.getbuffer().nbytes:
            return
        buf.seek(0)
        table = pacsv.read_csv(
            buf,
            read_options=pacsv.ReadOptions(column_names=names),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.type_for_alias(t) for c, t in s["arrow"].items()},
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
        yield from table.to_batches(max_chunksize=100_000)


class _Writer(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def write(self, iterator: Iterator[Any]) -> Written:
        import psycopg2
        import pyarrow.csv as pacsv

        s = self.spec
        rows = 0
        conn: Any = None
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                if conn is None:
                    conn = psycopg2.connect(s["dsn"])
                buf = io.BytesIO()
                pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
                buf.seek(0)
                copy = f"COPY {s['target']} ({', '.join(s['arrow'])}) FROM STDIN WITH (FORMAT csv)"
                conn.cursor().copy_expert(copy, buf)
                rows += batch.num_rows
            if conn is not None:
                conn.commit()
        finally:
            if conn is not None:
                conn.close()
        return Written(rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


def spark_copy(spec: dict[str, Any]) -> float:
    """Seconds for one copy job with ``spec``, in a process of its own: a Spark driver
    JVM of Spark's defaults, not one started with the worker's options
    (``WORKER_JAVA_OPTIONS``), which a session in this process would share."""
    out = subprocess.run(
        [sys.executable, "-m", "bench._plain_copy", json.dumps(spec)],
        cwd=Path(__file__).resolve().parents[1],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def _spark_copy_here(spec: dict[str, Any]) -> float:
    """``spark_copy`` in this process. A Spark application, like the service's worker, is
    long-lived: the session and its Python workers are warmed first with a copy of a few
    rows per partition, which are then truncated."""
    import psycopg2
    from pyspark import cloudpickle

    import bench._plain_copy as me
    from spark_workers.spark_path import build_session

    # Spark's Python workers cannot import ``bench``: ship this module's code by value
    cloudpickle.register_pickle_by_value(me)
    spark = build_session("local[*]")
    try:
        spark.dataSource.register(PlainCopySource)
        _copy(spark, dict(spec, ranges=[[lo, min(hi, lo + 100)] for lo, hi in spec["ranges"]]))
        conn = psycopg2.connect(spec["dsn"])
        try:
            conn.cursor().execute(f"TRUNCATE {spec['target']}")
            conn.commit()
        finally:
            conn.close()
        t0 = time.perf_counter()
        _copy(spark, spec)
        return time.perf_counter() - t0
    finally:
        spark.stop()


def _copy(spark: Any, spec: dict[str, Any]) -> None:
    text = json.dumps(spec)
    df = spark.read.format(FORMAT).option("spec", text).load()
    df.write.format(FORMAT).option("spec", text).mode("append").save()


if __name__ == "__main__":
    print(_spark_copy_here(json.loads(sys.argv[1])))
