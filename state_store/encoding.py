"""Values to Postgres COPY text format, and driver values back to typed Python values."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from backfill_core.schema import ColumnType

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
NULL = "\\N"


def _text(v: Any) -> str:
    s = str(v)
    # most text needs no escaping, and four substring scans cost less than a translate
    if "\\" in s or "\t" in s or "\n" in s or "\r" in s:
        return s.translate(_ESCAPES)
    return s


def _json(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False).translate(_ESCAPES)


def _bytea(v: Any) -> str:
    return "\\\\x" + bytes(v).hex()


def _iso(v: Any) -> str:
    return str(v.isoformat())


_ENCODERS: dict[ColumnType, Callable[[Any], str]] = {
    ColumnType.SMALLINT: str,
    ColumnType.INT: str,
    ColumnType.BIGINT: str,
    ColumnType.DOUBLE: repr,
    ColumnType.NUMERIC: str,
    ColumnType.TEXT: _text,
    ColumnType.BOOLEAN: lambda v: "t" if v else "f",
    ColumnType.DATE: _iso,
    ColumnType.TIMESTAMP: _iso,
    ColumnType.TIMESTAMPTZ: _iso,
    ColumnType.JSONB: _json,
    ColumnType.BYTEA: _bytea,
}


def copy_encoders(types: Sequence[ColumnType]) -> list[Callable[[Any], str]]:
    return [_ENCODERS[t] for t in types]


def copy_line(encoders: Sequence[Callable[[Any], str]], values: Sequence[Any]) -> str:
    return (
        "\t".join(NULL if v is None else enc(v) for enc, v in zip(encoders, values, strict=True))
        + "\n"
    )


def _from_db_bytea(v: Any) -> bytes:
    return bytes(v)


# psycopg2 already returns Decimal for numeric and aware datetimes for timestamptz
# (equal and hashing alike whatever their zone); only bytea needs a conversion
_DECODERS: dict[ColumnType, Callable[[Any], Any]] = {ColumnType.BYTEA: _from_db_bytea}


def row_decoder(types: Sequence[ColumnType]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """Normalise what the driver returns (memoryview, tz) into the core's value types."""
    fixes = [(i, _DECODERS[t]) for i, t in enumerate(types) if t in _DECODERS]
    if not fixes:
        return tuple

    def decode(row: Sequence[Any]) -> tuple[Any, ...]:
        out = list(row)
        for i, f in fixes:
            if out[i] is not None:
                out[i] = f(out[i])
        return tuple(out)

    return decode


_INLINE = {
    ColumnType.SMALLINT: "{{{}}}",
    ColumnType.INT: "{{{}}}",
    ColumnType.BIGINT: "{{{}}}",
    ColumnType.DOUBLE: "{{{}!r}}",
}


def line_formatter(
    key_types: Sequence[ColumnType], value_types: Sequence[ColumnType], value_idx: Sequence[int]
) -> Callable[[int, Sequence[Any], str, Sequence[Any]], str]:
    """A function ``(vnode, key, middle, row) -> COPY line`` compiled for one schema.

    Writing is the hot path: a generated f-string avoids a Python call per integer
    value and a loop per row. Key values are never NULL; value columns may be.
    """
    env: dict[str, Any] = {"NULL": NULL}
    parts = ["{vnode}"]
    for i, t in enumerate(key_types):
        expr = f"k[{i}]"
        if t in _INLINE:
            parts.append(_INLINE[t].format(expr))
        else:
            env[f"e{i}"] = _ENCODERS[t]
            parts.append(f"{{e{i}({expr})}}")
    parts[-1] += "{middle}"
    for j, (t, idx) in enumerate(zip(value_types, value_idx, strict=True)):
        if t in _INLINE:  # formatted as ``str`` (a float's str is its repr)
            parts.append(f"{{NULL if (x{j} := r[{idx}]) is None else x{j}}}")
            continue
        env[f"v{j}"] = _ENCODERS[t]
        parts.append(f"{{NULL if (x{j} := r[{idx}]) is None else v{j}(x{j})}}")
    body = "\\t".join(parts)
    code = f'def fmt(vnode, k, middle, r):\n    return f"{body}\\n"\n'
    exec(compile(code, "<copy-line>", "exec"), env)  # noqa: S102 - generated from types only
    fmt: Callable[[int, Sequence[Any], str, Sequence[Any]], str] = env["fmt"]
    return fmt
