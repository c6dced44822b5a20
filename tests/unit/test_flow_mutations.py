"""Pause, resume and throttle apply to the actors they name (issue 30): a graph runs
several jobs, so another job's pause must leave an actor reading and another job's
resume must leave a paused actor paused, in every executor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill
from backfill_core.executors.chain import ChainBackfill
from backfill_core.executors.messages import Barrier, Mutation
from backfill_core.executors.snapshot import SnapshotBackfill
from backfill_core.executors.source import SourceBackfill
from tests.kit.executors import ACTOR, OTHER_JOB_ACTOR, epoch, first_read, key_of

OTHER = frozenset({OTHER_JOB_ACTOR})
MINE = frozenset({ACTOR})


@dataclass
class Kind:
    """How to build an executor of one kind, its epochs, a barrier and whether it reads."""

    build: Callable[[], Any]
    at: Callable[[int], int]  # the i-th epoch of its barriers
    barrier: Callable[[Any, Barrier], Any]
    reads: Callable[[Any], bool]


def _source() -> SourceBackfill:
    ex = SourceBackfill(ACTOR, ["0"])
    ex.on_backfill_info({"0": 100})
    return ex


KINDS = {
    "arrangement": Kind(
        lambda: ArrangementBackfill(ACTOR, [0], key_of),
        epoch,
        lambda ex, b: ex.on_barrier(b),
        lambda ex: first_read(ex, 10) is not None,
    ),
    "chain": Kind(
        lambda: ChainBackfill(ACTOR, [0], key_of),
        epoch,
        lambda ex, b: ex.on_barrier(b, []),
        lambda ex: first_read(ex, 10) is not None,
    ),
    "snapshot": Kind(
        # phase 1 runs on fake epochs, far below the snapshot's
        lambda: SnapshotBackfill(ACTOR, [0], key_of, epoch(100)),
        lambda i: i << 16,
        lambda ex, b: ex.on_barrier(b),
        lambda ex: first_read(ex, 10) is not None,
    ),
    "source": Kind(
        _source,
        epoch,
        lambda ex, b: ex.on_barrier(b, []),
        lambda ex: ex.plan_reads(10) != [],
    ),
}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_pause_and_resume_apply_to_the_actors_they_name_only(name: str) -> None:
    kind = KINDS[name]
    ex = kind.build()
    steps: list[tuple[Mutation | None, bool]] = [
        (None, True),
        (Mutation(pause=OTHER), True),  # another job's pause: this actor reads on
        (Mutation(throttle={OTHER_JOB_ACTOR: 0}), True),
        (Mutation(pause=MINE | OTHER), False),
        (Mutation(resume=OTHER), False),  # another job's resume: this one stays paused
        (Mutation(pause=OTHER, resume=OTHER), False),
        (Mutation(resume=MINE), True),
    ]
    for i, (mutation, reading) in enumerate(steps):
        kind.barrier(ex, Barrier(EpochPair(kind.at(i), kind.at(i + 1)), mutation=mutation))
        assert ex.paused is not reading, f"step {i}: {mutation}"
        assert kind.reads(ex) is reading, f"step {i}: {mutation}"
        assert ex.rate_limit is None


def test_a_mutation_names_its_actors_in_json() -> None:
    got = Mutation.from_json({"pause": [3, 4], "resume": [], "throttle": {"3": 5}})
    assert got == Mutation(pause=frozenset({3, 4}), throttle={3: 5})
    assert Mutation.from_json({"resume": ["7"]}) == Mutation(resume=frozenset({7}))
