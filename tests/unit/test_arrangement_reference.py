"""The epoch-level arrangement backfill agrees with the row-at-a-time reference model.

Random upstream histories (inserts, updates, deletes), random barrier placement (how
many snapshot rows fit before each barrier), random chunking of the reads, rate limits,
pause/resume/throttle mutations, and actors owning a subset of the vnodes. At every
barrier both sides must hold the same view, the same per-vnode progress and the same
finish flag; and the view must equal the upstream wherever the backfill has reached.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from backfill_core.changes import Op, Version
from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill, VnodeState
from backfill_core.executors.messages import (
    Barrier,
    BarrierKind,
    Mutation,
    ReadProvenanceError,
    SnapshotBatchRead,
    SnapshotRead,
)
from tests.kit.executors import (
    ACTOR,
    VNODES,
    Batches,
    account_groups,
    account_rows,
    account_summary,
    each_read,
    epoch,
    epoch_histories,
    first_read,
    in_vnodes,
    key_of,
    new_store,
    read_batches,
    vnode_of,
)
from tests.kit.rescale import (
    ALL,
    ActorPair,
    JobFlow,
    Upstream,
    assert_reached,
    restores_and_rescales,
    run_with_recoveries,
)
from tests.models.arrangement_reference import ArrangementReference


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.integers(0, 15), st.integers(0, 9), max_size=16),
    history=epoch_histories,
    owned=st.sets(st.integers(0, VNODES - 1), min_size=1),
    rate_limit=st.one_of(st.none(), st.integers(0, 50)),
)
def test_epoch_level_executor_matches_the_row_at_a_time_model(
    initial: dict[int, int], history: list[Any], owned: set[int], rate_limit: int | None
) -> None:
    upstream = new_store()
    upstream.write(epoch(0), [Version((k, v)) for k, v in initial.items()])
    state = dict(initial)
    impl = ArrangementBackfill(ACTOR, owned, key_of, rate_limit=rate_limit)
    model = ArrangementReference(sorted(owned), rate_limit=rate_limit)
    impl_mv, model_mv = new_store(), new_store()
    first = Barrier(EpochPair(epoch(0), epoch(1)), BarrierKind.CHECKPOINT)
    impl.on_barrier(first)
    model.barrier(first.elapsed_ms, None, ACTOR)
    finished_at: int | None = None

    for i, (ops, allowance, mutation, chunk, reads) in enumerate(history, start=1):
        e = epoch(i)
        # upstream DML of epoch e, row at a time for the model, versions for the store
        versions = []
        for k, v, delete in ops:
            old = (k, state[k]) if k in state else None
            if old is not None and delete:
                del state[k]
                model.upstream("delete", vnode_of(old), old, None)
                versions.append(Version(old, deleted=True))
            elif not delete or old is None:
                state[k] = v
                model.upstream("update" if old else "insert", k % VNODES, old, (k, v))
                versions.append(Version((k, v)))
        upstream.write(e, versions)

        # snapshot reads of the open epoch, at the last closed epoch
        snap_rows = upstream.snapshot(impl.snapshot_epoch)

        def rows_of(read: Any, snap_rows: Any = snap_rows) -> list[Any]:
            return [
                r
                for v, r in snap_rows
                if v == read.vnode and (read.after is None or key_of(r) > read.after)
            ][: read.limit]

        by_vnode: dict[int, list[Any]] = {}
        for v, r in snap_rows:
            by_vnode.setdefault(v, []).append(r)
        left = allowance
        if isinstance(reads, Batches):
            model_read = functools.partial(model.read_one_from, snapshot=by_vnode)
            mvs = (impl_mv, model_mv, e)
            read_batches(impl, model_read, rows_of, (left, chunk, reads), mvs)
        elif reads == "spread":
            # the driver's plan (which vnode, how many rows) is replayed into the model,
            # which finds the rows, positions and ends itself
            while left > 0 and (reads := each_read(impl, min(chunk * 3, left))):
                for read in reads:
                    rows = rows_of(read)
                    account_summary(impl, read, len(rows), key_of(rows[-1]) if rows else None)
                    impl_mv.write(impl.open_epoch, [Version(r) for r in rows])
                    left -= len(rows)
                    for _ in range(read.limit):
                        if (row := model.read_one_from(read.vnode, by_vnode)) is None:
                            break
                        model_mv.write(e, [Version(row)])
        else:
            while left > 0 and (read := first_read(impl, min(chunk, left))) is not None:
                rows = rows_of(read)
                impl_mv.write(impl.open_epoch, [Version(r) for r in account_rows(impl, read, rows)])
                left -= len(rows)
            left = allowance
            while left > 0 and (row := model.read_one(by_vnode)) is not None:
                model_mv.write(e, [Version(row)])
                left -= 1

        # the barrier closing e
        barrier = Barrier(
            EpochPair(e, epoch(i + 1)), BarrierKind.CHECKPOINT, Mutation.from_json(mutation)
        )
        needed = impl.changes_needed(barrier)
        changes = []
        if needed is not None:
            changes = [
                c
                for c in upstream.change_log_range(needed.after, needed.upto)
                if c.vnode in needed.vnodes
            ]
        out = impl.on_barrier(barrier, changes)
        assert out.write_epoch == e
        impl_mv.write(
            e,
            [
                Version(c.new) if c.op is not Op.DELETE else Version(c.row, deleted=True)
                for c in out.emit
            ],
        )
        emitted = model.barrier(barrier.elapsed_ms, mutation, ACTOR)
        model_mv.write(
            e,
            [
                Version(new) if new is not None else Version(old, deleted=True)
                for _, old, new in emitted
            ],
        )  # type: ignore[arg-type]

        # the same view, progress and finish flag at every barrier
        assert impl_mv.snapshot(e) == model_mv.snapshot(e), f"views differ at epoch {i}"
        impl_progress = {
            v: (p.state.value, p.current_pos, p.row_count) for v, p in impl.progress.items()
        }
        model_progress = {v: (p.state, p.pos, p.rows) for v, p in model.progress.items()}
        assert impl_progress == model_progress, f"progress differs at epoch {i}"
        assert out.finished == model.finished
        # and the view is the upstream's wherever the backfill reached
        truth = upstream.snapshot(e)
        if out.finished:
            finished_at = finished_at or i
            assert in_vnodes(impl_mv.snapshot(e), owned) == in_vnodes(truth, owned)
        else:
            reached = {
                v: p.current_pos
                for v, p in impl.progress.items()
                if p.state is not VnodeState.NOT_STARTED
            }
            assert in_vnodes(impl_mv.snapshot(e), owned, reached) == in_vnodes(
                truth, owned, reached
            )
            assert in_vnodes(impl_mv.snapshot(e), owned) == in_vnodes(
                impl_mv.snapshot(e), owned, reached
            )


def test_an_empty_upstream_finishes_at_the_second_barrier() -> None:
    ex = ArrangementBackfill(1, range(4), key_of)
    assert not ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1)))).finished
    while (read := first_read(ex, 10)) is not None:
        account_rows(ex, read, [])
    out = ex.on_barrier(Barrier(EpochPair(epoch(1), epoch(2))))
    assert out.finished and all(p.state is VnodeState.COMPLETED for p in ex.progress.values())


def test_pause_stops_reads_but_not_the_changes_below_current_pos() -> None:
    ex = ArrangementBackfill(1, [0], key_of, paused=False)
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1))))
    read = first_read(ex, 1)
    assert read is not None
    account_rows(ex, read, [(0, "a")])  # current_pos = (0,); more rows remain
    pause = Barrier(EpochPair(epoch(1), epoch(2)), mutation=Mutation(pause=frozenset({1})))
    ex.on_barrier(pause)
    assert first_read(ex, 10) is None  # paused: no snapshot reads
    from backfill_core.changes import RowChange

    below = RowChange(Op.UPDATE, 0, (0, "a"), (0, "b"))
    above = RowChange(Op.INSERT, 0, None, (4, "x"))
    out = ex.on_barrier(Barrier(EpochPair(epoch(2), epoch(3))), [below, above])
    assert out.emit == [below]


def test_the_rate_limit_is_a_token_bucket_over_barriers_handled_at_once() -> None:
    """A worker that handles several barriers in one step keeps each epoch's share of the
    rate; an actor with nothing to read cannot save up more than a second's worth."""

    def at(ms: int) -> int:  # an epoch at ``ms`` of physical time
        return (1_000 + ms) << 16

    def barrier(a: int, b: int, mutation: Mutation | None = None) -> Barrier:
        return Barrier(EpochPair(at(a), at(b)), mutation=mutation)

    ex = ArrangementBackfill(1, [0], key_of, rate_limit=1_000)
    for t in (0, 100, 200):  # three 100 ms epochs close before the worker reads
        ex.on_barrier(barrier(t, t + 100))
    read = first_read(ex, 10_000)
    assert read is not None and read.limit == 300
    account_rows(ex, read, [(k, "r") for k in range(120)])  # 180 left: the snapshot ended
    ex.on_barrier(barrier(300, 400))
    assert ex.budget == 280
    for t in range(400, 3_000, 100):  # an idle second and more: capped at a second's worth
        ex.on_barrier(barrier(t, t + 100))
    assert ex.budget == 1_000
    ex.on_barrier(barrier(3_000, 8_000))
    assert ex.budget == 5_000  # an epoch longer than a second gets its whole length
    ex.on_barrier(barrier(8_000, 8_100, Mutation(pause=frozenset({1}))))
    assert ex.budget == 0
    ex.on_barrier(barrier(8_100, 8_200, Mutation(resume=frozenset({1}))))
    assert ex.budget == 100  # nothing carried across a pause


