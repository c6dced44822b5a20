"""Shared vocabulary of the executor property tests that restore and rescale a job: an
upstream that rolls back with a recovery, epochs at random spacing, barriers that are
not all checkpoints, a job's flow-control state as the catalog keeps it, and the vnodes
of a job dealt to a random number of actors (docs: issue 30)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hypothesis import given
from hypothesis import strategies as st

from backfill_core.changes import Version
from backfill_core.epoch import EpochPair
from backfill_core.executors.messages import Barrier, BarrierKind, Mutation
from tests.kit.executors import VNODES, account_rows, epoch, first_read, key_of, new_store, vnode_of
from tests.kit.store_model import StoreModel

Row = tuple[Any, ...]
# a model's row-at-a-time view of one upstream change: (op, vnode, old, new)
UpstreamChange = tuple[str, int, Row | None, Row | None]

# what a user asks between two barriers: nothing, or a pause, a resume or a rate, each
# (op, rate, for this job?); one for another job of the graph leaves this job's actors be
flow_ops = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(("pause", "resume")), st.none(), st.booleans()),
    st.tuples(st.just("throttle"), st.one_of(st.none(), st.integers(0, 60)), st.booleans()),
)
# an actor of another job of the graph (this job's actors count from 1)
OTHER_JOB_ACTOR = 1_000_000

# the owner (an actor index) of each vnode; the distinct indices are the actors
deals = st.lists(st.integers(0, 3), min_size=VNODES, max_size=VNODES)

# how far apart two barriers are (ms), and whether one is a checkpoint
gaps_ms = st.one_of(st.integers(1, 120), st.integers(121, 2_000))
checkpoints = st.one_of(st.just(True), st.booleans())


def deal_groups(owners: Sequence[int]) -> list[list[int]]:
    """The vnodes of each actor, in the order the actors first appear."""
    groups: dict[int, list[int]] = {}
    for v, owner in enumerate(owners):
        groups.setdefault(owner, []).append(v)
    return list(groups.values())


def barrier_kind(checkpoint: bool) -> BarrierKind:
    return BarrierKind.CHECKPOINT if checkpoint else BarrierKind.BARRIER


@dataclass
class JobFlow:
    """A job's paused flag and rate limit as the catalog keeps them: what actors that a
    recovery starts begin with, and what mutations tell the running ones."""

    paused: bool = False
    rate_limit: int | None = None

    def mutation(self, op: Any, actors: Iterable[int]) -> dict[str, Any] | None:
        """The barrier mutation for ``op``, naming this job's ``actors`` (whose flags it
        updates) or another job's."""
        if op is None:
            return None
        name, rate, mine = op
        ids = sorted(actors) if mine else [OTHER_JOB_ACTOR]
        if name == "throttle":
            if mine:
                self.rate_limit = rate
            return {"throttle": {str(a): rate for a in ids}}
        if mine:
            self.paused = name == "pause"
        return {name: ids}

    def check(self, impl: Any) -> None:
        """An actor's flow state is its job's row in the catalog (after every barrier)."""
        assert (impl.paused, impl.rate_limit) == (self.paused, self.rate_limit), (
            "the actor's paused flag or rate limit is not its job's"
        )


@dataclass
class Upstream:
    """The upstream table: versions per epoch for the executors, one row change at a time
    for the models, and its state at every epoch so that a recovery can roll it back."""

    store: StoreModel = field(default_factory=new_store)
    state: dict[int, int] = field(default_factory=dict)
    history: dict[int, dict[int, int]] = field(default_factory=dict)

    def load(self, e: int, rows: dict[int, int]) -> None:
        self.store.write(e, [Version((k, v)) for k, v in rows.items()])
        self.state = dict(rows)
        self.history[e] = dict(rows)

    def write(self, e: int, ops: Iterable[tuple[int, int, bool]]) -> list[UpstreamChange]:
        """Apply ``(key, value, delete?)`` ops at epoch ``e``; returns them as row changes."""
        versions, changes = [], []
        for k, v, delete in ops:
            old = (k, self.state[k]) if k in self.state else None
            if old is not None and delete:
                del self.state[k]
                changes.append(("delete", vnode_of(old), old, None))
                versions.append(Version(old, deleted=True))
            elif not delete or old is None:
                self.state[k] = v
                changes.append(("update" if old else "insert", vnode_of((k,)), old, (k, v)))
                versions.append(Version((k, v)))
        self.store.write(e, versions)
        self.history[e] = dict(self.state)
        return changes

    def rollback(self, committed: int) -> None:
        self.store.rollback(committed)
        self.state = dict(self.history[committed])
        self.history = {e: s for e, s in self.history.items() if e <= committed}

    def by_vnode(self, e: int) -> dict[int, list[Row]]:
        out: dict[int, list[Row]] = {}
        for v, r in self.store.snapshot(e):
            out.setdefault(v, []).append(r)
        return out

    def rows_of(self, e: int) -> Callable[[Any], list[Row]]:
        """What a snapshot read at ``e`` returns (rows of its vnode after its key)."""
        snap = self.store.snapshot(e)

        def read(r: Any) -> list[Row]:
            return [
                row
                for v, row in snap
                if v == r.vnode and (r.after is None or key_of(row) > r.after)
            ][: r.limit]

        return read


