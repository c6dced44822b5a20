"""The epoch-level snapshot backfill agrees with the row-at-a-time reference model.

Random upstream histories (inserts, updates, deletes) before and during the job, random
numbers of fake barriers and snapshot rows that fit before each, single or spread
reads, rate limits, pause/resume/throttle mutations, actors owning a subset of the
vnodes, and an upstream that wants to seal a random number of epochs before each
log-store barrier (held back by the lag cap). At every barrier both sides hold the same
view, per-vnode progress, phase, finish flag, pending lag and lag cap; and the view is
what the phase promises: the snapshot up to each vnode's position in phase 1, the
upstream at the replayed epoch in phase 2 (aligned epochs), the upstream in phase 3.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from backfill_core.changes import Op, RowChange, Version
from backfill_core.epoch import EpochPair, physical_time
from backfill_core.executors.messages import (
    Barrier,
    BarrierKind,
    ChangeRange,
    Mutation,
    ReadProvenanceError,
    SnapshotBatchRead,
    SnapshotRead,
)
from backfill_core.executors.snapshot import (
    Phase,
    SnapshotBackfill,
    VnodeBackfillProgress,
    VnodeState,
    VnodeUpdateDuringLogStore,
    max_pending_epoch_lag,
    upstream_may_advance,
)
from tests.kit.executors import (
    ACTOR,
    SPACING_MS,
    VNODES,
    Batches,
    account_groups,
    account_rows,
    account_summary,
    each_read,
    epoch,
    first_read,
    in_vnodes,
    key_of,
    mutations,
    new_store,
    read_batches,
    read_modes,
    vnode_of,
)
from tests.models.snapshot_reference import SnapshotReference

Ops = list[tuple[int, int, bool]]


def fake(k: int) -> int:
    return k << 16


def as_versions(changes: list[RowChange]) -> list[Version]:
    return [
        Version(c.new) if c.op is not Op.DELETE else Version(c.row, deleted=True) for c in changes
    ]


class Upstream:
    """The upstream table: sealed epochs ``epoch(0..latest)``, fed to the store and model."""

    def __init__(self, initial: dict[int, int]) -> None:
        self.store = new_store()
        self.store.write(epoch(0), [Version((k, v)) for k, v in initial.items()])
        self.state = dict(initial)
        self.latest = 0  # index of the latest sealed epoch
        self.changed: set[int] = set()  # indexes of the sealed epochs with changes
        self.model: SnapshotReference | None = None

    def seal(self, ops: Ops) -> None:
        e = epoch(self.latest + 1)
        versions = []
        for k, v, delete in ops:
            old = (k, self.state[k]) if k in self.state else None
            if old is not None and delete:
                del self.state[k]
                if self.model:
                    self.model.upstream("delete", vnode_of(old), old, None)
                versions.append(Version(old, deleted=True))
            elif not delete or old is None:
                self.state[k] = v
                if self.model:
                    self.model.upstream("update" if old else "insert", k % VNODES, old, (k, v))
                versions.append(Version((k, v)))
        self.store.write(e, versions)
        self.latest += 1
        if versions:
            self.changed.add(self.latest)
        if self.model:
            self.model.upstream_barrier(e)


ops_st = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 9), st.booleans()), max_size=6)
phase1_steps = st.lists(
    st.tuples(
        ops_st,  # DML of the upstream epoch sealed before the fake barrier
        st.one_of(st.just(1_000), st.integers(0, 8)),  # snapshot rows that fit before it
        mutations,
        st.integers(1, 4),  # read chunk size
        read_modes,
    ),
    max_size=10,
)
FORCE = {"resume": [ACTOR], "throttle": {str(ACTOR): None}}


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.integers(0, 15), st.integers(0, 9), max_size=16),
    before=st.lists(ops_st, max_size=2),  # upstream epochs before the snapshot epoch
    phase1=phase1_steps,
    extra_fake=st.integers(0, 2),  # fake barriers after the snapshot was consumed
    wants=st.lists(st.integers(0, 3), max_size=12),  # epochs the upstream wants to seal
    dml=st.lists(ops_st, max_size=20),  # DML of the upstream epochs sealed from then on
    tail=st.integers(0, 3),  # barriers forwarded after the merge
    owned=st.sets(st.integers(0, VNODES - 1), min_size=1),
    rate_limit=st.one_of(st.none(), st.integers(0, 50)),
    paused=st.booleans(),
    skip_quiet=st.booleans(),  # the meta skips the upstream epochs that changed nothing
)
def test_epoch_level_executor_matches_the_row_at_a_time_model(
    initial: dict[int, int],
    before: list[Ops],
    phase1: list[Any],
    extra_fake: int,
    wants: list[int],
    dml: list[Ops],
    tail: int,
    owned: set[int],
    rate_limit: int | None,
    paused: bool,
    skip_quiet: bool,
) -> None:
    up = Upstream(initial)
    for ops in before:
        up.seal(ops)
    snapshot_epoch = epoch(up.latest)
    fixed = up.store.snapshot(snapshot_epoch)
    by_vnode: dict[int, list[Any]] = {}
    for v, r in fixed:
        by_vnode.setdefault(v, []).append(r)
    impl = SnapshotBackfill(
        ACTOR, owned, key_of, snapshot_epoch, rate_limit=rate_limit, paused=paused
    )
    model = SnapshotReference(
        sorted(owned), by_vnode, snapshot_epoch, rate_limit=rate_limit, paused=paused
    )
    up.model = model
    impl_mv, model_mv = new_store(), new_store()
    dml_iter = iter(dml)

    def next_ops() -> Ops:
        return next(dml_iter, [])

    def rows_of(read: Any) -> list[Any]:
        return [
            r
            for v, r in up.store.snapshot(read.epoch)
            if v == read.vnode and (read.after is None or key_of(r) > read.after)
        ][: read.limit]

    def check(out: Any, e: int, label: str) -> None:
        assert impl_mv.snapshot(e) == model_mv.snapshot(e), f"views differ at {label}"
        impl_progress = {
            v: (p.state.value, p.current_pos, p.row_count, p.epoch)
            for v, p in impl.progress.items()
        }
        model_progress = {v: (p.state, p.pos, p.rows, p.epoch) for v, p in model.progress.items()}
        assert impl_progress == model_progress, f"progress differs at {label}"
        assert out.progress["vnodes"] == impl.progress_rows()
        assert out.progress["phase"] == impl.phase.value == model.phase, label
        assert out.finished == model.finished
        assert out.progress["finished_snapshot"] == all(
            p.state == "consumed" for p in model.progress.values()
        )
        assert impl.pending_epoch_lag_ms == physical_time(model.pending_epoch_lag()), label
        cap = model.max_pending_epoch_lag
        assert impl.max_pending_epoch_lag_ms == (None if cap is None else physical_time(cap))

    last_latest: list[int] = [up.latest]

    def elapsed() -> int:
        """Wall time since the last barrier: the upstream's epochs sealed meanwhile."""
        ms = (up.latest - last_latest[0]) * SPACING_MS
        last_latest[0] = up.latest
        return ms

    # phase 1: fake barriers; the upstream seals one epoch per barrier, never held back
    k = 0
    steps = iter(phase1)
    after_consumed = 0
    while True:
        consumed = impl.started and all(
            p.state is VnodeState.CONSUMED for p in impl.progress.values()
        )
        if consumed:
            after_consumed += 1
        transition = consumed and after_consumed > extra_fake
        ops, allowance, mutation, chunk, reads = next(steps, ([], 1_000, FORCE, 4, "single"))
        # snapshot reads of the open (fake) epoch
        read_rows = 0
        left = allowance
        if isinstance(reads, Batches):
            read_rows += read_batches(
                impl,
                model.read_one_from,
                rows_of,
                (left, chunk, reads),
                (impl_mv, model_mv, fake(k)),
            )
        elif reads == "spread":
            while left > 0 and (reads := each_read(impl, min(chunk * 3, left))):
                for read in reads:
                    assert read.epoch == snapshot_epoch
                    rows = rows_of(read)
                    account_summary(impl, read, len(rows), key_of(rows[-1]) if rows else None)
                    impl_mv.write(impl.open_epoch, [Version(r) for r in rows])
                    left -= len(rows)
                    read_rows += len(rows)
                    for _ in range(read.limit):
                        if (row := model.read_one_from(read.vnode)) is None:
                            break
                        model_mv.write(fake(k), [Version(row)])
        else:
            while left > 0 and (read := first_read(impl, min(chunk, left))) is not None:
                assert read.epoch == snapshot_epoch
                rows = rows_of(read)
                written = account_rows(impl, read, rows)
                impl_mv.write(impl.open_epoch, [Version(r) for r in written])
                left -= len(rows)
                read_rows += len(rows)
            left = allowance
            while left > 0 and (row := model.read_one()) is not None:
                model_mv.write(fake(k), [Version(row)])
                left -= 1
        if k > 0:
            assert impl.upstream_may_advance(epoch(up.latest))
            up.seal(ops)
        curr = snapshot_epoch if transition else fake(k + 1)
        assert curr <= snapshot_epoch
        barrier = Barrier(
            EpochPair(fake(k), curr), BarrierKind.CHECKPOINT, Mutation.from_json(mutation)
        )
        assert impl.changes_needed(barrier) is None
        out = impl.on_barrier(barrier, upstream_latest_epoch=epoch(up.latest))
        assert out.write_epoch == fake(k) and not out.emit and not out.finished
        assert out.rows == read_rows
        model.barrier(fake(k), curr, elapsed(), mutation, ACTOR)
        check(out, fake(k), f"fake barrier {k}")
        view = in_vnodes(impl_mv.snapshot(fake(k)), owned)
        reached = {
            v: (p.current_pos if p.state is VnodeState.CONSUMING else (1 << 30,))
            for v, p in impl.progress.items()
        }
        assert view == in_vnodes(fixed, owned, reached)
        k += 1
        if transition:
            break
    assert impl.phase is Phase.LOG_STORE and impl.consumed_epoch == snapshot_epoch

    # phase 2: one upstream epoch per barrier, the upstream held back by the lag cap
    p = physical_time(snapshot_epoch) // SPACING_MS - 1  # index of the epoch replayed next
    wants_iter = iter(wants)
    caps: list[int] = []
    closed = p - 1  # index of the epoch the last barrier closed
    skipped = 0
    for _ in range(500):
        if model.finished:
            break
        wanted = [next(wants_iter, 1)]
        q = p + 1  # the epoch this barrier opens: as the meta picks it with skip_quiet,
        while skip_quiet and q < up.latest and q not in up.changed:  # the next sealed one
            q += 1  # with changes, else the latest sealed (service/meta/creating.py)
        e, nxt = epoch(p), epoch(q)
        barrier = Barrier(EpochPair(e, nxt), BarrierKind.CHECKPOINT)

        def poll(wanted: list[int] = wanted) -> bool:
            if wanted[0] <= 0:
                return False
            assert impl.upstream_may_advance(epoch(up.latest))
            up.seal(next_ops())
            wanted[0] -= 1
            return True

        replaying = model.log_started
        if not replaying:  # the barrier that starts the log store: no cap yet
            while poll():
                pass
        # the model replays e, then lets the upstream run while the cap allows
        emitted = model.barrier(e, nxt, elapsed(), None, ACTOR, poll)
        if replaying and wanted[0] > 0 and not model.finished:
            assert not impl.upstream_may_advance(epoch(up.latest)), "the cap must hold"
            event("the cap held the upstream back")
        needed = impl.changes_needed(barrier)
        if replaying:
            assert needed == ChangeRange(epoch(closed), e, tuple(sorted(owned)))
        else:
            assert needed is None and e == snapshot_epoch
        changes = [] if needed is None else up.store.change_log_range(needed.after, needed.upto)
        out = impl.on_barrier(barrier, changes, upstream_latest_epoch=epoch(up.latest))
        assert out.write_epoch == e and out.rows == len(out.emit)
        impl_mv.write(e, as_versions(out.emit))
        model_mv.write(e, [model_version(c) for c in emitted])
        check(out, e, f"log store epoch {p}")
        # aligned epochs: the view at every replayed epoch is the upstream at that epoch,
        # and so at every skipped one
        for s in range(closed + 1 if replaying else p, p + 1):
            assert in_vnodes(impl_mv.snapshot(epoch(s)), owned) == in_vnodes(
                up.store.snapshot(epoch(s)), owned
            ), f"the view at epoch {s}"
        assert impl.max_pending_epoch_lag_ms is not None
        caps.append(impl.max_pending_epoch_lag_ms)
        skipped += q - p - 1
        closed, p = p, q
    else:
        raise AssertionError("the log store never caught up")
    assert caps == sorted(caps, reverse=True), "the lag cap never grows"
    event(f"fake barriers: {min(k, 6)}+, log-store barriers: {min(len(caps), 8)}+")
    event(f"quiet upstream epochs skipped: {min(skipped, 3)}+")
    assert impl.phase is Phase.FINISHING and impl.pending_epoch_lag_ms == 0

    # phase 3: merged into the main graph, forwarding each closed epoch
    for _ in range(tail):
        assert impl.upstream_may_advance(epoch(up.latest))
        up.seal(next_ops())
        e, nxt = epoch(p), epoch(p + 1)
        barrier = Barrier(EpochPair(e, nxt), BarrierKind.CHECKPOINT)
        needed = impl.changes_needed(barrier)
        assert needed == ChangeRange(epoch(closed), e, tuple(sorted(owned)))
        out = impl.on_barrier(barrier, up.store.change_log_range(needed.after, needed.upto))
        emitted = model.barrier(e, nxt, elapsed(), None, ACTOR)
        impl_mv.write(e, as_versions(out.emit))
        model_mv.write(e, [model_version(c) for c in emitted])
        check(out, e, f"forwarded epoch {p}")
        assert impl.phase is Phase.DONE and out.finished
        assert in_vnodes(impl_mv.snapshot(e), owned) == in_vnodes(up.store.snapshot(e), owned)
        closed, p = p, p + 1


