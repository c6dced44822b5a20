"""The versioned store agrees with the in-memory model on random histories.

Random writes (inserts, updates, deletes, several writes of a key in one epoch, several
batches in one epoch), rollbacks and garbage collections; after every step the
snapshot at every readable epoch (and its live keys), paginated reads, and the change
log of every epoch above the GC horizon are compared with the model.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType, TableSchema
from state_store.versioned import VersionedTable
from tests.kit.store_model import StoreModel

SCHEMA = TableSchema.build(
    [
        Column("a", ColumnType.INT),
        Column("b", ColumnType.TEXT),
        Column("v", ColumnType.BIGINT),
        Column("w", ColumnType.TEXT),
    ],
    primary_key=["a", "b"],
    distribution_key=["a"],
    vnode_count=8,
)
_names = itertools.count()

TEXTS = ["", "a", "B", "ab", "é", "z\t"]
EVERY_KEY = [(a, b) for a in range(7) for b in TEXTS]
keys = st.tuples(st.integers(0, 6), st.sampled_from(TEXTS))
versions = st.lists(
    st.tuples(
        keys,
        st.booleans(),
        st.integers(-5, 5),
        st.one_of(
            st.none(),
            st.text(
                st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=3
            ),
        ),
    ),
    min_size=1,
    max_size=12,
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), versions),
        st.tuples(st.just("write_same_epoch"), versions),
        st.tuples(st.just("rollback"), st.integers(0, 10)),
        st.tuples(st.just("gc"), st.integers(0, 10)),
    ),
    min_size=1,
    max_size=14,
)


def assert_batch(got: list[Any], per_vnode: dict[int, list[Any]], limit: int) -> None:
    """A batch read under one shared limit: Postgres promises no order of its branches,
    so each vnode's rows are a key-ordered prefix of that vnode's, ``limit`` in all (or
    every row when fewer)."""
    assert len(got) == min(limit, sum(len(rows) for rows in per_vnode.values()))
    for v, rows in per_vnode.items():
        mine = [(w, r) for w, r in got if w == v]
        assert mine == rows[: len(mine)], f"vnode {v} is not a prefix of its rows"
    assert {w for w, _ in got} <= set(per_vnode)


def _to_versions(raw: list[tuple[tuple[int, str], bool, int, str | None]]) -> list[Version]:
    return [Version((a, b, v, w), deleted) for (a, b), deleted, v, w in raw]


def _check(
    cur: Any, table: VersionedTable, model: StoreModel, epochs: list[int], gc_epoch: int
) -> None:
    vnodes = [table.vnode_of_key(k) for k in EVERY_KEY]
    for e in epochs:
        if e >= gc_epoch:
            assert table.snapshot(cur, e, (0, 8)) == model.snapshot(e), f"snapshot at {e}"
            live = {table.key_of(r) for _, r in model.snapshot(e)}
            assert table.live_keys(cur, e, EVERY_KEY, vnodes) == live, f"live keys at {e}"
        if e > gc_epoch:
            assert table.change_log(cur, e, (0, 8)) == model.change_log(e), f"change log of {e}"
    if epochs:
        e = epochs[-1]
        # pagination: small pages joined up give the whole snapshot, also per vnode
        pages: list[tuple[int, Any]] = []
        after = None
        while True:
            page = table.snapshot(cur, e, (0, 8), after=after, limit=3)
            pages += page
            if len(page) < 3:
                break
            after = (page[-1][0], table.key_of(page[-1][1]))
        assert pages == model.snapshot(e)
        # a batch read over vnodes in order equals the per-vnode reads it stands for
        starts = [(v, None) for v in range(8)]
        per_vnode = {v: table.snapshot(cur, e, (v, v + 1)) for v in range(8)}
        for limit in (1, 4, 1000):
            assert_batch(table.snapshot_multi(cur, e, starts, limit), per_vnode, limit)
        if pages:
            mid_v, mid_row = pages[len(pages) // 2]
            starts = [(mid_v, table.key_of(mid_row))] + [(v, None) for v in range(mid_v + 1, 8)]
            rest = table.snapshot(cur, e, (0, 8), after=(mid_v, table.key_of(mid_row)))
            rest_per_vnode = {v: [(w, r) for w, r in rest if w == v] for v, _ in starts}
            assert_batch(table.snapshot_multi(cur, e, starts, 1000), rest_per_vnode, 1000)
            # a bound below, inside or above a vnode range: the range's rows after it
            bound = (mid_v, table.key_of(mid_row))
            for lo, hi in ((0, mid_v), (mid_v, mid_v + 1), (mid_v, 8), (mid_v + 1, 8)):
                expected = [
                    (v, r) for v, r in pages if lo <= v < hi and (v, table.key_of(r)) > bound
                ]
                for limit in (None, 1, 2):
                    got = table.snapshot(cur, e, (lo, hi), after=bound, limit=limit)
                    assert got == expected[:limit], f"vnodes [{lo}, {hi}) after {bound}"
        readable = [x for x in epochs if x >= gc_epoch]
        for lo in readable:
            for hi in readable:
                if lo < hi:
                    got = table.change_log_range(cur, lo, hi, (0, 8))
                    assert got == model.change_log_range(lo, hi), f"changes in ({lo}, {hi}]"
        # consecutive ranges read at once: each as if read alone, for a range or a list
        for bounds in (readable, readable[::2], readable[1::3]):
            expected = [model.change_log_range(lo, hi) for lo, hi in itertools.pairwise(bounds)]
            assert table.change_logs(cur, bounds, (0, 8)) == expected, f"ranges of {bounds}"
            some = [1, 2, 6]
            assert table.change_logs(cur, bounds, some) == [
                [c for c in log if c.vnode in some] for log in expected
            ]
        per_vnode = [r for v in range(8) for r in table.change_log(cur, e, [v])]
        assert per_vnode == table.change_log(cur, e, (0, 8))
        assert table.max_epoch(cur) == max(model.epochs(), default=None)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=steps)
def test_store_agrees_with_model(conn: Any, history: list[tuple[str, Any]]) -> None:
    table = VersionedTable(f"prop_{next(_names)}", SCHEMA)
    model = StoreModel(table.key_of, table.vnode_of)
    epochs: list[int] = []
    gc_epoch = 0
    with conn, conn.cursor() as cur:
        table.create(cur)
        try:
            for kind, arg in history:
                # GC only runs below committed epochs, and nothing is written at a committed
                # epoch: a write after a GC of the newest epoch opens a new one
                sealed = bool(epochs) and epochs[-1] <= gc_epoch
                if kind == "write" or (kind == "write_same_epoch" and (not epochs or sealed)):
                    epochs.append((len(epochs) + 1) << 16)
                    table.write(cur, epochs[-1], _to_versions(arg))
                    model.write(epochs[-1], _to_versions(arg))
                elif kind == "write_same_epoch":
                    table.write(cur, epochs[-1], _to_versions(arg))
                    model.write(epochs[-1], _to_versions(arg))
                elif kind == "rollback" and epochs:
                    keep = [e for e in epochs if e >= gc_epoch]
                    committed = keep[arg % len(keep)]
                    table.rollback(cur, committed)
                    model.rollback(committed)
                    epochs = [e for e in epochs if e <= committed]
                elif kind == "gc" and epochs:
                    safe = epochs[arg % len(epochs)]
                    if safe > gc_epoch:
                        table.gc(cur, safe, gc_epoch)
                        model.gc(safe)
                        gc_epoch = safe
                _check(cur, table, model, epochs, gc_epoch)
                if epochs:
                    nxt = table.next_epoch_with_changes(cur, 0)
                    assert nxt == min(model.epochs(), default=None)
        finally:
            table.drop(cur)