def epochs_from_gaps(gaps: Iterable[int], start_ms: int = 100) -> list[int]:
    """Epochs whose physical times are ``gaps`` ms apart, after ``epoch(0)``'s."""
    out = [epoch(0)]
    ms = start_ms
    for g in gaps:
        ms += g
        out.append(ms << 16)
    return out


ALL = "all"  # a vnode whose every row the view holds


def assert_reached(
    view: list[tuple[int, Row]], truth: list[tuple[int, Row]], reached: dict[int, Any]
) -> None:
    """Per vnode: ``ALL`` (the view holds the upstream's rows), a key (the rows at or
    below it, and none above), or None (no rows yet)."""
    for v, upto in reached.items():
        mine = [r for w, r in view if w == v]
        if upto == ALL:
            assert mine == [r for w, r in truth if w == v], f"vnode {v} is not the upstream's"
        elif upto is None:
            assert not mine, f"vnode {v} has rows before its backfill reached it"
        else:
            theirs = [r for w, r in truth if w == v and key_of(r) <= upto]
            assert [r for r in mine if key_of(r) <= upto] == theirs, f"vnode {v} differs"
            assert all(key_of(r) <= upto for r in mine), f"vnode {v} has rows past {upto}"


def write_emit(mv: StoreModel, e: int, emit: Iterable[Any]) -> None:
    """Write an executor's emitted ``RowChange``s at ``e``."""
    mv.write(e, [Version(c.row, deleted=True) if c.new is None else Version(c.new) for c in emit])


def write_emitted(mv: StoreModel, e: int, emitted: Iterable[tuple[Any, Any, Any]]) -> None:
    """Write a model's emitted ``(op, old, new)`` at ``e``."""
    mv.write(
        e,
        [
            Version(new) if new is not None else Version(old, deleted=True)
            for _, old, new in emitted
        ],
    )


def changes_for(store: StoreModel, needed: Any) -> list[Any]:
    """The upstream's changes an executor asked for (``ChangeRange`` or None)."""
    if needed is None:
        return []
    return [
        c for c in store.change_log_range(needed.after, needed.upto) if c.vnode in needed.vnodes
    ]


def read_single(
    impl: Any,
    model: Any,
    up: Upstream,
    sizes: tuple[int, int],
    mvs: tuple[StoreModel, StoreModel, int],
) -> None:
    """The open epoch's snapshot reads one vnode at a time, ``sizes`` = (rows that fit
    before the barrier, read chunk): the executor's reads, then the model's rows."""
    allowance, chunk = sizes
    impl_mv, model_mv, e = mvs
    rows_of = up.rows_of(impl.snapshot_epoch)
    left = allowance
    while left > 0 and (read := first_read(impl, min(chunk, left))) is not None:
        rows = account_rows(impl, read, rows_of(read))
        impl_mv.write(impl.open_epoch, [Version(r) for r in rows])
        left -= len(rows)
    left, by_vnode = allowance, up.by_vnode(impl.snapshot_epoch)
    while left > 0 and (row := model.read_one(by_vnode)) is not None:
        model_mv.write(e, [Version(row)])
        left -= 1


def progress_pairs(impl: Any, model: Any) -> tuple[dict[int, Any], dict[int, Any]]:
    """An executor's and its model's per-vnode ``(state, position, rows)``."""
    return (
        {v: (p.state.value, p.current_pos, p.row_count) for v, p in impl.progress.items()},
        {v: (p.state, p.pos, p.rows) for v, p in model.progress.items()},
    )


# one epoch of a job's history: upstream ops, rows that fit before the barrier, what the
# user asks, read chunk, the gap to the next barrier, checkpoint?, a recovery's new deal
job_histories = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 15), st.integers(0, 9), st.booleans()), max_size=6),
        st.one_of(st.just(1_000), st.integers(0, 8)),
        flow_ops,
        st.integers(1, 4),
        gaps_ms,
        checkpoints,
        st.one_of(st.none(), st.none(), deals),
    ),
    min_size=2,
    max_size=16,
)