def test_a_restored_completed_vnode_is_never_read_and_emits_every_change() -> None:
    """A rescale deals a vnode an earlier actor completed next to an unfinished one
    (issue 30): its rows are all in the view, so a delete in it must be emitted, and it
    is never read again (a read would turn it back into one in progress)."""
    from backfill_core.changes import RowChange
    from backfill_core.executors.arrangement import VnodeProgress

    restore = {
        0: VnodeProgress(VnodeState.COMPLETED, (4,), 2),
        1: VnodeProgress(VnodeState.IN_PROGRESS, (1,), 1),
        2: VnodeProgress(VnodeState.COMPLETED, None, 0),  # completed without any row
    }
    ex = ArrangementBackfill(1, [0, 1, 2], key_of, restore=restore)
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1))))
    read = first_read(ex, 1)
    assert read is not None and read.vnode == 1 and read.after == (1,)
    assert [r.vnode for r in each_read(ex, 10)] == [1]
    assert [v for b in ex.plan_reads(10, 2) for v, _ in b.starts] == [1]
    account_rows(ex, read, [(5, "x")])  # more rows may remain in vnode 1
    nxt = first_read(ex, 10)
    assert nxt is not None and nxt.vnode == 1 and nxt.after == (5,)
    with pytest.raises(ValueError):
        account_summary(ex, SnapshotRead(0, epoch(0), (4,), 10), 1, (8,))
    deletes = [
        RowChange(Op.DELETE, 0, (12, "a"), None),
        RowChange(Op.INSERT, 2, None, (2, "b")),
        RowChange(Op.DELETE, 1, (9, "c"), None),  # above vnode 1's position: not yet
    ]
    needed = ex.changes_needed(Barrier(EpochPair(epoch(1), epoch(2))))
    assert needed is not None and needed.vnodes == (0, 1, 2)
    out = ex.on_barrier(Barrier(EpochPair(epoch(1), epoch(2))), deletes)
    assert out.emit == deletes[:2]
    assert ex.progress[0] == restore[0] and ex.progress[2] == restore[2]


