"""The view an MV keeps: a projection plus an optional filter of the upstream rows.

The filter is a JSON expression tree, validated against the upstream schema and
evaluated here (by the workers and by the reference models alike); it never becomes
SQL text::

    {"and": [e, ...]}  {"or": [e, ...]}  {"not": e}
    {"col": "amount", "op": ">=", "value": 10}     ops: = != < <= > >= in is_null
    {"col": "region", "op": "in", "value": ["eu", "us"]}
    {"col": "note", "op": "is_null"}

Comparisons follow SQL: a comparison with a NULL column value is not true.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backfill_core.changes import Op, Row, RowChange
from backfill_core.schema import ColumnType, SchemaError, TableSchema, coerce_value, is_identifier

Predicate = Callable[[Row], bool]
COMPARE_OPS = ("=", "!=", "<", "<=", ">", ">=")
MAX_DEPTH = 32
MAX_NODES = 1000


def compile_filter(expr: Any, schema: TableSchema) -> Predicate:
    """Validate ``expr`` against ``schema``; raise SchemaError naming the bad part."""
    return _compile(expr, schema)


def check_filter_shape(expr: Any) -> None:
    """Validate what of ``expr`` does not depend on a schema (the nodes, their keys, the
    ops, a value given where one is wanted); raise SchemaError naming the bad part. The
    API checks this much when it parses a request (``service.api.rules``)."""
    _compile(expr, None)


def _compile(expr: Any, schema: TableSchema | None) -> Predicate:
    count = [0]

    def build(e: Any, path: str, depth: int) -> Predicate:
        count[0] += 1
        if depth > MAX_DEPTH or count[0] > MAX_NODES:
            raise SchemaError("the filter is too large or too deeply nested", path)
        if not isinstance(e, Mapping):
            raise SchemaError("each filter node must be an object", path)
        if "and" in e or "or" in e:
            key = "and" if "and" in e else "or"
            if len(e) != 1 or not isinstance(e[key], list) or not e[key]:
                raise SchemaError(f'"{key}" takes a non-empty list and nothing else', path)
            parts = [build(x, f"{path}.{key}[{i}]", depth + 1) for i, x in enumerate(e[key])]
            if key == "and":
                return lambda r: all(p(r) for p in parts)
            return lambda r: any(p(r) for p in parts)
        if "not" in e:
            if len(e) != 1:
                raise SchemaError('"not" takes one expression and nothing else', path)
            inner = build(e["not"], f"{path}.not", depth + 1)
            return lambda r: not inner(r)
        return _leaf(e, schema, path)

    return build(expr, "filter", 0)


def _leaf(e: Mapping[str, Any], schema: TableSchema | None, path: str) -> Predicate:
    extra = set(e) - {"col", "op", "value"}
    if extra:
        raise SchemaError(f"unknown key(s) {sorted(extra)} in a comparison", path)
    col, op = e.get("col"), e.get("op")
    known = schema.has(col) if schema is not None and isinstance(col, str) else None
    if not is_identifier(col, allow_internal=True) or known is False:
        raise SchemaError(f"unknown column {col!r}", f"{path}.col")
    assert isinstance(col, str)
    i = schema.index_of(col) if schema is not None else 0
    t = schema.column(col).type if schema is not None else None
    if op == "is_null":
        if "value" in e:
            raise SchemaError('"is_null" takes no value', path)
        return lambda r: r[i] is None
    if op == "in":
        values = e.get("value")
        if not isinstance(values, list) or not values:
            raise SchemaError('"in" takes a non-empty list of values', f"{path}.value")
        allowed = [_const(t, v, f"{path}.value[{k}]") for k, v in enumerate(values)]
        return lambda r: r[i] is not None and r[i] in allowed
    if op not in COMPARE_OPS:
        raise SchemaError(
            f"unknown op {op!r}; expected one of {', '.join(COMPARE_OPS)}, in, is_null",
            f"{path}.op",
        )
    if t is ColumnType.JSONB and op not in ("=", "!="):
        raise SchemaError("jsonb columns only compare with = and !=", f"{path}.op")
    c = _const(t, e.get("value"), f"{path}.value")
    cmp = COMPARE[op]
    return lambda r: r[i] is not None and cmp(r[i], c)


def _const(t: ColumnType | None, v: Any, path: str) -> Any:
    if v is None:
        raise SchemaError("compare with null using is_null", path)
    if t is None:  # no schema: any other value may be right
        return v
    try:
        return coerce_value(t, v)
    except SchemaError as err:
        raise SchemaError(err.message, path) from None


COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


@dataclass(frozen=True)
class View:
    """Maps upstream rows and changes to the MV's rows and changes."""

    upstream: TableSchema
    columns: tuple[str, ...]
    predicate: Predicate | None

    @classmethod
    def build(cls, upstream: TableSchema, columns: Sequence[str], filter_expr: Any = None) -> View:
        seen = set()
        for k, c in enumerate(columns):
            if not upstream.has(c):
                raise SchemaError(f"unknown column {c!r}", f"columns[{k}]")
            if c in seen:
                raise SchemaError(f"column {c!r} appears twice", f"columns[{k}]")
            seen.add(c)
        missing = [c for c in upstream.primary_key if c not in seen]
        if missing:
            raise SchemaError(
                f"the columns must include the upstream primary key; missing: {', '.join(missing)}",
                "columns",
            )
        pred = compile_filter(filter_expr, upstream) if filter_expr is not None else None
        return cls(upstream, tuple(columns), pred)

    @property
    def schema(self) -> TableSchema:
        """The MV's schema: the projection, keyed and distributed like the upstream."""
        return self.upstream.project(self.columns)

    def _idx(self) -> list[int]:
        return [self.upstream.index_of(c) for c in self.columns]

    def keeps(self, row: Row) -> bool:
        return self.predicate is None or self.predicate(row)

    def project(self, row: Row) -> Row:
        return tuple(row[i] for i in self._idx())

    def rows(self, rows: Sequence[Row]) -> list[Row]:
        idx = self._idx()
        pred = self.predicate
        return [tuple(r[i] for i in idx) for r in rows if pred is None or pred(r)]

    def change(self, c: RowChange) -> RowChange | None:
        """An upstream change as a change of the MV (None when the view does not see it)."""
        old_in = c.old is not None and self.keeps(c.old)
        new_in = c.new is not None and self.keeps(c.new)
        if old_in and new_in:
            return RowChange(Op.UPDATE, c.vnode, self.project(c.old), self.project(c.new))  # type: ignore[arg-type]
        if new_in:
            return RowChange(Op.INSERT, c.vnode, None, self.project(c.new))  # type: ignore[arg-type]
        if old_in:
            return RowChange(Op.DELETE, c.vnode, self.project(c.old), None)  # type: ignore[arg-type]
        return None