# what a restore-and-rescale property test draws: the upstream's first rows, the first
# deal of the vnodes, the job's history and its first rate limit
restores_and_rescales = given(
    initial=st.dictionaries(st.integers(0, 15), st.integers(0, 9), max_size=16),
    first_deal=deals,
    history=job_histories,
    rate_limit=st.one_of(st.none(), st.integers(0, 50)),
)


@dataclass
class ActorPair:
    """One actor of the job: the executor and the model it must agree with."""

    id: int
    vnodes: list[int]
    impl: Any
    model: Any


class Kind(Protocol):
    """What differs between the kinds a job's recoveries are driven for."""

    def actor(self, actor_id: int, vnodes: list[int], flow: JobFlow, restored: Any) -> ActorPair:
        """A new actor of ``vnodes``, from what the last checkpoint committed (None: fresh)."""
        ...

    def committed(self, actors: list[ActorPair], outs: list[Any]) -> Any:
        """What a checkpoint commits: the state new actors start from."""
        ...

    def keeps_view(self, committed: Any) -> bool:
        """Whether a recovery to ``committed`` keeps the view (False: truncated)."""
        ...

    def check(self, actor: ActorPair, view: list[tuple[int, Row]], up: Upstream, e: int) -> None:
        """The view of the actor's vnodes is what its progress promises at ``e``."""
        ...


def run_with_recoveries(
    kind: Kind, initial: dict[int, int], first_deal: list[int], history: list[Any], flow: JobFlow
) -> tuple[int, list[list[ActorPair]]]:
    """Drive a job through ``history``: every actor reads and handles every barrier, the
    executors and the models must agree, and a recovery rolls the upstream and the views
    back to the last checkpoint and deals the vnodes to new actors restored from it.
    Returns the number of recoveries and the actors each started with."""
    epochs = epochs_from_gaps([*(h[4] for h in history), 100])
    up = Upstream()
    up.load(epochs[0], initial)
    ids = itertools.count(1)
    impl_mv, model_mv = new_store(), new_store()

    def start(owners: list[int], restored: Any, prev: int, curr: int) -> list[ActorPair]:
        actors = []
        for vnodes in deal_groups(owners):
            a = kind.actor(next(ids), vnodes, flow, restored)
            first = Barrier(EpochPair(prev, curr), BarrierKind.INITIAL)
            assert a.impl.changes_needed(first) is None
            assert not a.impl.on_barrier(first).emit
            assert not a.model.barrier(first.elapsed_ms, None, a.id)
            flow.check(a.impl)
            actors.append(a)
        return actors

    actors = start(first_deal, None, epochs[0], epochs[1])
    started = [actors]
    committed: tuple[int, Any] = (epochs[0], None)
    recoveries = 0
    for i, (ops, allowance, op, chunk, _, checkpoint, redeal) in enumerate(history, start=1):
        e, nxt = epochs[i], epochs[i + 1]
        for change in up.write(e, ops):
            for a in actors:
                a.model.upstream(*change)
        for a in actors:  # each actor reads its vnodes of its snapshot
            read_single(a.impl, a.model, up, (allowance, chunk), (impl_mv, model_mv, e))

        mutation = flow.mutation(op, (a.id for a in actors))
        barrier = Barrier(EpochPair(e, nxt), barrier_kind(checkpoint), Mutation.from_json(mutation))
        outs = []
        for a in actors:
            out = a.impl.on_barrier(barrier, changes_for(up.store, a.impl.changes_needed(barrier)))
            outs.append(out)
            write_emit(impl_mv, e, out.emit)
            write_emitted(model_mv, e, a.model.barrier(barrier.elapsed_ms, mutation, a.id))
            assert out.finished == a.model.finished
            impl_progress, model_progress = progress_pairs(a.impl, a.model)
            assert impl_progress == model_progress, f"progress differs at epoch {i}"
            flow.check(a.impl)
        view = impl_mv.snapshot(e)
        assert view == model_mv.snapshot(e), f"views differ at epoch {i}"
        for a in actors:
            kind.check(a, view, up, e)

        if checkpoint:
            committed = (e, kind.committed(actors, outs))
        if redeal is not None:  # a recovery: back to the last checkpoint, vnodes dealt anew
            recoveries += 1
            at, restored = committed
            up.rollback(at)
            for mv in (impl_mv, model_mv):
                mv.rollback(at if kind.keeps_view(restored) else 0)
            actors = start(redeal, restored, at, nxt)
            started.append(actors)
    return recoveries, started
