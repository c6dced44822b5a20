"""The view's filter on Arrow batches, and MV rows as COPY (CSV) data, without a
Python step per row where Arrow's kernels can do the work.

The filter keeps ``backfill_core.view``'s semantics exactly (two-valued: a comparison
with NULL is false, ``not`` negates that): ``tests/unit/test_arrow_view.py`` checks
both against each other on random rows and random expression trees. Leaves whose
type Arrow cannot compare exactly (numeric beyond 38 digits, jsonb equality) are
evaluated with the core's own predicate on that one column.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from backfill_core.schema import ColumnType, TableSchema, coerce_value
from backfill_core.view import COMPARE, compile_filter

Mask = Callable[[pa.RecordBatch], pa.Array]

_VECTOR_TYPES = {
    ColumnType.SMALLINT,
    ColumnType.INT,
    ColumnType.BIGINT,
    ColumnType.DOUBLE,
    ColumnType.TEXT,
    ColumnType.BOOLEAN,
    ColumnType.DATE,
    ColumnType.TIMESTAMP,
    ColumnType.TIMESTAMPTZ,
}
_ARROW_OPS = {
    "=": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def compile_arrow_filter(
    expr: Any, schema: TableSchema, from_arrow: dict[int, Callable[[Any], Any]]
) -> Mask | None:
    """A function batch -> boolean mask (no nulls); None when there is no filter.

    Column ``i`` of the schema is column ``i + 1`` of the batch (``_vnode`` first);
    ``from_arrow`` converts an Arrow value of a column to the core's type where they
    differ (numeric and jsonb travel as text).
    """
    if expr is None:
        return None
    compile_filter(expr, schema)  # the same validation, the same errors

    def build(e: Any) -> Mask:
        if "and" in e or "or" in e:
            parts = [build(x) for x in e.get("and", e.get("or"))]
            combine = pc.and_ if "and" in e else pc.or_

            def junction(b: pa.RecordBatch) -> pa.Array:
                out = parts[0](b)
                for p in parts[1:]:
                    out = combine(out, p(b))
                return out

            return junction
        if "not" in e:
            inner = build(e["not"])
            return lambda b: pc.invert(inner(b))
        return _leaf(e, schema, from_arrow)

    return build(expr)


def _leaf(e: Any, schema: TableSchema, from_arrow: dict[int, Callable[[Any], Any]]) -> Mask:
    i = schema.index_of(e["col"])
    t = schema.column(e["col"]).type
    op = e["op"]
    if op == "is_null":
        return lambda b: pc.is_null(b.column(i + 1))
    if t not in _VECTOR_TYPES:
        return _row_leaf(e, i, t, from_arrow.get(i))
    if op == "in":
        values = [coerce_value(t, v) for v in e["value"]]

        def member(b: pa.RecordBatch) -> pa.Array:
            # equality, not hashing: -0.0 is in [0.0], as in Python and SQL
            col = b.column(i + 1)
            out = pc.equal(col, pa.scalar(values[0], type=col.type))
            for v in values[1:]:
                out = pc.or_(out, pc.equal(col, pa.scalar(v, type=col.type)))
            return pc.fill_null(out, False)

        return member
    fn = _ARROW_OPS[op]
    value = coerce_value(t, e["value"])

    def compare(b: pa.RecordBatch) -> pa.Array:
        col = b.column(i + 1)
        return pc.fill_null(fn(col, pa.scalar(value, type=col.type)), False)

    return compare


def _row_leaf(e: Any, i: int, t: ColumnType, convert: Callable[[Any], Any] | None) -> Mask:
    conv = convert or (lambda v: v)
    if e["op"] == "in":
        allowed = [coerce_value(t, v) for v in e["value"]]

        def test(v: Any) -> bool:
            return v is not None and conv(v) in allowed
    else:
        c = coerce_value(t, e["value"])
        cmp = COMPARE[e["op"]]

        def test(v: Any) -> bool:
            return v is not None and cmp(conv(v), c)

    return lambda b: pa.array([test(v) for v in b.column(i + 1).to_pylist()], type=pa.bool_())


def mv_copy_csv(batch: pa.RecordBatch, upstream: TableSchema, mv: TableSchema, epoch: int) -> bytes:
    """The batch's rows (already filtered) as CSV in the MV's storage column order:
    ``_vnode, <pk>, _epoch, _deleted, <values>``. The MV's vnode is the upstream's (the
    projection keeps the distribution key, a part of the primary key)."""
    n = batch.num_rows
    cols: list[pa.Array] = [batch.column(0)]
    names = ["_vnode"]
    pk = list(mv.primary_key)
    values = [c.name for c in mv.value_columns]
    for name in pk:
        cols.append(_csv_ready(batch.column(upstream.index_of(name) + 1), mv.column(name).type))
        names.append(name)
    cols.append(pa.array([epoch] * n, type=pa.int64()) if n else pa.array([], pa.int64()))
    cols.append(pa.array([False] * n, type=pa.bool_()) if n else pa.array([], pa.bool_()))
    names += ["_epoch", "_deleted"]
    for name in values:
        cols.append(_csv_ready(batch.column(upstream.index_of(name) + 1), mv.column(name).type))
        names.append(name)
    buf = io.BytesIO()
    pacsv.write_csv(
        pa.RecordBatch.from_arrays(cols, names=names),
        buf,
        pacsv.WriteOptions(include_header=False, quoting_style="needed"),
    )
    return buf.getvalue()


def _csv_ready(col: pa.Array, t: ColumnType) -> pa.Array:
    if t is ColumnType.BYTEA:
        # Postgres reads bytea as hex text
        return pa.array(
            [None if v is None else "\\x" + v.hex() for v in col.to_pylist()], type=pa.string()
        )
    return col


__all__ = ["compile_arrow_filter", "mv_copy_csv"]
