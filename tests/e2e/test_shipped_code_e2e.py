"""A worker ships the project's code to its Spark executors (spark_workers/shipped_code.py):
on a standalone cluster whose Python has only pyspark, pyarrow and psycopg2 (no package of
ours, no PYTHONPATH to it), table backfills through Spark are exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.db import Database
from spark_workers.settings import WorkerSettings
from tests.kit.e2e import (
    assert_exact,
    create_job,
    load,
    running_cluster,
    wait_created,
    wait_for,
)
from tests.kit.spark_cluster import (
    cluster_python,
    executor_stderr,
    python_lacks_project,
    standalone_cluster,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_backfills_are_exact_on_a_cluster_without_the_project(
    db: Database, fresh_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = cluster_python(tmp_path / "venv")
    assert python_lacks_project(python), "the cluster's Python must not find our packages"
    # the executors' Python; the driver's own Python workers (data source planning) too,
    # which the test's PYTHONPATH still lets find the project, as on a worker machine
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    with standalone_cluster(tmp_path) as master:
        settings = WorkerSettings(spark_master=master, spark_mode="always", spark_min_rows=1)
        with running_cluster(db, fresh_db_url, settings, "shipped") as (http, worker):
            wait_for(lambda: worker.spark is not None, what="the worker registered")
            assert worker.spark is not None
            # the executors import both data sources' modules and the pushed-down tasks'
            worker.spark.warm_up()
            load(http, 10_000)
            # the warm-up ran both data sources and the pushed-down tasks on the executors;
            # one backfill of the default kind shows the shipped code exact
            jobs = [create_job(http, "mv_snapshot", "snapshot")]
            try:
                for job in jobs:
                    wait_created(http, job, timeout=300)
                    assert_exact(http, job)
            except AssertionError as e:
                raise AssertionError(f"{e}\nexecutors:\n{executor_stderr(tmp_path)}") from None
            assert worker.spark.jobs + worker.spark.rounds_jobs > 0, "no Spark job ran"
            master_of_session = worker.spark.session().sparkContext.master
            assert master_of_session == master, f"the worker ran on {master_of_session}"
