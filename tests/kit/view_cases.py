"""Random rows of every column type and random filter trees over them, for the tests
that check a filter's other forms (Arrow kernels, SQL) against the core's predicate."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from backfill_core.schema import Column, ColumnType, TableSchema

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


def json_const(t: ColumnType, v: Any) -> Any:
    if t in (T.DATE, T.TIMESTAMP, T.TIMESTAMPTZ):
        return v.isoformat()
    if t is T.NUMERIC:
        return str(v)
    return v


rows = st.lists(
    st.tuples(*[st.one_of(st.none(), _values(c.type)) for c in SCHEMA.columns]), max_size=12
)


@st.composite
def leaf(draw: Any, jsonb: bool = True) -> dict[str, Any]:
    c = draw(st.sampled_from([c for c in SCHEMA.columns[1:] if jsonb or c.type is not T.JSONB]))
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
            "value": [json_const(c.type, v) for v in draw(st.lists(vals, min_size=1, max_size=3))],
        }
    return {"col": c.name, "op": op, "value": json_const(c.type, draw(vals))}


def filter_trees(jsonb: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    """Filter trees over ``SCHEMA``; ``jsonb=False`` leaves jsonb columns out."""
    return st.recursive(
        leaf(jsonb),
        lambda inner: st.one_of(
            st.builds(lambda xs: {"and": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda xs: {"or": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda x: {"not": x}, inner),
        ),
        max_leaves=6,
    )


filters = filter_trees()
