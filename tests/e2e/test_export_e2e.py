"""An export through a real worker and Spark (docs/reading.md#exports): cancelled while
its Spark job runs, it stops and frees its epoch; under a concurrent writer, its Parquet
files read back with pyarrow are exactly the snapshot at its epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg2
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text

from service.db import Database
from spark_workers.settings import WorkerSettings
from tests.kit.e2e import Writer, load, running_cluster, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ENDED = ("succeeded", "failed", "cancelled")


def _export(http: httpx.Client, path: Path) -> int:
    r = http.post("/v1/tables/orders/exports", json={"format": "parquet", "path": f"file:{path}"})
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def _state(http: httpx.Client, export_id: int) -> dict[str, Any]:
    return dict(http.get(f"/v1/exports/{export_id}").json())


def _rows_at(http: httpx.Client, epoch: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    params: dict[str, Any] = {"epoch": epoch, "limit": 1000}
    while True:
        page = http.get("/v1/tables/orders/rows", params=params).json()
        out += page["rows"]
        if page["next"] is None:
            return out
        params["after"] = page["next"]


def _pins(db: Database) -> int:
    with db.engine.begin() as c:
        return int(c.execute(text("SELECT count(*) FROM epoch_pins")).scalar_one())


def test_an_export_is_its_epochs_snapshot_under_a_writer_and_cancels(
    db: Database, fresh_db_url: str, tmp_path: Path
) -> None:
    with running_cluster(db, fresh_db_url, WorkerSettings(), "export") as (http, worker):
        load(http, 3_000)
        # the worker's Spark session starts before the writer, which would slow it down
        wait_for(lambda: worker.spark is not None, 60, "the worker's Spark path")
        assert worker.spark is not None
        worker.spark.session()

        # under a concurrent writer: exactly the snapshot at the export's epoch
        with Writer(http, "orders", 3_000, seed=35) as writer:
            wait_for(lambda: writer.batches >= 2, 60, "writes before the export")
            done = _export(http, tmp_path / "out")
            end = wait_for(
                lambda: (s := _state(http, done))["state"] in ENDED and s, 180, "export ended"
            )
            before = writer.batches
            wait_for(lambda: writer.batches > before, 60, "writes after the export")
        assert end["state"] == "succeeded", end
        assert max(writer.epochs) > int(end["epoch"])  # the writer went on past its epoch
        expected = sorted(_rows_at(http, end["epoch"]), key=lambda r: r["id"])
        files = pq.read_table(tmp_path / "out")
        assert files.column_names == ["id", "amount", "note"]
        assert sorted(files.to_pylist(), key=lambda r: r["id"]) == expected
        assert end["rows"] == len(expected) and end["error"] is None
        assert _pins(db) == 0

        # cancelled while running: a lock on the table holds its Spark job's reads, so
        # it cannot end any other way; the worker stops the job and frees the epoch
        with db.engine.begin() as c:
            storage = c.execute(text("SELECT storage_table FROM relations")).scalar_one()
        blocker = psycopg2.connect(db.libpq_url)
        try:
            with blocker.cursor() as cur:
                cur.execute(f'LOCK TABLE store."{storage}" IN ACCESS EXCLUSIVE MODE')
            held = _export(http, tmp_path / "held")
            wait_for(lambda: _state(http, held)["state"] == "running", 120, "export running")
            assert http.delete(f"/v1/exports/{held}").json()["state"] == "cancelled"
            wait_for(lambda: _pins(db) == 0, 60, "the cancelled export's worker stopped")
        finally:
            blocker.rollback()
            blocker.close()
        assert _state(http, held)["state"] == "cancelled"
        assert not (tmp_path / "held" / "_SUCCESS").exists()
