"""The Spark data path over every column type, against the driver path's semantics."""

from __future__ import annotations

import base64
import gc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.db import Database
from spark_workers.pushdown_tasks import _freeze_imports
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from spark_workers.spark_path import WORKER_JAVA_OPTIONS
from tests.kit.e2e import running_cluster, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COLUMNS = [
    {"name": "id", "type": "bigint"},
    {"name": "region", "type": "smallint"},
    {"name": "qty", "type": "int"},
    {"name": "ratio", "type": "double"},
    {"name": "price", "type": "numeric"},
    {"name": "label", "type": "text"},
    {"name": "flag", "type": "boolean"},
    {"name": "day", "type": "date"},
    {"name": "at", "type": "timestamp"},
    {"name": "at_tz", "type": "timestamptz"},
    {"name": "doc", "type": "jsonb"},
    {"name": "blob", "type": "bytea"},
]


def _row(i: int) -> dict[str, Any]:
    if i % 7 == 0:  # NULL in every value column
        return {"id": i} | {c["name"]: None for c in COLUMNS[1:]}
    return {
        "id": i,
        "region": i % 5,
        "qty": i * 3 - 1000,
        "ratio": i / 7,
        "price": f"{i}.{i % 10}123456789012345678901234567890",  # beyond Spark's 38 digits
        "label": f"tab\there\nnew line \\ {i} ünï",
        "flag": i % 2 == 0,
        "day": f"2024-02-{1 + i % 28:02d}",
        "at": f"2024-03-01T10:{i % 60:02d}:00.123456",
        "at_tz": f"2024-03-01T10:{i % 60:02d}:00+02:00",
        "doc": {"k": i, "tags": ["a", None, i % 3 == 0]},
        "blob": base64.b64encode(bytes([i % 256, 0, 255])).decode(),
    }


@pytest.fixture
def spark_cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    # Spark started when the worker registers (the default; tests turn it off elsewhere)
    worker_settings = WorkerSettings(spark_mode="always", spark_epoch_rows=700, spark_warm_up=True)
    with running_cluster(db, fresh_db_url, worker_settings, "spark") as c:
        yield c


CHEAP = {"or": [{"col": "price", "op": "<", "value": "1000.5"}, {"col": "price", "op": "is_null"}]}
# the same rows, through a jsonb leaf (true of every row): no SQL form, the rows move
CHEAP_WITH_JSONB = {"and": [CHEAP, {"not": {"col": "doc", "op": "=", "value": {"never": 1}}}]}


@pytest.mark.parametrize(
    ("view_filter", "pushed_down"),
    [(CHEAP, True), (CHEAP_WITH_JSONB, False)],
    ids=["inside Postgres", "rows through Spark"],
)
def test_every_type_round_trips_through_spark(
    spark_cluster: tuple[httpx.Client, Worker],
    db: Database,
    view_filter: dict[str, Any],
    pushed_down: bool,
) -> None:
    http, worker = spark_cluster
    # the worker started Spark when it registered, before any job asked for it
    wait_for(lambda: worker.spark is not None, timeout=60, what="registered")
    assert worker.spark is not None and worker.spark.warmed.wait(300), "no warm-up"
    r = http.post("/v1/tables", json={"name": "things", "columns": COLUMNS, "primary_key": ["id"]})
    assert r.status_code == 201, r.text
    r = http.post(
        "/v1/tables/things/dml",
        json={"ops": [{"op": "insert", "row": _row(i)} for i in range(2_000)]},
    )
    assert r.status_code == 200, r.text
    body = {
        "name": "cheap_things",
        "upstream": {"table": "things"},
        "columns": [c["name"] for c in COLUMNS if c["name"] != "qty"],
        "filter": view_filter,
        "parallelism": 2,
    }
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    # changes while the backfill runs, some below and some above the read positions
    for i in range(0, 2_000, 97):
        ops = [{"op": "update", "row": _row(i) | {"price": "1.5", "label": f"changed {i}"}}]
        assert http.post("/v1/tables/things/dml", json={"ops": ops}).status_code == 200
    wait_for(lambda: http.get(f"/v1/jobs/{job}").json()["state"] == "created", what="created")
    v = http.get(f"/v1/jobs/{job}/verify").json()
    assert v["equal"], v
    assert v["mv_rows"] > 1_000
    assert worker.spark is not None
    if pushed_down:
        # a snapshot backfill ("auto") whose view runs in Postgres: a Spark job spanning
        # epochs (how many epochs its rounds took depends on the machine's speed)
        assert worker.spark.rounds_jobs >= 1 and worker.spark.round_epochs >= 1
        assert worker.spark.pushdown_jobs == worker.spark.jobs
        with db.engine.connect() as conn:  # each job's work queue went with it
            assert conn.exec_driver_sql("SELECT count(*) FROM work_queues").scalar() == 0
    else:
        # the rows move: jobs of one epoch each, never one spanning epochs
        assert worker.spark.jobs >= 2 and worker.spark.rounds_jobs == 0
        assert worker.spark.pushdown_jobs == 0
    rows = http.get("/v1/tables/cheap_things/rows", params={"limit": 1_000}).json()["rows"]
    one = next(r for r in rows if r["id"] == 1)
    assert one["label"] == "tab\there\nnew line \\ 1 ünï" and one["doc"]["k"] == 1
    assert one["blob"] == base64.b64encode(bytes([1, 0, 255])).decode()
    # the driver JVM that ran it is the worker's: C1 only, the serial collector
    jvm = worker.spark.session()._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert set(WORKER_JAVA_OPTIONS.split()) <= set(args), args


def test_spark_python_workers_freeze_their_imports_and_the_driver_does_not(
    spark_cluster: tuple[httpx.Client, Worker],
) -> None:
    _, worker = spark_cluster
    wait_for(lambda: worker.spark is not None, 60, what="the worker's Spark path")
    assert worker.spark is not None
    spark = worker.spark.session()

    def frozen_in_a_task(_: int) -> int:  # pickled by value: runs in a Python worker
        from spark_workers.pushdown_tasks import _freeze_imports

        _freeze_imports()
        return gc.get_freeze_count()

    # inside a Spark task: what was alive then is left out of later collections
    assert spark.sparkContext.parallelize([0], 1).map(frozen_in_a_task).collect()[0] > 0
    # outside one (the driver, this process): nothing is frozen
    gc.unfreeze()
    _freeze_imports()
    assert gc.get_freeze_count() == 0