def model_version(change: Any) -> Version:
    _, old, new = change
    return Version(new) if new is not None else Version(old, deleted=True)


# scenarios ----------------------------------------------------------------------------

S = epoch(3)  # snapshot epoch of the scenarios


def run_phase1(
    ex: SnapshotBackfill, rows: dict[int, list[Any]], latest: Callable[[int], int]
) -> int:
    """Fake barriers until the snapshot is consumed, then the one that opens ``S``;
    returns the number of fake barriers. ``latest(k)``: the upstream at barrier ``k``."""
    k = 0
    while True:
        done = ex.started and ex.finished_snapshot
        curr = S if done else fake(k + 1)
        out = ex.on_barrier(Barrier(EpochPair(fake(k), curr)), upstream_latest_epoch=latest(k))
        assert not out.finished
        k += 1
        if done:
            return k
        while (read := first_read(ex, 10)) is not None:
            got = [
                r for r in rows.get(read.vnode, []) if read.after is None or key_of(r) > read.after
            ]
            account_rows(ex, read, got[: read.limit])


def test_the_lag_cap_halves_the_elapsed_distance_and_never_exceeds_the_lag() -> None:
    assert max_pending_epoch_lag(None, 700, 0) == 700  # the log store starts: the lag
    assert max_pending_epoch_lag(700, 800, 100) == 650  # half the elapsed below the cap
    assert max_pending_epoch_lag(700, 300, 100) == 300  # never above the lag
    assert max_pending_epoch_lag(40, 500, 100) == 0  # saturating
    assert max_pending_epoch_lag(1 << 40, 5 << 16, 2 << 16) == 5 << 16  # raw epochs too
    with pytest.raises(ValueError):
        max_pending_epoch_lag(10, -1, 0)
    assert upstream_may_advance(600, 650) and not upstream_may_advance(650, 650)
    assert upstream_may_advance(10**9, None)  # phase 1: the upstream never waits
    # an upstream that always wants to advance ends up one epoch per two replayed
    lag, steps = 1_000, 0
    cap = max_pending_epoch_lag(None, lag, 0)  # the log store starts
    while lag > 0:
        lag -= 100  # the job replays one 100 ms epoch
        while upstream_may_advance(lag, cap):
            lag += 100
        cap = max_pending_epoch_lag(cap, lag, 100)
        steps += 1
        assert steps < 100
    assert steps > 10


