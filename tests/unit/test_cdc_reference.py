"""The CDC backfill agrees with the row-at-a-time reference model (issue 36).

Random upstream histories (inserts, updates, deletes, primary-key changes, commits of
other tables that only move the WAL), random chunk sizes, random interleavings of the
stream with chunk reads (the low watermark when the read starts, the read's snapshot
anywhere between its watermarks, the high watermark anywhere after it, the stream
delivering before, during and after a read), barriers with pause / resume / throttle,
and restores from the last checkpoint. After every step our table must be exactly the
model's: the upstream at the stream's position restricted to the keys the backfill has
reached; once finished, the upstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from backfill_core.changes import Op, Row
from backfill_core.epoch import EpochPair
from backfill_core.executors.cdc import (
    CdcBackfill,
    CdcEvent,
    CdcProgress,
    CdcState,
    CdcWrite,
    ChunkRead,
    ChunkRows,
    key_change,
)
from backfill_core.executors.kinds import as_cdc_reads
from backfill_core.executors.messages import Barrier, Mutation, ReadProvenanceError
from tests.kit.executors import ACTOR, epoch, key_of
from tests.models.cdc_reference import CdcReference, Change, Checkpoint

KEYS = 12
START = 1  # the slot's consistent point: the initial rows are committed at it


@st.composite
def histories(draw: st.DrawFn) -> list[Change]:
    """Committed changes in LSN order; one LSN per transaction (several changes share
    it), some LSNs only other tables' commits."""
    initial = draw(st.dictionaries(st.integers(0, KEYS - 1), st.integers(0, 9), max_size=10))
    changes: list[Change] = [(START, "insert", k, (k, v)) for k, v in sorted(initial.items())]
    state = dict(initial)
    lsn = START
    for _ in range(draw(st.integers(0, 30))):
        lsn += draw(st.integers(1, 3))
        for _ in range(draw(st.integers(0, 3))):
            k = draw(st.integers(0, KEYS - 1))
            v = draw(st.integers(0, 9))
            if k not in state:
                changes.append((lsn, "insert", k, (k, v)))
                state[k] = (k, v)
                continue
            kind = draw(st.sampled_from(["update", "delete", "rekey"]))
            free = [n for n in range(KEYS) if n not in state]
            if kind == "rekey" and free:
                new = draw(st.sampled_from(free))
                changes.append((lsn, "delete", k, None))
                changes.append((lsn, "insert", new, (new, v)))
                del state[k]
                state[new] = (new, v)
            elif kind == "delete":
                changes.append((lsn, "delete", k, None))
                del state[k]
            else:
                changes.append((lsn, "update", k, (k, v)))
                state[k] = (k, v)
    # the WAL may end past the last change (other tables' commits)
    changes.append((lsn + draw(st.integers(0, 2)), "wal", -1, None))
    return changes


def to_events(changes: list[Change], after: int, upto: int) -> list[CdcEvent]:
    """The stream's events in ``(after, upto]``, as the decoder hands them over."""
    out: list[CdcEvent] = []
    for lsn, op, key, row in changes:
        if after < lsn <= upto and op != "wal":
            out.append(CdcEvent(lsn, Op(op), (key,), row))
    return out


def apply(table: dict[int, Row], writes: list[CdcWrite]) -> None:
    for w in writes:
        (k,) = w.key
        if w.row is None:
            # a delete is only ever written for a key our table holds
            assert k in table, f"delete of key {k}, which our table does not hold"
            del table[k]
        else:
            table[k] = w.row


@dataclass
class Saved:
    progress: CdcProgress
    table: dict[int, Row]
    model: Checkpoint


MUTATIONS = st.one_of(
    st.none(),
    st.just({"pause": [ACTOR]}),
    st.just({"resume": [ACTOR]}),
    st.builds(lambda r: {"throttle": {str(ACTOR): r}}, st.one_of(st.none(), st.integers(0, 40))),
)
STEPS = st.sampled_from(["commit", "stream", "plan", "account", "barrier", "restore"])