def test_a_restored_actor_whose_vnodes_all_completed_forwards() -> None:
    from backfill_core.executors.arrangement import VnodeProgress

    done = VnodeProgress(VnodeState.COMPLETED, (1,), 1)
    ex = ArrangementBackfill(1, [0, 1], key_of, restore={0: done, 1: done})
    assert ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1)))).finished
    assert first_read(ex, 10) is None


@pytest.mark.parametrize(
    "read",
    [
        SnapshotRead(0, epoch(1), (0,), 5),  # planned at the next epoch
        SnapshotRead(0, epoch(0) - 1, (0,), 5),  # planned before the barrier it is read after
        SnapshotRead(0, epoch(0), None, 5),  # from the vnode's start, not its position
        SnapshotRead(0, epoch(0), (4,), 5),  # from past its position
    ],
)
def test_a_read_from_another_epoch_or_position_is_refused(read: SnapshotRead) -> None:
    ex = ArrangementBackfill(1, [0], key_of)
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1))))
    first = first_read(ex, 1)
    assert first is not None
    account_rows(ex, first, [(0, "a")])
    with pytest.raises(ReadProvenanceError):
        account_summary(ex, read, 1, (8,))
    with pytest.raises(ReadProvenanceError):
        account_groups(ex, SnapshotBatchRead(read.epoch, ((0, read.after),), 5), {0: (1, (8,))})
    assert ex.progress[0].current_pos == (0,)


