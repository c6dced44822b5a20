"""The Arrow filter of the Spark path agrees with the core's row predicate."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill_core.schema import Column, ColumnType, TableSchema
from backfill_core.view import View
from spark_workers.arrow_view import compile_arrow_filter, mv_copy_csv
from spark_workers.datasource import _arrow_types, _from_spark

T = ColumnType
SCHEMA = TableSchema.build(
    [
        Column("id", T.BIGINT, False),
        Column("i", T.INT),
        Column("s", T.SMALLINT),
        Column("d", T.DOUBLE),
        Column("t", T.TEXT),
        Column("b", T.BOOLEAN),
        Column("day", T.DATE),
        Column("ts", T.TIMESTAMP),
        Column("tz", T.TIMESTAMPTZ),
        Column("n", T.NUMERIC),
        Column("j", T.JSONB),
    ],
    ["id"],
)
UTC = dt.UTC


def _values(t: ColumnType) -> st.SearchStrategy[Any]:
    return {
        T.BIGINT: st.integers(-5, 5),
        T.INT: st.integers(-3, 3),
        T.SMALLINT: st.integers(-3, 3),
        T.DOUBLE: st.sampled_from([0.0, -0.0, 1.5, -2.25, float("inf"), float("nan"), 1e300]),
        T.TEXT: st.sampled_from(["", "a", "ab", "b", "é", "Z", "\t"]),
        T.BOOLEAN: st.booleans(),
        T.DATE: st.dates(dt.date(2024, 1, 1), dt.date(2024, 1, 4)),
        T.TIMESTAMP: st.datetimes(dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 3)),
        T.TIMESTAMPTZ: st.datetimes(
            dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 3), timezones=st.just(UTC)
        ),
        T.NUMERIC: st.sampled_from(
            [Decimal("1"), Decimal("1.00"), Decimal("-3.5"), Decimal("1" + "0" * 45 + ".5")]
        ),
        T.JSONB: st.sampled_from([{"a": 1}, [1, 2], "x", 3, None, {"a": [True]}]),
    }[t]


def _json_const(t: ColumnType, v: Any) -> Any:
    if t in (T.DATE, T.TIMESTAMP, T.TIMESTAMPTZ):
        return v.isoformat()
    if t is T.NUMERIC:
        return str(v)
    return v


rows = st.lists(
    st.tuples(*[st.one_of(st.none(), _values(c.type)) for c in SCHEMA.columns]), max_size=12
)


@st.composite
def leaf(draw: Any) -> dict[str, Any]:
    c = draw(st.sampled_from(SCHEMA.columns[1:]))
    if c.type is T.JSONB:
        ops = ["=", "!=", "in", "is_null"]
        vals = st.sampled_from([{"a": 1}, [1, 2], "x", 3])
    else:
        ops = ["=", "!=", "<", "<=", ">", ">=", "in", "is_null"]
        vals = _values(c.type)
        if c.type is T.DOUBLE:  # filters take finite numbers only
            vals = st.sampled_from([0.0, -0.0, 1.5, -2.25, 1e300])
    op = draw(st.sampled_from(ops))
    if op == "is_null":
        return {"col": c.name, "op": op}
    if op == "in":
        return {
            "col": c.name,
            "op": "in",
            "value": [_json_const(c.type, v) for v in draw(st.lists(vals, min_size=1, max_size=3))],
        }
    return {"col": c.name, "op": op, "value": _json_const(c.type, draw(vals))}


filters = st.recursive(
    leaf(),
    lambda inner: st.one_of(
        st.builds(lambda xs: {"and": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda xs: {"or": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda x: {"not": x}, inner),
    ),
    max_leaves=6,
)


def to_batch(data: list[tuple[Any, ...]]) -> pa.RecordBatch:
    types = _arrow_types(SCHEMA)
    cols: list[list[Any]] = [[0] * len(data)] + [[r[i] for r in data] for i in range(11)]
    n, j = SCHEMA.index_of("n") + 1, SCHEMA.index_of("j") + 1
    cols[n] = [None if v is None else str(v) for v in cols[n]]
    cols[j] = [None if v is None else json.dumps(v) for v in cols[j]]
    arrays = [pa.array(c, type=t) for c, t in zip(cols, types, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=["_vnode", *SCHEMA.names])


CONVERT = {i: f for i, c in enumerate(SCHEMA.columns) if (f := _from_spark(c.type))}


@settings(max_examples=400, deadline=None)
@given(data=rows, expr=filters)
def test_the_arrow_filter_keeps_exactly_the_rows_the_view_keeps(
    data: list[tuple[Any, ...]], expr: dict[str, Any]
) -> None:
    # jsonb NULL in the row model is SQL NULL; a JSON null is not representable here
    view = View.build(SCHEMA, SCHEMA.names, expr)
    mask = compile_arrow_filter(expr, SCHEMA, CONVERT)
    assert mask is not None
    got = mask(to_batch(data)).to_pylist()
    assert got == [view.keeps(r) for r in data], expr


def test_no_filter_is_no_mask() -> None:
    assert compile_arrow_filter(None, SCHEMA, CONVERT) is None


def test_csv_rows_carry_the_storage_layout() -> None:
    mv = SCHEMA.project(["id", "t", "b"])
    batch = to_batch([(7, None, None, None, 'x,"y"\n', True, None, None, None, None, None)])
    text = mv_copy_csv(batch, SCHEMA, mv, 65536).decode()
    assert text == '0,7,65536,false,"x,""y""\n",true\n'