class Run:
    """One executor, our table and the model, driven step by step."""

    def __init__(self, changes: list[Change], rate_limit: int | None) -> None:
        self.changes = changes
        self.end = changes[-1][0]
        self.wal = START  # how far the upstream has committed
        self.impl = CdcBackfill(ACTOR, key_of, start_lsn=START, rate_limit=rate_limit)
        self.model = CdcReference(changes, START, rate_limit=rate_limit)
        self.table: dict[int, Row] = {}
        # a planned read, its low watermark, and the WAL when it started (its snapshot
        # holds everything up to there)
        self.flight: tuple[ChunkRead, int, int] | None = None
        self.epochs = 0
        self.saved: Saved | None = None
        self.barrier(None)

    def barrier(self, mutation: dict[str, Any] | None) -> None:
        b = Barrier(EpochPair(epoch(self.epochs), epoch(self.epochs + 1)))
        b = Barrier(b.epoch, b.kind, Mutation.from_json(mutation))
        out = self.impl.on_barrier(b)
        assert out.lsn == self.impl.lsn and out.finished == self.impl.finished
        self.model.barrier(b.elapsed_ms, mutation, ACTOR)
        self.epochs += 1
        # every barrier here is a checkpoint: our table is committed with the progress
        self.saved = Saved(self.impl.progress, dict(self.table), self.model.checkpoint())

    def restore(self) -> None:
        assert self.saved is not None
        s = self.saved
        event(f"restore with the chunk {self.impl.report()['chunk_phase']}")
        self.impl = CdcBackfill(
            ACTOR,
            key_of,
            rate_limit=self.model.rate_limit,
            paused=self.model.paused,
            restore=CdcProgress.from_row(_as_row(s.progress)),
        )
        self.table = dict(s.table)
        self.model.restore(s.model)
        self.flight = None
        self.barrier(None)

    def stream(self, upto: int) -> None:
        events = to_events(self.changes, self.impl.lsn, upto)
        apply(self.table, self.impl.on_changes(events, upto=upto))
        self.model.stream_to(upto)

    def plan(self, max_rows: int, data: st.DataObject) -> None:
        planned = as_cdc_reads(self.impl).plan_reads(max_rows)
        expected = self.model.plan(max_rows) if self.flight is None else None
        assert [(r.after, r.limit) for r in planned] == ([expected] if expected else [])
        if planned:
            # the low watermark: the WAL right now, or any LSN below it down to the
            # stream's position (a conservative low loses nothing)
            low = data.draw(st.integers(self.impl.lsn, self.wal), label="low")
            self.flight = (planned[0], low, self.wal)

    def account(self, data: st.DataObject) -> None:
        assert self.flight is not None
        read, low, started = self.flight
        at = data.draw(st.integers(started, self.wal), label="snapshot at")
        high = data.draw(st.integers(at, self.wal), label="high")
        rows = self.model.select(read.after, read.limit, at)
        ended = len(rows) < read.limit
        if not ended and not self.model.select(rows[-1][:1], 1, at):
            ended = data.draw(st.booleans(), label="end seen")  # read with limit + 1
        upto = None if ended else rows[-1][0]
        if any(
            low < lsn <= high
            and (read.after is None or (k,) > read.after)
            and (upto is None or k <= upto)
            for lsn, op, k, _ in self.changes
            if op != "wal"
        ):
            event("a change between the watermarks in the chunk's range")
        if self.impl.lsn >= high:
            event("the stream passed high before the read was accounted")
        writes = self.impl.account(read, ChunkRows(low, high, rows, ended))
        apply(self.table, writes)
        self.model.chunk(rows, ended, high)
        self.flight = None

    def check(self, where: str) -> None:
        m = self.model
        assert self.table == m.expected(), f"our table differs from the model {where}"
        assert (self.impl.current_pos, self.impl.finished) == (m.pos, m.finished), where
        assert (self.impl.lsn, self.impl.chunks, self.impl.total_rows) == (
            m.lsn,
            m.chunks,
            m.rows,
        )
        assert self.impl.budget == m.budget


