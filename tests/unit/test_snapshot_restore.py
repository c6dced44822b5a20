"""A snapshot backfill job recovered mid-backfill agrees with the reference model.

The job's vnodes are dealt to a random number of actors; the upstream (the main graph,
which a recovery of the creating graph does not roll back) seals epochs at random
spacing; barriers are not all checkpoints. At random barriers the creating graph
recovers: its view goes back to the last checkpoint and the vnodes are dealt anew to
actors restored from the progress committed there (phase 1: each vnode's position, so
an actor may mix consumed and unfinished vnodes; phase 2: every vnode consumed at the
committed epoch, the log store replayed on from there). Executors and models agree at
every barrier, and the view is what the phase promises (docs: issue 30).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from backfill_core.changes import Op, RowChange, Version
from backfill_core.epoch import EpochPair, lag_ms, physical_time
from backfill_core.executors.messages import Barrier, BarrierKind, Mutation
from backfill_core.executors.snapshot import Phase, SnapshotBackfill, VnodeState
from tests.kit.executors import VNODES, account_rows, first_read, in_vnodes, key_of, new_store
from tests.kit.rescale import JobFlow, barrier_kind, checkpoints, deal_groups, deals, flow_ops
from tests.kit.rescale import Upstream as KitUpstream
from tests.models.snapshot_reference import SnapshotReference

Row = tuple[Any, ...]
Ops = list[tuple[int, int, bool]]
ALL_VNODES = set(range(VNODES))


def fake(k: int) -> int:
    return k << 16


def as_versions(changes: list[RowChange]) -> list[Version]:
    return [
        Version(c.new) if c.op is not Op.DELETE else Version(c.row, deleted=True) for c in changes
    ]


def model_versions(changes: list[Any]) -> list[Version]:
    return [
        Version(new) if new is not None else Version(old, deleted=True) for _, old, new in changes
    ]


class Upstream(KitUpstream):
    """The main graph's table (never rolled back by the creating graph's recoveries):
    epochs at random (even) spacing, each sealed with its row changes kept so that a
    model started by a recovery can buffer them again."""

    def __init__(self, times_ms: list[int], initial: dict[int, int]) -> None:
        super().__init__()
        self.times_ms = times_ms
        self.latest = 0  # index of the latest sealed epoch
        self.sealed: list[tuple[int, list[Any]]] = []
        self.models: list[SnapshotReference] = []
        self.load(self.epoch(0), initial)

    def epoch(self, i: int) -> int:
        return self.times_ms[i] << 16

    def seal(self, ops: Ops) -> None:
        e = self.epoch(self.latest + 1)
        changes = self.write(e, ops)
        self.latest += 1
        self.sealed.append((e, changes))
        for m in self.models:
            feed(m, e, changes)

    def index(self, e: int) -> int:
        return self.times_ms.index(physical_time(e))


def feed(model: SnapshotReference, e: int, changes: list[Any]) -> None:
    for change in changes:
        model.upstream(*change)
    model.upstream_barrier(e)


@dataclass
class Actor:
    id: int
    impl: SnapshotBackfill
    model: SnapshotReference
    last_latest: int | None = None  # the upstream epoch the last barrier named

    def elapsed_ms(self, barrier: Barrier, latest: int) -> int:
        """What the executor applies its rate limit over (the upstream's advance)."""
        if self.last_latest is None:
            return barrier.elapsed_ms
        return lag_ms(latest, self.last_latest)


ops_st = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 9), st.booleans()), max_size=6)
# one barrier each: upstream epochs sealed before it (phase 1) or that the upstream wants
# to seal (phase 2, held back by the lag cap), snapshot rows that fit before it, what the
# user asks, read chunk, checkpoint?, a recovery's new deal
job_steps = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.one_of(st.just(1_000), st.integers(0, 8)),
        flow_ops,
        st.integers(1, 4),
        checkpoints,
        st.one_of(st.none(), deals),
    ),
    max_size=24,
)


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.integers(0, 15), st.integers(0, 9), max_size=16),
    before=st.lists(ops_st, max_size=2),
    gaps=st.lists(st.integers(1, 60), min_size=1, max_size=8),
    first_deal=deals,
    steps=job_steps,
    dml=st.lists(ops_st, max_size=20),
    rate_limit=st.one_of(st.none(), st.integers(0, 50)),
)
def test_restores_and_rescales_keep_the_executors_equal_to_the_model(
    initial: dict[int, int],
    before: list[Ops],
    gaps: list[int],
    first_deal: list[int],
    steps: list[Any],
    dml: list[Ops],
    rate_limit: int | None,
) -> None:
    # even gaps: the seed halves raw epochs, the executor whole milliseconds
    times = itertools.accumulate(itertools.islice(itertools.cycle(gaps), 3_000), initial=500)
    up = Upstream([2 * t for t in times], initial)
    for ops in before:
        up.seal(ops)
    snapshot_epoch = up.epoch(up.latest)
    fixed = up.store.snapshot(snapshot_epoch)
    by_vnode: dict[int, list[Row]] = {}
    for v, r in fixed:
        by_vnode.setdefault(v, []).append(r)
    flow = JobFlow(rate_limit=rate_limit)
    ids = itertools.count(1)
    impl_mv, model_mv = new_store(), new_store()
    dml_iter = iter(dml)

    def start(owners: list[int], committed: tuple[int, Any, Any]) -> list[Actor]:
        """Actors of a new deal, restored from the last checkpoint."""
        at, impl_progress, model_progress = committed
        up.models = []
        actors = []
        for vnodes in deal_groups(owners):
            aid = next(ids)
            impl = SnapshotBackfill(
                aid,
                vnodes,
                key_of,
                snapshot_epoch,
                rate_limit=flow.rate_limit,
                paused=flow.paused,
                restore={v: impl_progress[v] for v in vnodes if v in impl_progress},
            )
            model = SnapshotReference(
                vnodes,
                by_vnode,
                snapshot_epoch,
                rate_limit=flow.rate_limit,
                paused=flow.paused,
                progress={v: copy.copy(model_progress[v]) for v in vnodes if v in model_progress},
                log_start=at if at >= snapshot_epoch else 0,
            )
            for e, changes in up.sealed:  # the upstream buffer starts where the job resumes
                if e > model.latest:
                    feed(model, e, changes)
            up.models.append(model)
            actors.append(Actor(aid, impl, model))
        return actors

    def barrier(actors: list[Actor], b: Barrier, mutation: Any, poll: Any = None) -> None:
        """Every actor handles ``b``; executors and models must agree."""
        latest = up.epoch(up.latest)
        for a in actors:
            needed = a.impl.changes_needed(b)
            changes = [] if needed is None else up.store.change_log_range(needed.after, needed.upto)
            elapsed = a.elapsed_ms(b, latest)
            out = a.impl.on_barrier(b, changes, upstream_latest_epoch=latest)
            polls = [poll] if poll is not None else []
            emitted = a.model.barrier(b.epoch.prev, b.epoch.curr, elapsed, mutation, a.id, *polls)
            a.last_latest = latest
            impl_mv.write(b.epoch.prev, as_versions(out.emit))
            model_mv.write(b.epoch.prev, model_versions(emitted))
            impl_progress = {
                v: (p.state.value, p.current_pos, p.row_count, p.epoch)
                for v, p in a.impl.progress.items()
            }
            model_progress = {
                v: (p.state, p.pos, p.rows, p.epoch) for v, p in a.model.progress.items()
            }
            assert impl_progress == model_progress, f"progress differs at {b.epoch}"
            assert out.finished == a.model.finished
            assert a.impl.phase.value == a.model.phase
            cap = a.model.max_pending_epoch_lag
            assert a.impl.max_pending_epoch_lag_ms == (None if cap is None else physical_time(cap))
            flow.check(a.impl)
        view = impl_mv.snapshot(b.epoch.prev)
        assert view == model_mv.snapshot(b.epoch.prev), f"views differ at {b.epoch}"

    def commit(actors: list[Actor], at: int) -> tuple[int, Any, Any]:
        impl_progress = {v: p for a in actors for v, p in a.impl.progress.items()}
        model_progress = {v: copy.copy(p) for a in actors for v, p in a.model.progress.items()}
        return at, impl_progress, model_progress

    committed: tuple[int, Any, Any] = (0, {}, {})
    actors = start(first_deal, committed)
    k = 1  # the last fake epoch opened
    barrier(actors, Barrier(EpochPair(0, fake(k)), BarrierKind.INITIAL), None)
    todo = iter(steps)
    recoveries = 0
    for _ in range(1_000):
        if all(a.impl.finished for a in actors):
            break
        step = next(todo, None)
        if step is None:  # the user lets the job run to its end
            lift = (
                ("resume", None, True)
                if flow.paused
                else ("throttle", None, True)
                if flow.rate_limit == 0
                else None
            )
            step = (1, 1_000, lift, 4, True, None)
        count, allowance, op, chunk, checkpoint, redeal = step
        mutation = flow.mutation(op, (a.id for a in actors))
        kind = barrier_kind(checkpoint)
        prev = actors[0].impl.open_epoch
        if actors[0].impl.phase is Phase.SNAPSHOT:
            # phase 1: fake barriers; the upstream seals epochs meanwhile, never held back
            consumed = all(a.impl.finished_snapshot for a in actors)
            for a in actors:
                left = allowance
                while left > 0 and (read := first_read(a.impl, min(chunk, left))) is not None:
                    rows = [
                        r
                        for r in by_vnode.get(read.vnode, [])
                        if read.after is None or key_of(r) > read.after
                    ][: read.limit]
                    written = account_rows(a.impl, read, rows)
                    impl_mv.write(prev, [Version(r) for r in written])
                    left -= len(rows)
                left = allowance
                while left > 0 and (row := a.model.read_one()) is not None:
                    model_mv.write(prev, [Version(row)])
                    left -= 1
            for _ in range(count):
                assert all(a.impl.upstream_may_advance(up.epoch(up.latest)) for a in actors)
                up.seal(next(dml_iter, []))
            if not consumed:
                k += 1
            curr = snapshot_epoch if consumed else fake(k)
            barrier(
                actors, Barrier(EpochPair(prev, curr), kind, Mutation.from_json(mutation)), mutation
            )
            reached = {
                v: (p.current_pos if p.state is VnodeState.CONSUMING else (1 << 30,))
                for a in actors
                for v, p in a.impl.progress.items()
            }
            assert impl_mv.snapshot(prev) == in_vnodes(fixed, ALL_VNODES, reached)
        else:
            # phase 2: one upstream epoch per barrier; the meta lets the upstream seal
            # epochs while every actor's lag cap allows (none before the log store starts)
            wanted = count
            while wanted > 0 and all(
                a.impl.upstream_may_advance(up.epoch(up.latest)) for a in actors
            ):
                up.seal(next(dml_iter, []))
                wanted -= 1

            def poll(held: bool = wanted > 0) -> bool:
                """The model lets the upstream run on: it was not held back either."""
                assert not held, "the executor held the upstream back, the model not"
                return False

            curr = up.epoch(up.index(prev) + 1)
            b = Barrier(EpochPair(prev, curr), kind, Mutation.from_json(mutation))
            barrier(actors, b, mutation, poll)
            # aligned epochs: the view at every replayed epoch is the upstream at that epoch
            assert impl_mv.snapshot(prev) == up.store.snapshot(prev)
        if checkpoint:
            committed = commit(actors, prev)
        if redeal is not None and not all(a.impl.finished for a in actors):
            # a recovery: the view back to the last checkpoint, the vnodes dealt anew
            recoveries += 1
            at = committed[0]
            for mv in (impl_mv, model_mv):
                mv.rollback(at)
            actors = start(redeal, committed)
            mixed = any(len({p.state for p in a.impl.progress.values()}) > 1 for a in actors)
            if at < snapshot_epoch:
                k += 1
                curr = fake(k)
            else:
                curr = up.epoch(up.index(at) + 1)
            event(f"recovered in phase {1 if at < snapshot_epoch else 2}, mixed: {mixed}")
            barrier(actors, Barrier(EpochPair(at, curr), BarrierKind.INITIAL), None)
    else:
        raise AssertionError("the job never finished")
    assert all(a.impl.phase is Phase.FINISHING for a in actors)
    event(f"recoveries: {min(recoveries, 3)}+")
