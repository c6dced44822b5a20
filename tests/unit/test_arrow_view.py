"""The Arrow filter of the Spark path agrees with the core's row predicate."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings

from backfill_core.view import View
from spark_workers.arrow_view import compile_arrow_filter, mv_copy_csv
from spark_workers.datasource import _arrow_types, _from_spark
from tests.kit.view_cases import SCHEMA, filters, rows


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