def _as_row(p: CdcProgress) -> dict[str, Any]:
    """Committed progress as the catalog gives it back (lists where tuples were)."""
    return {
        "state": p.state.value,
        "current_pos": None if p.current_pos is None else list(p.current_pos),
        "lsn": p.lsn,
        "row_count": p.row_count,
        "chunks": p.chunks,
    }


@settings(max_examples=400, deadline=None)
@given(
    changes=histories(),
    rate_limit=st.one_of(st.none(), st.integers(0, 40)),
    data=st.data(),
)
def test_the_cdc_backfill_matches_the_row_at_a_time_model(
    changes: list[Change], rate_limit: int | None, data: st.DataObject
) -> None:
    run = Run(changes, rate_limit)
    run.check("at the start")
    for i in range(data.draw(st.integers(0, 60), label="steps")):
        step = data.draw(STEPS, label="step")
        if step == "commit":
            run.wal = min(run.end, run.wal + data.draw(st.integers(1, 4)))
        elif step == "stream":
            run.stream(data.draw(st.integers(run.impl.lsn, run.wal), label="upto"))
        elif step == "plan":
            run.plan(data.draw(st.integers(1, 5), label="max rows"), data)
        elif step == "account" and run.flight is not None:
            run.account(data)
        elif step == "barrier":
            run.barrier(data.draw(MUTATIONS, label="mutation"))
        elif step == "restore":
            run.restore()
        run.check(f"after step {i} ({step})")

    # then unthrottled to the end: the upstream still writing while the chunks are read
    # and the stream lags behind, then every chunk read and the whole stream delivered
    run.barrier({"resume": [ACTOR], "throttle": {str(ACTOR): None}})
    for _ in range(8 * KEYS):
        if run.impl.finished:
            break
        if data.draw(st.booleans(), label="upstream writes"):
            run.wal = min(run.end, run.wal + data.draw(st.integers(1, 3)))
        if run.flight is None:
            run.plan(data.draw(st.integers(1, 5), label="max rows"), data)
        else:
            run.account(data)
        run.stream(data.draw(st.integers(run.impl.lsn, run.wal), label="upto"))
        run.check("while finishing")
    run.wal = run.end
    run.stream(run.end)  # a held chunk is merged
    while not run.impl.finished:
        if run.flight is None:
            run.plan(KEYS, data)
        run.account(data)
        run.stream(run.end)
        run.check("while finishing")
    run.stream(run.end)
    run.check("at the end")
    event(f"chunks: {min(run.impl.chunks, 10)}")
    assert run.impl.finished
    assert run.table == run.model.upstream_at(run.end)


# the cases the merge rule names, one at a time ------------------------------------


def _started(**kw: Any) -> CdcBackfill:
    ex = CdcBackfill(ACTOR, key_of, start_lsn=10, **kw)
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1))))
    return ex


def _ins(lsn: int, k: int, v: int = 0) -> CdcEvent:
    return CdcEvent(lsn, Op.INSERT, (k,), (k, v))


def _del(lsn: int, k: int) -> CdcEvent:
    return CdcEvent(lsn, Op.DELETE, (k,), None)


def test_an_insert_between_the_watermarks_inside_the_range_is_merged() -> None:
    """Key 2 was inserted between low and high; the read did not see it (the chunk's
    rows are 1 and 3): the change puts it in the held chunk."""
    ex = _started()
    [read] = ex.plan_reads(2)
    assert ex.account(read, ChunkRows(10, 20, [(1, 0), (3, 0)], False)) == []
    assert ex.on_changes([_ins(15, 2, 7)]) == []  # held, not written yet
    assert ex.on_changes([_ins(25, 4)], upto=25) == [
        CdcWrite((1,), (1, 0)),
        CdcWrite((2,), (2, 7)),
        CdcWrite((3,), (3, 0)),
    ]  # key 4 lies above the chunk: not read yet, dropped
    assert ex.current_pos == (3,) and ex.chunks == 1


