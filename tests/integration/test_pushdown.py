"""A pushed-down read writes exactly the view of the rows the same reads return, and
sums them up as the executor would (rows read and last key per vnode): random
histories, reads (each with its own limit, or under one limit of them all),
filters and projections, one and two key columns, and keys the MV already holds at the
write epoch (the upsert retry)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType, TableSchema
from backfill_core.view import View
from state_store.pushdown import PREPARED_PER_CONNECTION, write_view
from state_store.versioned import VersionedTable
from state_store.view_sql import filter_sql

pytestmark = pytest.mark.db
T = ColumnType
VALUES = [Column("d", T.DOUBLE), Column("t", T.TEXT), Column("n", T.NUMERIC)]
SCHEMAS = {
    "one key": TableSchema.build([Column("id", T.BIGINT, False), *VALUES], ["id"], vnode_count=8),
    "two keys": TableSchema.build(
        [Column("a", T.INT, False), Column("b", T.TEXT, False), *VALUES],
        ["a", "b"],
        distribution_key=["a"],
        vnode_count=8,
    ),
}
FILTERS = [
    None,
    {"col": "d", "op": ">", "value": 0},
    {"or": [{"col": "t", "op": "is_null"}, {"not": {"col": "t", "op": "<", "value": "m"}}]},
    {"col": "n", "op": "in", "value": ["1.5", "2"]},
    # the driver formats "%" in a statement it is given parameters for: a constant with
    # one must reach the server as it is
    {"or": [{"col": "t", "op": "=", "value": "%s"}, {"col": "t", "op": ">=", "value": "m%"}]},
]
E1, E2, WRITE = 1 << 16, 2 << 16, 3 << 16
_names = itertools.count()


def _row(schema: TableSchema, k: int, d: float | None, t: str | None) -> tuple[Any, ...]:
    from decimal import Decimal

    n = None if d is None else Decimal(k % 3) / 2 + 1
    key = (k,) if len(schema.primary_key) == 1 else (k % 5, f"k{k:03d}")
    return (*key, d, t, n)


cases = st.fixed_dictionaries(
    {
        "schema": st.sampled_from(sorted(SCHEMAS)),
        "first": st.lists(
            st.tuples(
                st.integers(0, 40),
                st.one_of(st.none(), st.floats(-2, 2)),
                st.text("am z", max_size=2),
            ),
            max_size=40,
        ),
        "second": st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=15),
        "reads": st.lists(
            st.tuples(
                st.integers(0, 7), st.one_of(st.none(), st.integers(0, 40)), st.integers(1, 9)
            ),
            max_size=8,
            unique_by=lambda r: r[0],
        ),
        "filter": st.sampled_from(range(len(FILTERS))),
        "columns": st.sampled_from([("d",), ("t", "n"), ("d", "t", "n"), ()]),
        "held": st.lists(st.integers(0, 40), max_size=5),
        # a batch read: the reads under one limit of them all
        "batch_limit": st.one_of(st.none(), st.integers(1, 30)),
    }
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases)
def test_a_pushed_down_read_writes_the_view_of_what_it_read(
    conn: Any, case: dict[str, Any]
) -> None:
    schema = SCHEMAS[case["schema"]]
    n = next(_names)
    upstream = VersionedTable(f"push_up_{n}", schema)
    columns = [*schema.primary_key, *case["columns"]]
    view = View.build(schema, columns, FILTERS[case["filter"]])
    mv = VersionedTable(f"push_mv_{n}", view.schema)
    try:
        with conn.cursor() as cur:
            upstream.create(cur)
            mv.create(cur)
            upstream.write(cur, E1, [Version(_row(schema, k, d, t)) for k, d, t in case["first"]])
            upstream.write(
                cur,
                E2,
                [Version(_row(schema, k, 1.0, "x"), deleted=gone) for k, gone in case["second"]],
            )
            # rows the MV already holds at the write epoch: the read's rows replace them
            held = [view.project(_row(schema, k, -9.0, "held")) for k in case["held"]]
            mv.write(cur, WRITE, [Version(r) for r in held])
            reads = [
                (v, None if after is None else upstream.key_of(_row(schema, after, 0, "")), limit)
                for v, after, limit in case["reads"]
            ]
            batch_limit = case["batch_limit"]
            if batch_limit is None:
                read = upstream.snapshot_reads(cur, E2, reads)
            else:
                # the order write_view's padding runs them in (a plain Append's), for
                # snapshot_multi to read the same rows
                reads = sorted(reads, key=lambda r: r[1] is None)
                reads = [(v, after, batch_limit) for v, after, _ in reads]
                read = upstream.snapshot_multi(cur, E2, [(v, a) for v, a, _ in reads], batch_limit)
            where = filter_sql(FILTERS[case["filter"]], schema, "r")
            assert where is not None
            summary = write_view(cur, upstream, mv, E2, reads, where, WRITE, limit=batch_limit)

            expected_summary: dict[int, tuple[int, Any]] = {}
            for v, row in read:
                count = expected_summary.get(v, (0, None))[0]
                expected_summary[v] = (count + 1, upstream.key_of(row))
            assert summary == expected_summary
            expected = {mv.key_of(r): r for r in held}
            expected.update({mv.key_of(r): r for r in view.rows([row for _, row in read])})
            got = mv.snapshot(cur, WRITE, (0, 8))
            assert {mv.key_of(r): r for _, r in got} == expected
            assert len(got) == len(expected)
    finally:
        conn.rollback()


def test_successive_reads_of_one_shape_share_one_prepared_statement(conn: Any) -> None:
    """A backfill reads the same vnodes epoch after epoch: the statement is prepared once
    per shape of reads (vnodes with and without a position), then executed with each
    read's positions and limits; the view ends up whole."""
    schema = SCHEMAS["one key"]
    upstream = VersionedTable("push_up_successive", schema)
    view = View.build(schema, ["id", "t"], {"col": "t", "op": "!=", "value": "50%"})
    mv = VersionedTable("push_mv_successive", view.schema)
    where = filter_sql({"col": "t", "op": "!=", "value": "50%"}, schema, "r")
    assert where is not None
    rows = [_row(schema, k, 1.0, "50%" if k % 4 == 0 else "x") for k in range(200)]
    try:
        with conn.cursor() as cur:
            upstream.create(cur)
            mv.create(cur)
            upstream.write(cur, E1, [Version(r) for r in rows])
            cur.execute("SELECT count(*) FROM pg_prepared_statements")
            before = cur.fetchone()[0]
            after: dict[int, Any] = {v: None for v in range(8)}
            done: set[int] = set()
            rounds = 0
            while len(done) < 8:
                rounds += 1
                reads = [(v, after[v], 2) for v in range(8) if v not in done]
                summary = write_view(cur, upstream, mv, E1, reads, where, WRITE + rounds)
                for v, _, _ in reads:
                    if v in summary:
                        after[v] = summary[v][1]
                    else:
                        done.add(v)
            cur.execute("SELECT count(*) FROM pg_prepared_statements")
            # the first round's shape, then one per power of two of vnodes still reading
            # (8, 4, 2, 1), whatever the number of rounds
            assert cur.fetchone()[0] - before <= 5 < rounds
            got = mv.snapshot(cur, WRITE + rounds, (0, 8))
            assert sorted(r for _, r in got) == sorted(view.rows(rows))
            assert len(got) == 150
    finally:
        conn.rollback()


def test_prepared_statements_beyond_the_bound_are_deallocated(conn: Any) -> None:
    schema = SCHEMAS["one key"]
    upstream = VersionedTable("push_up_bound", schema)
    where = filter_sql(None, schema, "r")
    assert where is not None
    try:
        with conn.cursor() as cur:
            upstream.create(cur)
            upstream.write(cur, E1, [Version(_row(schema, k, 1.0, "x")) for k in range(50)])
            for n in range(PREPARED_PER_CONNECTION + 5):
                mv = VersionedTable(f"push_mv_bound_{n}", View.build(schema, ["id"], None).schema)
                mv.create(cur)
                summary = write_view(cur, upstream, mv, E1, [(n % 8, None, 3)], where, WRITE)
                assert sum(count for count, _ in summary.values()) <= 3
                assert len(mv.snapshot(cur, WRITE, (0, 8))) == sum(
                    count for count, _ in summary.values()
                )
            cur.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'backfill_write_view_%'"
            )
            assert cur.fetchone()[0] == PREPARED_PER_CONNECTION
    finally:
        conn.rollback()
