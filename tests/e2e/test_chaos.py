"""Chaos in CI: a handful of seeds, chosen so that together they inject every fault and
run every job kind (checked below, so a change of the plan cannot quietly drop one).
Long runs: ``python -m tests.kit.chaos --minutes 30``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.embedded_pg import EmbeddedPostgres
from tests.kit.chaos import run_seed
from tests.kit.chaos_plan import FAULTS, TABLE_KINDS, Scenario, draw
from tests.kit.kafka import MockKafka

CI_SEEDS = (14, 43, 56, 2398)


def merges_finished_and_unfinished(plan: Scenario) -> bool:
    """The plan rescales a table job of a skewed table to fewer actors mid-backfill: its
    light actors have finished, so an actor is dealt completed and unfinished vnodes."""
    return plan.workload.skewed and any(
        f.kind == "rescale"
        and plan.jobs[f.job].kind != "source"
        and f.value is not None
        and f.value < plan.jobs[f.job].parallelism
        for f in plan.faults
    )


def test_the_ci_seeds_cover_every_fault_and_job_kind() -> None:
    plans = [draw(seed) for seed in CI_SEEDS]
    assert {f.kind for p in plans for f in p.faults} == set(FAULTS)
    assert {j.kind for p in plans for j in p.jobs} == {*TABLE_KINDS, "source"}
    # both ways of writing a view: inside Postgres, and rows through the workers
    assert {p.pushdown for p in plans} == {True, False}
    # barriers between checkpoints, and a rescale dealing completed and unfinished vnodes
    assert any(p.checkpoint_frequency > 1 for p in plans)
    assert any(merges_finished_and_unfinished(p) for p in plans)
    assert draw(14) == draw(14)  # a seed is a replay


@pytest.fixture(scope="module")
def chaos_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    """A server of the harness's own, so that it may restart it (not with
    TEST_DATABASE_URL: a server someone else runs is not restarted)."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url, None
        return
    server = EmbeddedPostgres(tmp_path_factory.mktemp("chaos_pg"))
    yield server.start(), server.restart
    server.stop()
    # the restarts replaced the postmaster that pgserver started (and stops): it once
    # ran on after the suite
    assert not (server.pgdata / "postmaster.pid").exists(), "the chaos tests' Postgres runs on"


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.parametrize("seed", CI_SEEDS)
def test_chaos_seed(
    seed: int, chaos_pg: tuple[str, object], kafka: MockKafka, tmp_path: Path
) -> None:
    url, restart = chaos_pg
    outcome = run_seed(seed, url, tmp_path, kafka, restart)  # type: ignore[arg-type]
    planned = draw(seed, restart_postgres=restart is not None).faults
    assert outcome.faults == [f.kind for f in planned]
    assert outcome.checks >= 4 * len(draw(seed).jobs)
    if merges_finished_and_unfinished(draw(seed)):
        assert outcome.mixed_rescales >= 1, "the rescale came when no actor had finished"
