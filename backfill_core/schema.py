"""Table schemas: column types, identifier rules and value coercion from and to JSON.

Values are validated here before anything reaches the database, so that a rejected
request writes nothing, and so that the reference models order keys exactly as the
store does (text keys compare bytewise: the store uses the "C" collation).
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

IDENTIFIER_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
MAX_IDENTIFIER_LEN = 63
DEFAULT_VNODE_COUNT = 256
MAX_VNODE_COUNT = 32768
# Postgres's numeric: digits before and after the decimal point
NUMERIC_MAX_INTEGER_DIGITS = 131_072
NUMERIC_MAX_SCALE = 16_383
MAX_JSON_DEPTH = 100

INT_BOUNDS = {
    "smallint": (-(2**15), 2**15 - 1),
    "int": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}


class SchemaError(ValueError):
    """A schema or a value does not fit; ``path`` names where (e.g. ``columns[2].type``)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path


class ColumnType(StrEnum):
    SMALLINT = "smallint"
    INT = "int"
    BIGINT = "bigint"
    DOUBLE = "double"
    NUMERIC = "numeric"
    TEXT = "text"
    BOOLEAN = "boolean"
    DATE = "date"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    JSONB = "jsonb"
    BYTEA = "bytea"

    @property
    def sql(self) -> str:
        return _SQL_TYPES[self]

    @property
    def keyable(self) -> bool:
        """Whether the type may be part of a primary or distribution key."""
        return self not in (ColumnType.JSONB, ColumnType.DOUBLE)


_SQL_TYPES = {
    ColumnType.SMALLINT: "smallint",
    ColumnType.INT: "integer",
    ColumnType.BIGINT: "bigint",
    ColumnType.DOUBLE: "double precision",
    ColumnType.NUMERIC: "numeric",
    ColumnType.TEXT: 'text COLLATE "C"',
    ColumnType.BOOLEAN: "boolean",
    ColumnType.DATE: "date",
    ColumnType.TIMESTAMP: "timestamp without time zone",
    ColumnType.TIMESTAMPTZ: "timestamp with time zone",
    ColumnType.JSONB: "jsonb",
    ColumnType.BYTEA: "bytea",
}

TYPE_ALIASES = {
    "integer": ColumnType.INT,
    "int4": ColumnType.INT,
    "int2": ColumnType.SMALLINT,
    "int8": ColumnType.BIGINT,
    "float8": ColumnType.DOUBLE,
    "double precision": ColumnType.DOUBLE,
    "decimal": ColumnType.NUMERIC,
    "bool": ColumnType.BOOLEAN,
    "varchar": ColumnType.TEXT,
    "string": ColumnType.TEXT,
}


def parse_type(name: str) -> ColumnType:
    key = name.strip().lower()
    if key in TYPE_ALIASES:
        return TYPE_ALIASES[key]
    try:
        return ColumnType(key)
    except ValueError:
        allowed = ", ".join(t.value for t in ColumnType)
        raise SchemaError(f"unknown column type {name!r}; expected one of: {allowed}") from None


def is_identifier(name: object, *, allow_internal: bool = False) -> bool:
    try:
        validate_identifier(name, allow_internal=allow_internal)
    except SchemaError:
        return False
    return True


def validate_identifier(name: object, what: str = "name", *, allow_internal: bool = False) -> str:
    """Names are lower-case ASCII identifiers; they are still always quoted in SQL."""
    if not isinstance(name, str):
        raise SchemaError(f"{what} must be a string")
    candidate = name[1:] if allow_internal and name.startswith("_") else name
    if not IDENTIFIER_RE.fullmatch(candidate) or len(name) > MAX_IDENTIFIER_LEN:
        raise SchemaError(
            f"invalid {what} {name!r}: use 1 to {MAX_IDENTIFIER_LEN} characters, "
            "a lower-case letter first, then lower-case letters, digits or '_'"
        )
    return name


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type.value, "nullable": self.nullable}