def test_the_lag_is_reported_and_shrinks_to_finish() -> None:
    ex = SnapshotBackfill(1, [0, 1], key_of, S)
    store = new_store()
    store.write(epoch(1), [Version((0, "a")), Version((1, "b"))])
    # the upstream seals twenty epochs per fake barrier (two fake barriers here)
    n = run_phase1(ex, {0: [(0, "a")], 1: [(1, "b")]}, lambda k: epoch(3 + 20 * k))
    assert ex.total_rows == 2 and ex.phase is Phase.LOG_STORE
    assert n == 2
    latest = 23
    assert ex.pending_epoch_lag_ms == (latest - 3) * SPACING_MS
    p, lags = 3, []
    while not ex.finished:
        # an upstream that never stops, held back by the cap (none before the log store)
        while p > 3 and ex.upstream_may_advance(epoch(latest)):
            latest += 1
            assert latest < 1_000
        barrier = Barrier(EpochPair(epoch(p), epoch(p + 1)))
        needed = ex.changes_needed(barrier)
        assert (needed is None) == (p == 3)
        out = ex.on_barrier(barrier, [], upstream_latest_epoch=epoch(latest))
        assert out.progress["pending_epoch_lag_ms"] == (latest - p) * SPACING_MS
        lags.append(ex.pending_epoch_lag_ms)
        p += 1
        assert p < 200
    assert lags[-1] == 0 and out.finished and ex.phase is Phase.FINISHING
    assert lags[0] == 20 * SPACING_MS
    assert all(b <= a + SPACING_MS for a, b in zip(lags, lags[1:], strict=False))
    assert max(lags[len(lags) // 2 :]) < max(lags[: len(lags) // 2])
    assert all(r["state"] == "consumed" and r["epoch"] == epoch(p - 1) for r in ex.progress_rows())
    # merged: forwarding, finished
    out = ex.on_barrier(Barrier(EpochPair(epoch(p), epoch(p + 1))), [])
    assert ex.phase is Phase.DONE and out.finished


def test_a_missed_merge_puts_the_job_back_in_the_log_store_and_holds_the_upstream() -> None:
    """The meta merges a finished job at the epoch its last barrier opened, unless the
    upstream committed that epoch first: then the creating graph replays on. Its next
    barriers name the upstream's latest epoch, and the job is back in the log store, its
    cap holding the upstream until it finishes again; merged, it forwards."""
    ex = SnapshotBackfill(1, [0, 1], key_of, S)
    run_phase1(ex, {0: [(0, "a")], 1: [(1, "b")]}, lambda k: epoch(5))
    p = 3
    while not ex.finished:
        ex.on_barrier(
            Barrier(EpochPair(epoch(p), epoch(p + 1))), [], upstream_latest_epoch=epoch(5)
        )
        p += 1
    assert ex.phase is Phase.FINISHING and p == 6
    # no merge: the upstream is at epoch 12 when the creating graph's next barrier comes
    out = ex.on_barrier(Barrier(EpochPair(epoch(6), epoch(7))), [], upstream_latest_epoch=epoch(12))
    assert ex.phase is Phase.LOG_STORE and not out.finished
    assert out.progress["phase"] == "log_store" and out.progress["consumed_epoch"] == epoch(6)
    assert out.progress["pending_epoch_lag_ms"] == 6 * SPACING_MS
    assert not ex.upstream_may_advance(epoch(12)), "the cap must hold the upstream"
    for q in range(7, 12):
        out = ex.on_barrier(
            Barrier(EpochPair(epoch(q), epoch(q + 1))), [], upstream_latest_epoch=epoch(12)
        )
        assert ex.phase is Phase.LOG_STORE and not out.finished
    out = ex.on_barrier(
        Barrier(EpochPair(epoch(12), epoch(13))), [], upstream_latest_epoch=epoch(12)
    )
    assert ex.phase is Phase.FINISHING and out.finished
    out = ex.on_barrier(Barrier(EpochPair(epoch(13), epoch(14))), [])  # merged: a main barrier
    assert ex.phase is Phase.DONE and out.finished


def test_an_upstream_that_did_not_move_finishes_when_the_log_store_starts() -> None:
    ex = SnapshotBackfill(1, [0], key_of, S)
    run_phase1(ex, {}, lambda k: S)
    out = ex.on_barrier(Barrier(EpochPair(S, epoch(4))), upstream_latest_epoch=S)
    assert out.finished and ex.phase is Phase.FINISHING and ex.pending_epoch_lag_ms == 0
    barrier = Barrier(EpochPair(epoch(4), epoch(5)))
    assert ex.changes_needed(barrier) == ChangeRange(S, epoch(4), (0,))


def test_a_vnode_update_during_the_log_store_fails_the_job() -> None:
    ex = SnapshotBackfill(1, [0, 1], key_of, S)
    run_phase1(ex, {0: [(0, "a")]}, lambda k: epoch(3 + k))
    with pytest.raises(VnodeUpdateDuringLogStore, match="log-store phase"):
        ex.on_vnode_update([0])
    ex.on_barrier(Barrier(EpochPair(S, epoch(4))), upstream_latest_epoch=epoch(6))
    with pytest.raises(VnodeUpdateDuringLogStore):
        ex.on_vnode_update([0, 1, 2])


def test_rescale_in_phase_1_and_phase_3() -> None:
    ex = SnapshotBackfill(1, [0, 1], key_of, S, rate_limit=10)
    ex.on_barrier(Barrier(EpochPair(0, fake(1))), upstream_latest_epoch=S)
    ex.on_barrier(Barrier(EpochPair(fake(1), fake(2))), upstream_latest_epoch=epoch(4))
    read = first_read(ex, 10)  # two epochs of 100 ms at 10 rows/s, neither read: two rows
    assert read is not None and read.limit == 2
    account_rows(ex, read, [(0, "a")])
    ex.on_barrier(Barrier(EpochPair(fake(2), fake(3))), upstream_latest_epoch=epoch(5))
    # vnode 1 moves away, vnode 2 arrives from an actor that read up to pk 6
    moved = VnodeBackfillProgress(S, 2, VnodeState.CONSUMING, (6,))
    ex.on_vnode_update([0, 2], {2: moved})
    assert [r["vnode"] for r in ex.progress_rows()] == [0, 2]
    assert ex.progress[0].current_pos == (0,) and ex.progress[2] == moved
    # phase 3: a created job takes consumed vnodes only
    done = VnodeBackfillProgress(epoch(7), 5, VnodeState.CONSUMED, (9,))
    ex3 = SnapshotBackfill(1, [0], key_of, S, created=True, restore={0: done})
    assert ex3.on_barrier(Barrier(EpochPair(epoch(7), epoch(8)), BarrierKind.INITIAL)).finished
    ex3.on_vnode_update([0, 1], {1: done})
    assert ex3.progress[1].epoch == epoch(7)
    with pytest.raises(ValueError, match="without being consumed"):
        ex3.on_vnode_update([0, 1, 2], {2: moved})


def test_recovery_resumes_phase_1_at_the_stored_pk() -> None:
    restore = {
        0: VnodeBackfillProgress(S, 2, VnodeState.CONSUMING, (4,)),
        1: VnodeBackfillProgress(S, 3, VnodeState.CONSUMED, (9,)),
    }
    ex = SnapshotBackfill(1, [0, 1, 2], key_of, S, restore=restore)
    first = Barrier(EpochPair(fake(5), fake(6)), BarrierKind.INITIAL)
    assert ex.on_barrier(first, upstream_latest_epoch=epoch(9)).progress["snapshot_rows"] == 5
    read = first_read(ex, 10)
    assert [(r.vnode, r.after) for r in each_read(ex, 10)] == [(0, (4,)), (2, None)]
    assert read is not None and (read.vnode, read.after, read.epoch) == (0, (4,), S)
    account_rows(ex, read, [(8, "x")])
    assert ex.progress[0] == VnodeBackfillProgress(S, 3, VnodeState.CONSUMED, (8,))
    read = first_read(ex, 10)
    assert read is not None and (read.vnode, read.after) == (2, None)
    with pytest.raises(ValueError, match="not at the snapshot epoch"):
        other = SnapshotBackfill(1, [0], key_of, epoch(4), restore={0: restore[0]})
        other.on_barrier(Barrier(EpochPair(fake(5), fake(6))))


def test_recovery_resumes_phase_2_at_the_committed_epoch() -> None:
    consumed = {v: VnodeBackfillProgress(epoch(6), 1, VnodeState.CONSUMED, (v,)) for v in (0, 1)}
    ex = SnapshotBackfill(1, [0, 1], key_of, S, restore=consumed)
    first = Barrier(EpochPair(epoch(6), epoch(7)), BarrierKind.INITIAL)
    assert ex.changes_needed(first) is None
    out = ex.on_barrier(first, upstream_latest_epoch=epoch(10))
    assert ex.phase is Phase.LOG_STORE and out.progress["pending_epoch_lag_ms"] == 400
    assert ex.max_pending_epoch_lag_ms == 400
    barrier = Barrier(EpochPair(epoch(7), epoch(8)))
    assert ex.changes_needed(barrier) == ChangeRange(epoch(6), epoch(7), (0, 1))
    with pytest.raises(ValueError, match="must be consumed"):  # a vnode still reading
        SnapshotBackfill(1, [0, 1], key_of, S, restore={0: consumed[0]}).on_barrier(first)
    with pytest.raises(ValueError, match="open epoch"):  # epochs chain
        ex.on_barrier(Barrier(EpochPair(epoch(8), epoch(9))), [])


def test_phase_1_refuses_barriers_past_the_snapshot() -> None:
    ex = SnapshotBackfill(1, [0], key_of, S)
    ex.on_barrier(Barrier(EpochPair(0, fake(1))))
    with pytest.raises(ValueError, match="before the snapshot was consumed"):
        ex.on_barrier(Barrier(EpochPair(fake(1), S)))
    with pytest.raises(ValueError, match="during the snapshot"):
        ex.on_barrier(Barrier(EpochPair(fake(1), epoch(5))))


@pytest.mark.parametrize(
    "read_epoch, after",
    [(epoch(4), (0,)), (S, None), (S, (4,))],  # another epoch; from the start; past the position
)
def test_a_read_from_another_epoch_or_position_is_refused(
    read_epoch: int, after: tuple[int] | None
) -> None:
    ex = SnapshotBackfill(1, [0], key_of, S)
    ex.on_barrier(Barrier(EpochPair(0, fake(1))))
    first = first_read(ex, 1)
    assert first is not None and first.epoch == S
    account_rows(ex, first, [(0, "a")])
    wrong = SnapshotRead(0, read_epoch, after, 5)
    with pytest.raises(ReadProvenanceError):
        account_summary(ex, wrong, 1, (8,))
    with pytest.raises(ReadProvenanceError):
        account_groups(ex, SnapshotBatchRead(read_epoch, ((0, after),), 5), {0: (1, (8,))})
    assert ex.progress[0].current_pos == (0,)
