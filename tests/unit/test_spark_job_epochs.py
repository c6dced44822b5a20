"""A Spark job reads and writes at one pair of epochs for all the actors of a job it
serves: the path of one epoch plans a job per pair, and a plan over actors at different
epochs is refused (the worker reports the error as a failure and the graph recovers),
on the path of one epoch and in rounds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill
from backfill_core.executors.messages import Barrier, BarrierKind
from spark_workers.rounds import RoundsJob
from spark_workers.spark_path import ActorEpochsDiffer, SparkPath, job_epochs
from tests.kit.executors import epoch, first_read, key_of


def runner(actor_id: int, vnodes: list[int], barriers: int) -> Any:
    """An actor of job 1 (only what planning a Spark job asks of it) that handled
    ``barriers`` barriers: it reads at the last one's ``prev`` and writes at its ``curr``."""
    ex = ArrangementBackfill(actor_id, vnodes, key_of)
    for i in range(barriers):
        ex.on_barrier(Barrier(EpochPair(epoch(i), epoch(i + 1)), BarrierKind.CHECKPOINT))
    return SimpleNamespace(
        actor_id=actor_id,
        job_id=1,
        kind="arrangement",
        executor=ex,
        remaining_estimate=lambda conn: 100,
    )


def test_actors_at_one_pair_of_epochs_give_it_to_the_job() -> None:
    assert job_epochs([runner(1, [0, 1], 2), runner(2, [2, 3], 2)]) == (epoch(1), epoch(2))


def test_the_path_of_one_epoch_plans_one_job_per_pair_of_epochs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Actors of one job handle a poll's barriers one after another: one an epoch ahead
    gets a Spark job of its own, and a plan over both is refused before any Spark job."""
    path = SparkPath("local[1]", "postgresql://nowhere/none")
    behind, ahead, also_behind = runner(1, [0], 1), runner(2, [1, 2], 2), runner(3, [3], 1)
    # each has reads to do, each at its own epochs: one plan cannot serve both
    assert first_read(behind.executor, 10).epoch != first_read(ahead.executor, 10).epoch
    with pytest.raises(ActorEpochsDiffer):
        path._run_job([behind, ahead], 1_000)
    assert path.jobs == 0 and path._spark is None  # refused before any Spark job
    planned: list[list[int]] = []

    def run_job(runners: list[Any], max_rows: int) -> int:
        planned.append([r.actor_id for r in runners])
        return 0

    monkeypatch.setattr(path, "_run_job", run_job)
    path.run_epoch([behind, ahead, also_behind], 1_000)
    assert sorted(planned) == [[1, 3], [2]]


def test_rounds_refuse_actors_at_different_epochs() -> None:
    path = SparkPath("local[1]", "postgresql://nowhere/none")
    job = RoundsJob(path, [runner(1, [0, 1], 1), runner(2, [2, 3], 2)], None, 10, lambda: None)
    with pytest.raises(ActorEpochsDiffer):
        job.start()
    assert path.rounds_jobs == 0 and not job.running
