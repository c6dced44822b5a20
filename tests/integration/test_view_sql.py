"""The SQL form of a view's filter keeps exactly the rows the core's predicate keeps,
evaluated by a real Postgres on random rows (NULLs, NaN and infinite doubles, text out
of ASCII, zones) and random expression trees."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg2
import pytest
from hypothesis import HealthCheck, given, settings
from psycopg2 import sql
from psycopg2.extras import Json, execute_values

from backfill_core.schema import ColumnType
from backfill_core.view import View
from service.db import Database
from state_store.view_sql import filter_sql
from tests.kit.view_cases import SCHEMA, filter_trees, filters, json_const, rows

pytestmark = pytest.mark.db
TABLE = "view_sql_rows"


@pytest.fixture(scope="module")
def cur(pg_server_url: str) -> Iterator[Any]:
    db = Database(pg_server_url)
    conn = psycopg2.connect(db.libpq_url)
    conn.autocommit = True  # an example's error must not abort the next one's statements
    with conn.cursor() as c:
        cols = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(col.name), sql.SQL(col.type.sql))
            for col in SCHEMA.columns
        )
        c.execute(sql.SQL("CREATE TEMP TABLE {} ({})").format(sql.Identifier(TABLE), cols))
        yield c
    conn.close()
    db.close()


def _kept_by_postgres(cur: Any, data: list[tuple[Any, ...]], where: sql.Composable) -> list[bool]:
    cur.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    jsonb = SCHEMA.index_of("j")
    stored = [
        (i, *r[1:jsonb], None if r[jsonb] is None else Json(r[jsonb]), *r[jsonb + 1 :])
        for i, r in enumerate(data)
    ]
    if stored:
        execute_values(
            cur, sql.SQL("INSERT INTO {} VALUES %s").format(sql.Identifier(TABLE)), stored
        )
    cur.execute(sql.SQL("SELECT {} FROM {} AS r ORDER BY id").format(where, sql.Identifier(TABLE)))
    return [bool(x) for (x,) in cur.fetchall()]


def _has_jsonb_leaf(e: Any) -> bool:
    if "and" in e or "or" in e:
        return any(_has_jsonb_leaf(x) for x in e.get("and", e.get("or")))
    if "not" in e:
        return _has_jsonb_leaf(e["not"])
    return bool(SCHEMA.column(e["col"]).type is ColumnType.JSONB)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=rows, expr=filter_trees(jsonb=False))
def test_the_sql_filter_keeps_exactly_the_rows_the_view_keeps(
    cur: Any, data: list[tuple[Any, ...]], expr: dict[str, Any]
) -> None:
    data = [(i, *r[1:]) for i, r in enumerate(data)]
    view = View.build(SCHEMA, SCHEMA.names, expr)
    where = filter_sql(expr, SCHEMA, "r")
    assert where is not None
    assert _kept_by_postgres(cur, data, where) == [view.keeps(r) for r in data], expr


T = ColumnType
UTC = dt.UTC
# every leaf over these values is checked: where SQL and Python part ways (NaN, signed
# zero, infinities, code point order, zones, numerics of equal value and other scale)
EDGES: dict[ColumnType, list[Any]] = {
    T.BIGINT: [-(2**63), -5, 0, 5, 2**63 - 1],
    T.INT: [-3, 0, 3],
    T.SMALLINT: [-3, 0, 3],
    T.DOUBLE: [0.0, -0.0, 1.5, -2.25, 1e300, float("inf"), float("-inf"), float("nan")],
    T.TEXT: ["", "a", "ab", "b", "B", "Z", "é", "e\u0301", "ß", "\t", "😀", "\uffff"],
    T.BOOLEAN: [False, True],
    T.DATE: [dt.date(2024, 1, 1), dt.date(2024, 1, 2)],
    T.TIMESTAMP: [dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 0, 1)],
    T.TIMESTAMPTZ: [
        dt.datetime(2024, 1, 1, tzinfo=UTC),
        dt.datetime(2024, 1, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        dt.datetime(2024, 1, 1, 1, tzinfo=UTC),
    ],
    T.NUMERIC: [Decimal("1"), Decimal("1.00"), Decimal("-3.5"), Decimal("1" + "0" * 45 + ".5")],
}


def _finite(v: Any) -> bool:
    return not isinstance(v, float) or v - v == 0


@pytest.mark.parametrize("name", [c.name for c in SCHEMA.columns[1:] if c.type is not T.JSONB])
def test_every_leaf_over_edge_values(cur: Any, name: str) -> None:
    t = SCHEMA.column(name).type
    values = EDGES[t]
    consts = [json_const(t, v) for v in values if _finite(v)]  # filters take finite numbers
    leaves: list[dict[str, Any]] = [{"col": name, "op": "is_null"}]
    for c in consts:
        leaves += [{"col": name, "op": op, "value": c} for op in ("=", "!=", "<", "<=", ">", ">=")]
        leaves += [
            {"col": name, "op": "in", "value": [c]},
            {"col": name, "op": "in", "value": consts},
        ]
    i = SCHEMA.index_of(name)
    data = [
        (k, *[v if j == i else None for j in range(1, 11)]) for k, v in enumerate([*values, None])
    ]
    for leaf in leaves:
        where = filter_sql(leaf, SCHEMA, "r")
        assert where is not None
        view = View.build(SCHEMA, SCHEMA.names, leaf)
        assert _kept_by_postgres(cur, data, where) == [view.keeps(r) for r in data], leaf


@settings(max_examples=100, deadline=None)
@given(expr=filters)
def test_only_jsonb_leaves_have_no_sql_form(expr: dict[str, Any]) -> None:
    assert (filter_sql(expr, SCHEMA, "r") is None) == _has_jsonb_leaf(expr)


def test_no_filter_keeps_every_row(cur: Any) -> None:
    assert _kept_by_postgres(cur, [(0, *[None] * 10)], filter_sql(None, SCHEMA, "r")) == [True]  # type: ignore[arg-type]


def test_constants_are_literals_not_sql(cur: Any) -> None:
    hostile = "x'; DROP TABLE view_sql_rows; --"
    where = filter_sql({"col": "t", "op": "in", "value": [hostile, "a"]}, SCHEMA, "r")
    assert where is not None
    row = (0, None, None, None, hostile, *[None] * 6)
    assert _kept_by_postgres(cur, [row], where) == [True]