class _Arrangement:
    """Recoveries of an arrangement job restore each vnode's committed progress."""

    mixed = False  # an actor restored with completed vnodes next to unfinished ones

    def actor(self, actor_id: int, vnodes: list[int], flow: JobFlow, restored: Any) -> ActorPair:
        impl_restore, model_restore = restored or ({}, {})
        done = {v in impl_restore and impl_restore[v].state is VnodeState.COMPLETED for v in vnodes}
        self.mixed = self.mixed or len(done) == 2
        return ActorPair(
            actor_id,
            vnodes,
            ArrangementBackfill(
                actor_id,
                vnodes,
                key_of,
                rate_limit=flow.rate_limit,
                paused=flow.paused,
                restore={v: impl_restore[v] for v in vnodes if v in impl_restore},
            ),
            ArrangementReference(
                vnodes,
                rate_limit=flow.rate_limit,
                paused=flow.paused,
                progress={
                    v: dataclasses.replace(model_restore[v]) for v in vnodes if v in model_restore
                },
            ),
        )

    def committed(self, actors: list[ActorPair], outs: list[Any]) -> Any:
        return (
            {v: p for a in actors for v, p in a.impl.progress.items()},
            {v: dataclasses.replace(p) for a in actors for v, p in a.model.progress.items()},
        )

    def keeps_view(self, committed: Any) -> bool:
        return True

    def check(self, actor: ActorPair, view: Any, up: Upstream, e: int) -> None:
        reached = {
            v: ALL if p.state is VnodeState.COMPLETED else p.current_pos
            for v, p in actor.impl.progress.items()
        }
        assert_reached(view, up.store.snapshot(e), reached)


@settings(max_examples=300, deadline=None)
@restores_and_rescales
def test_restores_and_rescales_keep_the_executors_equal_to_the_model(
    initial: dict[int, int], first_deal: list[int], history: list[Any], rate_limit: int | None
) -> None:
    """A job's actors at random barriers (not all checkpoints, random spacing): at random
    points a recovery rolls everything back to the last checkpoint and deals the vnodes
    to a new number of actors, restored from the progress committed there, so an actor
    may own vnodes another completed next to unfinished ones. Executors and models agree
    at every barrier, and every vnode of the view is the upstream's as far as it reached."""
    kind = _Arrangement()
    recoveries, _ = run_with_recoveries(
        kind, initial, first_deal, history, JobFlow(rate_limit=rate_limit)
    )
    event(f"recoveries: {min(recoveries, 3)}+")
    event(f"an actor restored with completed and unfinished vnodes: {kind.mixed}")