@dataclass(frozen=True)
class TableSchema:
    """Columns, primary key and distribution key of a versioned table."""

    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    distribution_key: tuple[str, ...]
    vnode_count: int = DEFAULT_VNODE_COUNT
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    # per column (name, coercer, nullable), so that ``coerce_row`` (run for every DML row)
    # looks nothing up per value
    _coercers: tuple[tuple[str, Any, bool], ...] = field(default=(), compare=False, repr=False)

    _insert_coercer: Callable[[object], tuple[Any, ...]] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        self._index.update({c.name: i for i, c in enumerate(self.columns)})
        coercers = tuple((c.name, _COERCE[c.type], c.nullable) for c in self.columns)
        object.__setattr__(self, "_coercers", coercers)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as its definition: the coercers (closures, compiled code) are rebuilt
        return (
            type(self),
            (self.columns, self.primary_key, self.distribution_key, self.vnode_count),
        )

    @classmethod
    def build(
        cls,
        columns: Sequence[Column],
        primary_key: Sequence[str],
        distribution_key: Sequence[str] | None = None,
        vnode_count: int = DEFAULT_VNODE_COUNT,
        *,
        allow_internal: bool = False,
    ) -> TableSchema:
        if not columns:
            raise SchemaError("a table needs at least one column", "columns")
        seen: set[str] = set()
        for i, col in enumerate(columns):
            try:
                validate_identifier(col.name, "column name", allow_internal=allow_internal)
            except SchemaError as e:
                raise SchemaError(e.message, f"columns[{i}].name") from None
            if col.name in seen:
                raise SchemaError(f"duplicate column {col.name!r}", f"columns[{i}].name")
            seen.add(col.name)
        by_name = {c.name: c for c in columns}
        pk = _check_key(primary_key, by_name, "primary_key")
        dk = _check_key(distribution_key or pk, by_name, "distribution_key")
        if not set(dk) <= set(pk):
            raise SchemaError(
                "the distribution key must be a subset of the primary key", "distribution_key"
            )
        if not 1 <= vnode_count <= MAX_VNODE_COUNT:
            raise SchemaError(f"vnode_count must be in 1..{MAX_VNODE_COUNT}", "vnode_count")
        # key columns are never null
        cols = tuple(Column(c.name, c.type, c.nullable and c.name not in pk) for c in columns)
        return cls(cols, pk, dk, vnode_count)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        return self.columns[self._index[name]]

    def has(self, name: str) -> bool:
        return name in self._index

    def index_of(self, name: str) -> int:
        return self._index[name]

    @property
    def pk_types(self) -> tuple[ColumnType, ...]:
        return tuple(self.column(n).type for n in self.primary_key)

    @property
    def dist_types(self) -> tuple[ColumnType, ...]:
        return tuple(self.column(n).type for n in self.distribution_key)

    @property
    def value_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.name not in self.primary_key)

    def project(self, names: Sequence[str]) -> TableSchema:
        """The schema of a projection that keeps the primary key."""
        cols = [self.column(n) for n in names]
        return TableSchema.build(
            cols, self.primary_key, self.distribution_key, self.vnode_count, allow_internal=True
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": [c.to_json() for c in self.columns],
            "primary_key": list(self.primary_key),
            "distribution_key": list(self.distribution_key),
            "vnode_count": self.vnode_count,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableSchema:
        cols = [
            Column(c["name"], parse_type(c["type"]), bool(c.get("nullable", True)))
            for c in data["columns"]
        ]
        return cls.build(
            cols,
            data["primary_key"],
            data.get("distribution_key"),
            int(data.get("vnode_count", DEFAULT_VNODE_COUNT)),
            allow_internal=True,
        )

    # rows -----------------------------------------------------------------

    def coerce_row(self, raw: object, *, full: bool = True) -> dict[str, Any]:
        """Validate a JSON row; ``full`` requires every non-nullable column."""
        if not isinstance(raw, Mapping):
            raise SchemaError("a row must be a JSON object")
        if not raw.keys() <= self._index.keys():
            unknown = [k for k in raw if k not in self._index]
            raise SchemaError(f"unknown column(s): {', '.join(map(repr, sorted(unknown)))}")
        out: dict[str, Any] = {}
        for name, coerce, nullable in self._coercers:
            if name in raw:
                value = raw[name]
                if value is not None:
                    try:
                        value = coerce(value)
                    except (TypeError, ValueError, InvalidOperation, OverflowError):
                        value = coerce_value(self.column(name).type, value, name)  # its error
                if value is None and not nullable:
                    raise SchemaError(f"column {name!r} must not be null")
                out[name] = value
            elif full and not nullable:
                raise SchemaError(f"missing value for column {name!r}")
            elif full:
                out[name] = None
        return out

    def insert_coercer(self) -> Callable[[object], tuple[Any, ...]]:
        """``coerce_row(raw, full=True)`` compiled for this schema (built once), giving the
        row's values in column order (a row as the store takes it): the usual values (an
        int in range, a float, a string of plain text, a bool) are checked inline;
        anything else, and every error, goes through ``coerce_row`` itself."""
        built = self._insert_coercer
        if built is None:
            built = _compile_insert_coercer(self)
            object.__setattr__(self, "_insert_coercer", built)
        return built

    def coerce_key(self, raw: object) -> tuple[Any, ...]:
        """A primary key given as a JSON object or list, validated and typed."""
        if isinstance(raw, Mapping):
            missing = [n for n in self.primary_key if n not in raw]
            if missing:
                raise SchemaError(f"missing key column(s): {', '.join(missing)}")
            values = [raw[n] for n in self.primary_key]
        elif isinstance(raw, list | tuple) and len(raw) == len(self.primary_key):
            values = list(raw)
        else:
            raise SchemaError("a key must be an object or a list with every primary-key column")
        key = tuple(
            coerce_value(self.column(n).type, v, n)
            for n, v in zip(self.primary_key, values, strict=True)
        )
        if any(v is None for v in key):
            raise SchemaError("key columns must not be null")
        return key

    def pk_of(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(row[n] for n in self.primary_key)

    def dist_of(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(row[n] for n in self.distribution_key)

    def row_to_json(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {c.name: value_to_json(c.type, row.get(c.name)) for c in self.columns}


def _check_key(
    key: Sequence[str] | None, by_name: Mapping[str, Column], what: str
) -> tuple[str, ...]:
    if not key:
        raise SchemaError(f"{what} must name at least one column", what)
    if isinstance(key, str):
        raise SchemaError(f"{what} must be a list of column names", what)
    out = []
    for i, name in enumerate(key):
        if name not in by_name:
            raise SchemaError(f"{what} names unknown column {name!r}", f"{what}[{i}]")
        if name in out:
            raise SchemaError(f"{what} repeats column {name!r}", f"{what}[{i}]")
        if not by_name[name].type.keyable:
            raise SchemaError(
                f"column {name!r} of type {by_name[name].type.value} cannot be in a key",
                f"{what}[{i}]",
            )
        out.append(name)
    return tuple(out)


def coerce_value(t: ColumnType, v: object, name: str = "value") -> Any:
    """JSON value -> typed Python value for column type ``t`` (None stays None)."""
    if v is None:
        return None
    try:
        return _COERCE[t](v)
    except (TypeError, ValueError, InvalidOperation, OverflowError) as e:
        detail = f": {e}" if str(e) else ""
        raise SchemaError(f"bad value for column {name!r} of type {t.value}{detail}") from None


_FINITE_CHECK = "type({v}) is float and -_INF < {v} < _INF and {v} != 0"


def _fast_check(t: ColumnType, v: str) -> str | None:
    """Python that is true when value ``v`` of type ``t`` needs no coercion at all."""
    if t in (ColumnType.SMALLINT, ColumnType.INT, ColumnType.BIGINT):
        lo, hi = INT_BOUNDS[t.value]
        return f"type({v}) is int and {lo} <= {v} <= {hi}"
    if t is ColumnType.DOUBLE:
        return _FINITE_CHECK.format(v=v)  # NaN fails both comparisons; 0 becomes 0.0
    if t is ColumnType.TEXT:
        # ASCII holds no lone surrogate; NUL is checked
        return f"type({v}) is str and {v}.isascii() and '\\x00' not in {v}"
    if t is ColumnType.BOOLEAN:
        return f"type({v}) is bool"
    return None


def _compile_insert_coercer(schema: TableSchema) -> Callable[[object], tuple[Any, ...]]:
    def slow(raw: object) -> tuple[Any, ...]:
        return tuple(schema.coerce_row(raw, full=True).values())  # every column, in order

    env: dict[str, Any] = {"_slow": slow, "_known": schema._index.keys(), "_M": object()}
    env["_INF"] = math.inf
    env["_dict"] = dict
    lines = [
        "def coerce(raw):",
        "    if type(raw) is not _dict or not raw.keys() <= _known:",
        "        return _slow(raw)",
    ]
    for i, col in enumerate(schema.columns):
        v = f"v{i}"
        env[f"_c{i}"] = _COERCE[col.type]
        check = _fast_check(col.type, v)
        lines.append(f"    {v} = raw.get({col.name!r}, _M)")
        if col.nullable:
            lines.append(f"    if {v} is _M or {v} is None:")
            lines.append(f"        {v} = None")
        else:
            lines.append(f"    if {v} is _M or {v} is None:")
            lines.append("        return _slow(raw)")
        if check is not None:
            lines.append(f"    elif not ({check}):")
        else:
            lines.append("    else:")
        lines.append("        try:")
        lines.append(f"            {v} = _c{i}({v})")
        lines.append("        except Exception:")
        lines.append("            return _slow(raw)")
    lines.append(f"    return ({''.join(f'v{i}, ' for i in range(len(schema.columns)))})")
    exec(compile("\n".join(lines), "<insert-coercer>", "exec"), env)  # noqa: S102 - names only
    fn: Callable[[object], tuple[Any, ...]] = env["coerce"]
    return fn


def _int(t: str) -> Any:
    lo, hi = INT_BOUNDS[t]

    def f(v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise TypeError(f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise ValueError(f"{v} is out of range for {t}")
        return v

    return f


def _double(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"expected a number, got {type(v).__name__}")
    f = float(v)
    if math.isnan(f) or math.isinf(f):
        raise ValueError("NaN and infinity are not accepted")
    return 0.0 if f == 0 else f


def _numeric(v: object) -> Decimal:
    if isinstance(v, bool):
        raise TypeError("expected a number or a decimal string")
    if isinstance(v, int | str):
        d = Decimal(v)
    elif isinstance(v, float):
        d = Decimal(repr(v))
    elif isinstance(v, Decimal):
        d = v
    else:
        raise TypeError("expected a number or a decimal string")
    if not d.is_finite():
        raise ValueError("NaN and infinity are not accepted")
    exponent = d.as_tuple().exponent
    assert isinstance(exponent, int)  # finite
    if d and d.adjusted() >= NUMERIC_MAX_INTEGER_DIGITS:
        raise ValueError(f"at most {NUMERIC_MAX_INTEGER_DIGITS} digits before the decimal point")
    if -exponent > NUMERIC_MAX_SCALE:
        raise ValueError(f"at most {NUMERIC_MAX_SCALE} digits after the decimal point")
    return d if d or exponent <= 0 else Decimal(0)


def _text(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    if "\x00" in v:
        raise ValueError("text cannot contain the NUL character")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return v


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"expected true or false, got {type(v).__name__}")
    return v


def _date(v: object) -> dt.date:
    if isinstance(v, dt.datetime):
        raise TypeError("expected a date")
    if isinstance(v, dt.date):
        return v
    if not isinstance(v, str):
        raise TypeError("expected an ISO date string")
    return dt.date.fromisoformat(v)


def _timestamp(v: object) -> dt.datetime:
    d = v if isinstance(v, dt.datetime) else dt.datetime.fromisoformat(_iso(v))
    if d.tzinfo is not None:
        raise ValueError("timestamp takes no time zone (use timestamptz)")
    return d


def _timestamptz(v: object) -> dt.datetime:
    d = v if isinstance(v, dt.datetime) else dt.datetime.fromisoformat(_iso(v))
    if d.tzinfo is None:
        raise ValueError("timestamptz needs a UTC offset, e.g. 2024-01-01T00:00:00Z")
    return d.astimezone(dt.UTC)


def _iso(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError("expected an ISO 8601 string")
    return v


def _jsonb(v: object) -> Any:
    """Postgres's jsonb holds no NaN, no NUL character and no lone surrogate."""
    todo: list[tuple[object, int]] = [(v, 0)]
    while todo:
        x, depth = todo.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
            raise ValueError("NaN and infinity are not JSON")
        if isinstance(x, str):
            _text(x)
        elif isinstance(x, dict):
            for k, item in x.items():
                _text(k)
                todo.append((item, depth + 1))
        elif isinstance(x, list | tuple):
            todo.extend((item, depth + 1) for item in x)
    return v


def _bytea(v: object) -> bytes:
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v)
    if not isinstance(v, str):
        raise TypeError("expected a base64 string")
    return base64.b64decode(v, validate=True)


_COERCE: dict[ColumnType, Any] = {
    ColumnType.SMALLINT: _int("smallint"),
    ColumnType.INT: _int("int"),
    ColumnType.BIGINT: _int("bigint"),
    ColumnType.DOUBLE: _double,
    ColumnType.NUMERIC: _numeric,
    ColumnType.TEXT: _text,
    ColumnType.BOOLEAN: _bool,
    ColumnType.DATE: _date,
    ColumnType.TIMESTAMP: _timestamp,
    ColumnType.TIMESTAMPTZ: _timestamptz,
    ColumnType.JSONB: _jsonb,
    ColumnType.BYTEA: _bytea,
}


def value_to_json(t: ColumnType, v: Any) -> Any:
    """Typed value -> JSON value (numeric as a string, to keep its precision)."""
    if v is None:
        return None
    if t is ColumnType.NUMERIC:
        return str(v)
    if t is ColumnType.DOUBLE:
        return float(v)
    if t in (ColumnType.DATE, ColumnType.TIMESTAMP):
        return v.isoformat()
    if t is ColumnType.TIMESTAMPTZ:
        return v.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if t is ColumnType.BYTEA:
        return base64.b64encode(bytes(v)).decode("ascii")
    return v
