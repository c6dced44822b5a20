"""The epoch-level rearranged chain agrees with the row-at-a-time reference model.

Random upstream histories (inserts, updates, deletes), random barrier placement (how
many snapshot rows fit before each barrier), single or spread reads, rate limits,
pause/resume/throttle mutations, replay pacing, and actors owning a subset of the
vnodes. At every barrier both sides must hold the same view, progress, phase, replay
backlog and finish flag; and the view must be what the phase promises: the fixed
snapshot up to ``current_pos`` while it is read, the upstream at the replayed epoch
during the replay, the upstream itself once finished.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from backfill_core.changes import Op, RowChange, Version
from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import VnodeState
from backfill_core.executors.chain import ChainBackfill, Phase
from backfill_core.executors.messages import (
    Barrier,
    BarrierKind,
    ChangeRange,
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
from tests.models.chain_reference import ChainReference
from tests.models.chain_reference import Progress as ChainProgress


def as_versions(changes: list[RowChange]) -> list[Version]:
    return [
        Version(c.new) if c.op is not Op.DELETE else Version(c.row, deleted=True) for c in changes
    ]


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.integers(0, 15), st.integers(0, 9), max_size=16),
    history=epoch_histories,
    owned=st.sets(st.integers(0, VNODES - 1), min_size=1),
    rate_limit=st.one_of(st.none(), st.integers(0, 50)),
    paused=st.booleans(),
    per_barrier=st.integers(2, 4),
)
def test_epoch_level_executor_matches_the_row_at_a_time_model(
    initial: dict[int, int],
    history: list[Any],
    owned: set[int],
    rate_limit: int | None,
    paused: bool,
    per_barrier: int,
) -> None:
    upstream = new_store()
    upstream.write(epoch(0), [Version((k, v)) for k, v in initial.items()])
    state = dict(initial)
    impl = ChainBackfill(
        ACTOR,
        owned,
        key_of,
        rate_limit=rate_limit,
        paused=paused,
        replay_epochs_per_barrier=per_barrier,
    )
    model = ChainReference(
        sorted(owned), rate_limit=rate_limit, paused=paused, per_barrier=per_barrier
    )
    impl_mv, model_mv = new_store(), new_store()
    first = Barrier(EpochPair(epoch(0), epoch(1)), BarrierKind.CHECKPOINT)
    assert impl.changes_needed(first) is None
    assert not impl.on_barrier(first).finished
    model.barrier(first.elapsed_ms, None, ACTOR)
    assert impl.snapshot_epoch == epoch(0)
    # the snapshot never moves: it is the upstream at the first barrier's prev
    fixed = upstream.snapshot(epoch(0))
    by_vnode: dict[int, list[Any]] = {}
    for v, r in fixed:
        by_vnode.setdefault(v, []).append(r)

    def rows_of(read: Any) -> list[Any]:
        return [
            r
            for v, r in upstream.snapshot(read.epoch)
            if v == read.vnode and (read.after is None or key_of(r) > read.after)
        ][: read.limit]

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

        # snapshot reads of the open epoch
        read_rows = 0
        left = allowance
        if isinstance(reads, Batches):
            model_read = functools.partial(model.read_one_from, snapshot=by_vnode)
            mvs = (impl_mv, model_mv, e)
            read_rows += read_batches(impl, model_read, rows_of, (left, chunk, reads), mvs)
        elif reads == "spread":
            # the driver's plan (which vnode, how many rows) is replayed into the model,
            # which finds the rows, positions and ends itself
            while left > 0 and (reads := each_read(impl, min(chunk * 3, left))):
                for read in reads:
                    assert read.epoch == epoch(0)
                    rows = rows_of(read)
                    account_summary(impl, read, len(rows), key_of(rows[-1]) if rows else None)
                    impl_mv.write(impl.open_epoch, [Version(r) for r in rows])
                    left -= len(rows)
                    read_rows += len(rows)
                    for _ in range(read.limit):
                        if (row := model.read_one_from(read.vnode, by_vnode)) is None:
                            break
                        model_mv.write(e, [Version(row)])
        else:
            while left > 0 and (read := first_read(impl, min(chunk, left))) is not None:
                assert read.epoch == epoch(0)
                rows = rows_of(read)
                impl_mv.write(impl.open_epoch, [Version(r) for r in account_rows(impl, read, rows)])
                left -= len(rows)
                read_rows += len(rows)
            left = allowance
            while left > 0 and (row := model.read_one(by_vnode)) is not None:
                model_mv.write(e, [Version(row)])
                left -= 1

        # the barrier closing e
        barrier = Barrier(
            EpochPair(e, epoch(i + 1)), BarrierKind.CHECKPOINT, Mutation.from_json(mutation)
        )
        was_forwarding = impl.phase is Phase.FORWARDING
        needed = impl.changes_needed(barrier)
        changes = []
        if needed is not None:
            assert needed.vnodes == tuple(sorted(owned))
            if was_forwarding:
                assert (needed.after, needed.upto) == (epoch(i - 1), e)
            changes = [
                c
                for c in upstream.change_log_range(needed.after, needed.upto)
                if c.vnode in needed.vnodes
            ]
        out = impl.on_barrier(barrier, changes)
        assert out.write_epoch == e
        assert out.rows == read_rows
        impl_mv.write(e, as_versions(out.emit))
        emitted = model.barrier(barrier.elapsed_ms, mutation, ACTOR)
        model_mv.write(
            e,
            [
                Version(new) if new is not None else Version(old, deleted=True)  # type: ignore[arg-type]
                for _, old, new in emitted
            ],
        )

        # the same view, progress, phase and finish flag at every barrier
        assert impl_mv.snapshot(e) == model_mv.snapshot(e), f"views differ at epoch {i}"
        impl_progress = {
            v: (p.state.value, p.current_pos, p.row_count) for v, p in impl.progress.items()
        }
        model_progress = {v: (p.state, p.pos, p.rows) for v, p in model.progress.items()}
        assert impl_progress == model_progress, f"progress differs at epoch {i}"
        assert out.finished == model.finished
        assert out.progress["phase"] == impl.phase.value == model.phase
        assert out.progress["replay_pending_epochs"] == len(model.buffered)
        # and the view is what the phase promises
        view = in_vnodes(impl_mv.snapshot(e), owned)
        if out.finished:
            assert view == in_vnodes(upstream.snapshot(e), owned)
        elif impl.phase is Phase.REPLAY:
            assert view == in_vnodes(upstream.snapshot(impl.replayed_upto), owned)
            assert impl.replayed_upto < e
        else:
            assert not out.emit
            reached = {
                v: p.current_pos
                for v, p in impl.progress.items()
                if p.state is not VnodeState.NOT_STARTED
            }
            assert view == in_vnodes(fixed, owned, reached)


def first_barrier(ex: ChainBackfill) -> None:
    assert not ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1)))).finished


def read_all(ex: ChainBackfill, rows: dict[int, list[Any]]) -> None:
    """Read the snapshot to its end, vnode rows given in pk order."""
    while (read := first_read(ex, 10)) is not None:
        got = [r for r in rows.get(read.vnode, []) if read.after is None or key_of(r) > read.after]
        account_rows(ex, read, got[: read.limit])


def test_an_empty_upstream_finishes_at_the_barrier_that_replays_everything() -> None:
    ex = ChainBackfill(1, range(4), key_of)
    first_barrier(ex)
    read_all(ex, {})
    assert ex.phase is Phase.SNAPSHOT and first_read(ex, 10) is None
    barrier = Barrier(EpochPair(epoch(1), epoch(2)))
    assert ex.changes_needed(barrier) == ChangeRange(epoch(0), epoch(1), (0, 1, 2, 3))
    out = ex.on_barrier(barrier, [])
    assert out.finished and ex.phase is Phase.FORWARDING
    assert all(p.state is VnodeState.COMPLETED for p in ex.progress.values())
    assert out.progress["replay_pending_epochs"] == 0
    # forwarding: each closed epoch's changes
    barrier = Barrier(EpochPair(epoch(2), epoch(3)))
    assert ex.changes_needed(barrier) == ChangeRange(epoch(1), epoch(2), (0, 1, 2, 3))


def test_a_change_during_the_snapshot_waits_for_the_replay() -> None:
    ex = ChainBackfill(1, [0], key_of, rate_limit=20)
    first_barrier(ex)  # 100 ms epochs at 20 rows/s: two rows per epoch
    snapshot = {0: [(0, "a"), (4, "b"), (12, "c")]}
    read_all(ex, snapshot)
    assert ex.progress[0].current_pos == (4,) and ex.phase is Phase.SNAPSHOT
    # the upstream inserted (8, "x") in epoch 1: remembered, not emitted
    barrier = Barrier(EpochPair(epoch(1), epoch(2)))
    assert ex.changes_needed(barrier) is None
    out = ex.on_barrier(barrier)
    assert out.emit == [] and not out.finished and out.progress["replay_pending_epochs"] == 1
    with pytest.raises(ValueError):
        ex.on_barrier(Barrier(EpochPair(epoch(1), epoch(2))))  # an epoch closes once
    read_all(ex, snapshot)  # one row, fewer than asked for: the end of the vnode
    assert ex.progress[0].state is VnodeState.COMPLETED and ex.total_rows == 3
    barrier = Barrier(EpochPair(epoch(2), epoch(3)))
    assert ex.changes_needed(barrier) == ChangeRange(epoch(0), epoch(2), (0,))
    insert = RowChange(Op.INSERT, 0, None, (8, "x"))
    out = ex.on_barrier(barrier, [insert])
    assert out.emit == [insert] and out.finished and out.write_epoch == epoch(2)


def test_the_replay_is_paced_and_catches_up() -> None:
    ex = ChainBackfill(1, [0], key_of, paused=True, replay_epochs_per_barrier=2)
    first_barrier(ex)
    for i in range(1, 5):  # paused: four epochs remembered, nothing read
        assert first_read(ex, 10) is None and each_read(ex, 10) == []
        mutation = Mutation(resume=frozenset({1})) if i == 4 else None
        out = ex.on_barrier(Barrier(EpochPair(epoch(i), epoch(i + 1)), mutation=mutation))
        assert out.emit == [] and out.rows == 0
    assert out.progress["replay_pending_epochs"] == 4
    read_all(ex, {0: [(0, "a")]})
    assert ex.total_rows == 1
    # five epochs to replay (1..5), two per barrier, one more added at each barrier
    ranges = []
    i = 5
    while ex.phase is not Phase.FORWARDING:
        barrier = Barrier(
            EpochPair(epoch(i), epoch(i + 1)), mutation=Mutation(pause=frozenset({1}))
        )
        needed = ex.changes_needed(barrier)
        assert needed is not None
        ranges.append((needed.after, needed.upto))
        ex.on_barrier(barrier, [])  # pausing does not stop the replay
        i += 1
    assert ranges == [
        (epoch(0), epoch(2)),
        (epoch(2), epoch(4)),
        (epoch(4), epoch(6)),
        (epoch(6), epoch(8)),
    ]
    with pytest.raises(ValueError):
        ChainBackfill(1, [0], key_of, replay_epochs_per_barrier=1)


def test_a_created_job_comes_back_forwarding() -> None:
    ex = ChainBackfill(1, [0, 1], key_of, finished=True)
    first = Barrier(EpochPair(epoch(3), epoch(4)))
    assert ex.changes_needed(first) is None
    assert ex.on_barrier(first).finished and first_read(ex, 10) is None
    barrier = Barrier(EpochPair(epoch(4), epoch(5)))
    assert ex.changes_needed(barrier) == ChangeRange(epoch(3), epoch(4), (0, 1))


@pytest.mark.parametrize(
    "epoch_index, after",
    [(1, (0,)), (0, None), (0, (4,))],  # another epoch; from the start; past the position
)
def test_a_read_from_another_epoch_or_position_is_refused(
    epoch_index: int, after: tuple[int] | None
) -> None:
    ex = ChainBackfill(1, [0], key_of)
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1))))
    first = first_read(ex, 1)
    assert first is not None and first.epoch == epoch(0)
    account_rows(ex, first, [(0, "a")])
    wrong = SnapshotRead(0, epoch(epoch_index), after, 5)
    with pytest.raises(ReadProvenanceError):
        account_summary(ex, wrong, 1, (8,))
    with pytest.raises(ReadProvenanceError):
        account_groups(ex, SnapshotBatchRead(wrong.epoch, ((0, after),), 5), {0: (1, (8,))})
    assert ex.progress[0].current_pos == (0,)


class _Chain:
    """Recoveries of a chain job: before it was created the view is truncated and fresh
    actors take a new snapshot (as the seed, no mid-backfill recovery); once created,
    they come back forwarding."""

    def actor(self, actor_id: int, vnodes: list[int], flow: JobFlow, created: Any) -> ActorPair:
        finished = bool(created)
        model = ChainReference(vnodes, rate_limit=flow.rate_limit, paused=flow.paused)
        if finished:
            model.finished = True
            model.progress = {v: ChainProgress("completed") for v in vnodes}
        return ActorPair(
            actor_id,
            vnodes,
            ChainBackfill(
                actor_id,
                vnodes,
                key_of,
                rate_limit=flow.rate_limit,
                paused=flow.paused,
                finished=finished,
            ),
            model,
        )

    def committed(self, actors: list[ActorPair], outs: list[Any]) -> Any:
        return all(out.finished for out in outs)  # the job is created at this checkpoint

    def keeps_view(self, created: Any) -> bool:
        return bool(created)

    def check(self, actor: ActorPair, view: Any, up: Upstream, e: int) -> None:
        ex = actor.impl
        if ex.phase is Phase.FORWARDING:
            assert_reached(view, up.store.snapshot(e), {v: ALL for v in actor.vnodes})
        elif ex.phase is Phase.REPLAY:
            truth = up.store.snapshot(ex.replayed_upto)
            assert_reached(view, truth, {v: ALL for v in actor.vnodes})
        else:
            reached = {
                v: ALL if p.state is VnodeState.COMPLETED else p.current_pos
                for v, p in ex.progress.items()
            }
            assert_reached(view, up.store.snapshot(ex.snapshot_epoch), reached)


@settings(max_examples=300, deadline=None)
@restores_and_rescales
def test_restores_and_rescales_keep_the_executors_equal_to_the_model(
    initial: dict[int, int], first_deal: list[int], history: list[Any], rate_limit: int | None
) -> None:
    """A chain job's actors at random barriers (not all checkpoints, random spacing),
    recovered at random points to the last checkpoint with the vnodes dealt to a new
    number of actors: executors and models agree at every barrier, and each actor's
    vnodes of the view are what its phase promises."""
    flow = JobFlow(rate_limit=rate_limit)
    recoveries, started = run_with_recoveries(_Chain(), initial, first_deal, history, flow)
    event(f"recoveries: {min(recoveries, 3)}+")
    event(
        f"came back created: {any(a.impl.phase is Phase.FORWARDING for s in started[1:] for a in s)}"
    )
