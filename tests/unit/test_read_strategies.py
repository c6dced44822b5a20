"""The worker's read strategies (``spark_workers.reads``): which one reads for an actor is
decided in one place, from the settings, the throttle, the rows left and whether the view
runs inside Postgres; every strategy has the interface's methods."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from spark_workers.actors import ReadsFrom
from spark_workers.reads import CHUNK_ROWS, ReadStrategy, Strategies
from spark_workers.settings import WorkerSettings


def actor(
    actor_id: int,
    *,
    job_id: int = 1,
    kind: str = "arrangement",
    budget: int | None = None,
    left: int = 1_000_000,
    pushed: bool = True,
) -> Any:
    """What choosing asks of an actor: its kind, throttle, rows left and view's SQL form."""
    return SimpleNamespace(
        actor_id=actor_id,
        job_id=job_id,
        kind=kind,
        reads_from=ReadsFrom.KAFKA if kind == "source" else ReadsFrom.STATE_STORE,
        pushed_where="true" if pushed else None,
        executor=SimpleNamespace(budget=budget, paused=False),
        has_reads=lambda: True,
        held=False,  # read by the job spanning epochs that runs
        remaining_estimate=lambda conn=None: left,
    )


class Context:
    """A worker as the strategies see it (``ReadContext``), with Spark but no session."""

    def __init__(self, runners: list[Any], **settings: Any) -> None:
        self.settings = WorkerSettings(**settings)
        self.runners = {r.actor_id: r for r in runners}
        self.conn: Any = None
        self.spark: Any = SimpleNamespace(pushdown=True)

    def forget_if_dropped(self, actor_ids: list[int]) -> bool:
        return False

    def recovered_graph(self, incarnations: list[tuple[int, int]]) -> int | None:
        return None

    @contextmanager
    def unless_dropped(self, runners: Sequence[Any]) -> Iterator[None]:
        yield

    def want_barrier(self) -> None:
        pass


def chosen(
    ctx: Context, *, spanning_runs: bool = False
) -> tuple[dict[int, ReadStrategy], Strategies]:
    """Each actor's strategy (``spanning_runs``: while a job spanning epochs runs)."""
    reads = Strategies(ctx)
    if spanning_runs:
        held = [r for r in ctx.runners.values() if r.held]
        reads.spanning.job = SimpleNamespace(runners=held)  # type: ignore[assignment]
    sized = {r.actor_id for r in reads.spark_sized()}
    return {
        r.actor_id: reads.strategy_for(r, spark_sized=r.actor_id in sized)
        for r in ctx.runners.values()
    }, reads


def test_each_way_of_moving_data_has_its_strategy() -> None:
    ctx = Context(
        [
            actor(1, left=10),  # small: the driver
            actor(2, job_id=2),  # large: Spark
            actor(3, job_id=3, kind="source"),  # large source: Kafka through Spark
            actor(4, job_id=4, kind="source", left=10),  # small source: Kafka on the driver
        ]
    )
    got, reads = chosen(ctx)
    assert got == {
        1: reads.driver,
        2: reads.spark_epoch,
        3: reads.kafka_spark,
        4: reads.kafka_driver,
    }
    assert reads.budget(reads.driver) == reads.budget(reads.kafka_driver) == CHUNK_ROWS
    assert reads.budget(reads.spark_epoch) == ctx.settings.spark_epoch_rows


def test_rows_left_count_per_job() -> None:
    """Two actors of one job, each under the threshold, together over it: Spark."""
    ctx = Context([actor(1, left=60_000), actor(2, left=60_000)], spark_min_rows=100_000)
    got, reads = chosen(ctx)
    assert set(got.values()) == {reads.spark_epoch}


def test_throttle_and_settings_keep_reads_on_the_driver() -> None:
    got, reads = chosen(Context([actor(1, budget=10)]))
    assert got[1] is reads.driver  # throttled under spark_min_rows per epoch
    got, reads = chosen(Context([actor(1)], spark_mode="never"))
    assert got[1] is reads.driver
    got, reads = chosen(Context([actor(1, left=1)], spark_mode="always"))
    assert got[1] is reads.spark_epoch


def test_a_job_spanning_epochs_holds_spark() -> None:
    """While one runs, its actors are its own, and the others' large reads go to the
    driver (its tasks hold Spark's cores)."""
    mine, other, source = actor(1), actor(2, job_id=2), actor(3, job_id=3, kind="source")
    mine.held = True
    got, reads = chosen(Context([mine, other, source]), spanning_runs=True)
    assert got == {1: reads.spanning, 2: reads.driver, 3: reads.kafka_driver}


@pytest.mark.parametrize(
    ("runner", "settings", "eligible"),
    [
        (actor(1), {}, True),
        (actor(1, kind="snapshot"), {}, True),
        (actor(1, budget=10), {}, False),  # throttled: reads its budget per epoch
        (actor(1, pushed=False), {}, False),  # the view does not run inside Postgres
        (actor(1, kind="source"), {}, False),
        (actor(1), {"spark_rounds": False}, False),
    ],
)
def test_which_actors_can_read_in_a_job_spanning_epochs(
    runner: Any, settings: dict[str, Any], eligible: bool
) -> None:
    _, reads = chosen(Context([runner], **settings))
    assert reads.spanning.eligible(runner) is eligible


def test_every_strategy_has_the_interface() -> None:
    _, reads = chosen(Context([]))
    methods = ("wants", "read", "before_barrier", "after_barrier", "supersede", "stop")
    for strategy in reads.all:
        assert all(callable(getattr(strategy, m, None)) for m in methods), strategy
