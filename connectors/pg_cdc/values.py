"""Upstream column types -> ours, and the upstream's text form of a value -> our Python
value. Both the stream (pgoutput sends text) and the chunk reads (which select
``column::text``) go through ``parse_text``, so a row read either way is the same
tuple. The sessions that produce the text use ``SESSION_OPTIONS``."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

from backfill_core.schema import ColumnType, SchemaError, coerce_value

from .errors import UnsupportedValue

__all__ = ["SESSION_OPTIONS", "TYPES", "parse_text"]

# how every upstream session of ours prints values: ISO dates, UTC, hex bytea, UTF-8
SESSION_OPTIONS: Final = (
    "-c DateStyle=ISO,YMD -c TimeZone=UTC -c IntervalStyle=postgres "
    "-c bytea_output=hex -c extra_float_digits=3 -c client_encoding=UTF8"
)

# upstream type (pg_type.typname, schema pg_catalog) -> ours. Left out on purpose:
# float4 (its values are not our double's), char(n) (blank-padded comparisons), json
# (keeps duplicate keys and whitespace), uuid, arrays, domains, enums and the rest.
TYPES: Final[dict[str, ColumnType]] = {
    "int2": ColumnType.SMALLINT,
    "int4": ColumnType.INT,
    "int8": ColumnType.BIGINT,
    "float8": ColumnType.DOUBLE,
    "numeric": ColumnType.NUMERIC,
    "text": ColumnType.TEXT,
    "varchar": ColumnType.TEXT,
    "bool": ColumnType.BOOLEAN,
    "date": ColumnType.DATE,
    "timestamp": ColumnType.TIMESTAMP,
    "timestamptz": ColumnType.TIMESTAMPTZ,
    "jsonb": ColumnType.JSONB,
    "bytea": ColumnType.BYTEA,
}


def _bool(s: str) -> bool:
    # 't'/'f' from the type's output function (the stream), 'true'/'false' from its
    # cast to text (the chunk reads)
    if s not in ("t", "f", "true", "false"):
        raise ValueError(f"not a boolean: {s!r}")
    return s in ("t", "true")


def _bytea(s: str) -> bytes:
    if not s.startswith("\\x"):
        raise ValueError("bytea not in hex format")
    return bytes.fromhex(s[2:])


_PARSE: Final[dict[ColumnType, Callable[[str], Any]]] = {
    ColumnType.SMALLINT: int,
    ColumnType.INT: int,
    ColumnType.BIGINT: int,
    ColumnType.DOUBLE: float,
    ColumnType.NUMERIC: Decimal,
    ColumnType.TEXT: str,
    ColumnType.BOOLEAN: _bool,
    ColumnType.DATE: dt.date.fromisoformat,
    ColumnType.TIMESTAMP: dt.datetime.fromisoformat,
    ColumnType.TIMESTAMPTZ: dt.datetime.fromisoformat,
    ColumnType.JSONB: json.loads,
    ColumnType.BYTEA: _bytea,
}


def parse_text(t: ColumnType, raw: bytes | str | None, column: str = "value") -> Any:
    """The upstream's text output of a ``t`` value (with ``SESSION_OPTIONS``) as our
    value, validated as our schemas validate it; None stays None."""
    if raw is None:
        return None
    s = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    try:
        return coerce_value(t, _PARSE[t](s), column)
    except (ValueError, TypeError, SchemaError) as e:
        # infinity and BC dates, NaN, years past 9999: not values of ours
        raise UnsupportedValue(f"column {column!r}: {s[:80]!r} is not a {t.value} of ours") from e