def test_a_short_chunk_covers_every_key_above_its_start() -> None:
    """The table ended within the chunk: a key inserted above its last row between the
    watermarks belongs to it, and from then on every change is written."""
    ex = _started()
    [read] = ex.plan_reads(5)
    ex.account(read, ChunkRows(10, 20, [(1, 0)], True))
    writes = ex.on_changes([_ins(12, 9), _del(13, 1)], upto=20)
    assert writes == [CdcWrite((9,), (9, 0))] and ex.finished
    assert ex.on_changes([_del(21, 9)]) == [CdcWrite((9,), None)]
    assert ex.plan_reads(5) == []


def test_changes_at_or_below_the_low_watermark_are_in_the_read() -> None:
    ex = _started()
    [read] = ex.plan_reads(5)
    ex.on_changes([_ins(11, 1, 5)], upto=12)  # during the read, before low: kept, dropped
    writes = ex.account(read, ChunkRows(12, 12, [(1, 5)], True))
    assert writes == [CdcWrite((1,), (1, 5))]  # the stream was past high already


def test_a_key_change_moves_the_row_across_the_chunk_boundary() -> None:
    ex = _started()
    [read] = ex.plan_reads(2)
    ex.account(read, ChunkRows(10, 20, [(1, 0), (5, 0)], False))
    # key 5 becomes 8 (above the chunk: a later chunk reads it)
    writes = ex.on_changes(list(key_change(15, (5,), (8,), (8, 0))), upto=20)
    assert writes == [CdcWrite((1,), (1, 0))] and ex.current_pos == (5,)


def test_a_restore_drops_the_held_chunk_and_reads_it_again() -> None:
    ex = _started()
    [read] = ex.plan_reads(2)
    ex.account(read, ChunkRows(10, 20, [(1, 0), (2, 0)], False))
    again = CdcBackfill(ACTOR, key_of, restore=ex.progress)
    again.on_barrier(Barrier(EpochPair(epoch(3), epoch(4))))
    assert again.plan_reads(2) == [ChunkRead(1, None, 2)]
    assert again.lsn == 10 and again.current_pos is None


def test_refusals() -> None:
    ex = _started()
    assert ex.plan_reads(3) == [ChunkRead(1, None, 3)]
    assert ex.plan_reads(3) == []  # one chunk at a time
    with pytest.raises(ReadProvenanceError):
        ex.account(ChunkRead(1, (4,), 3), ChunkRows(10, 11, [], True))
    with pytest.raises(ValueError, match="watermarks"):
        ex.account(ChunkRead(1, None, 3), ChunkRows(9, 11, [], True))  # low before the stream
    with pytest.raises(ValueError, match="short"):
        ex.account(ChunkRead(1, None, 3), ChunkRows(10, 11, [(1, 0)], False))
    with pytest.raises(ValueError, match="ascend"):
        ex.account(ChunkRead(1, None, 3), ChunkRows(10, 11, [(2, 0), (1, 0)], True))
    ex.on_changes([_ins(12, 1)])
    with pytest.raises(ValueError, match="split"):
        ex.on_changes([_ins(12, 2)])  # the rest of a transaction already passed
    with pytest.raises(ValueError):
        CdcEvent(13, Op.DELETE, (1,), (1, 0))


def test_paused_and_throttled_reads() -> None:
    ex = _started(paused=True)
    ex.on_barrier(Barrier(EpochPair(epoch(1), epoch(2))))
    assert ex.plan_reads(5) == []
    ex.on_barrier(
        Barrier(EpochPair(epoch(2), epoch(3)), mutation=Mutation(resume=frozenset({ACTOR})))
    )
    assert ex.plan_reads(5) == [ChunkRead(1, None, 5)]
    assert ex.progress_rows()[0]["state"] == CdcState.BACKFILLING.value
