"""A view's filter as a SQL condition, for running the view inside Postgres.

The condition keeps ``backfill_core.view``'s semantics exactly (two-valued: a
comparison with NULL is false and ``not`` negates that; doubles compare as Python's
floats, NaN above nothing; text in code point order), which
``tests/integration/test_view_sql.py`` checks against the core's predicate on random
rows and expression trees in a real Postgres. The tree is validated by the core's own
``compile_filter`` first; column names become quoted identifiers and constants
driver-quoted literals of the column's type: no client text becomes SQL.

jsonb leaves have no SQL form here (jsonb equality is not Python's equality of the
parsed values): ``filter_sql`` answers None and the caller moves the rows through the
workers instead.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from backfill_core.schema import ColumnType, TableSchema, coerce_value
from backfill_core.view import COMPARE_OPS, compile_filter

_NOT_PUSHABLE = (ColumnType.JSONB,)


class _Unpushable(Exception):
    pass


def filter_sql(expr: Any, schema: TableSchema, alias: str) -> sql.Composable | None:
    """The filter as a boolean SQL expression over ``alias``'s columns (never NULL);
    TRUE without a filter; None when the filter has no SQL form."""
    if expr is None:
        return sql.SQL("TRUE")
    compile_filter(expr, schema)  # the same validation, the same errors
    try:
        return _node(expr, schema, alias)
    except _Unpushable:
        return None


def _node(e: Any, schema: TableSchema, alias: str) -> sql.Composable:
    for key, joiner in (("and", " AND "), ("or", " OR ")):
        if key in e:
            parts = [_node(x, schema, alias) for x in e[key]]
            return sql.SQL("({})").format(sql.SQL(joiner).join(parts))
    if "not" in e:
        return sql.SQL("(NOT {})").format(_node(e["not"], schema, alias))
    return _leaf(e, schema, alias)


def _leaf(e: Any, schema: TableSchema, alias: str) -> sql.Composable:
    name, op = e["col"], e["op"]
    t = schema.column(name).type
    if t in _NOT_PUSHABLE:
        raise _Unpushable(name)
    col = sql.Identifier(alias, name)
    if op == "is_null":
        return sql.SQL("({} IS NULL)").format(col)
    if t is ColumnType.TEXT:
        # code point order, as Python compares str (UTF-8 bytes sort that way)
        col = sql.SQL('{} COLLATE "C"').format(col)
    typed = sql.SQL("text" if t is ColumnType.TEXT else t.sql)  # a cast takes no collation
    if op == "in":
        values = [coerce_value(t, v) for v in e["value"]]
        array = sql.SQL("{}::{}[]").format(sql.Literal(values), typed)
        return sql.SQL("({0} IS NOT NULL AND {0} = ANY({1}))").format(col, array)
    assert op in COMPARE_OPS
    const = sql.SQL("{}::{}").format(sql.Literal(coerce_value(t, e["value"])), typed)
    if t is ColumnType.DOUBLE and op in (">", ">="):
        # Postgres orders NaN above every number, Python compares nothing true with it
        # but != (filter constants are finite, so only these two part ways)
        return sql.SQL("({0} IS NOT NULL AND {0} <> 'NaN' AND {0} {2} {1})").format(
            col, const, sql.SQL(op)
        )
    return sql.SQL("({0} IS NOT NULL AND {0} {2} {1})").format(
        col, const, sql.SQL("<>" if op == "!=" else op)
    )
