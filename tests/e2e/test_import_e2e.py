"""Imports through a real worker and Spark (docs/api.md#imports): Parquet, CSV and JSON
files of ``file:`` paths land at one epoch (at the epoch before it, none of their rows;
at it, all) while a writer's DML goes on on other keys, both exact and the row counts
too; a bad row fails the import naming its file and row (or line) and writes nothing,
as do a key that exists and a path that does not; a running import cancelled stops and
writes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg2
import psycopg2.errors
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text

from service.db import Database
from spark_workers.settings import WorkerSettings
from tests.kit.e2e import Writer, load, running_cluster, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ENDED = ("succeeded", "failed", "cancelled")
BASE = 1_000_000  # imported keys: far above the writer's


def _import(http: httpx.Client, fmt: str, path: Path) -> dict[str, Any]:
    r = http.post("/v1/tables/orders/imports", json={"format": fmt, "path": f"file:{path}"})
    assert r.status_code == 202, r.text
    x = r.json()
    return dict(
        wait_for(
            lambda: (s := http.get(f"/v1/imports/{x['id']}").json())["state"] in ENDED and s,
            180,
            f"import {x['id']} ended",
        )
    )


def _rows_at(http: httpx.Client, epoch: int) -> dict[int, dict[str, Any]]:
    def readable() -> bool:
        return http.get("/v1/tables/orders/rows", params={"epoch": str(epoch)}).status_code == 200

    wait_for(readable, 60, f"epoch {epoch} committed")
    out: dict[int, dict[str, Any]] = {}
    params: dict[str, Any] = {"epoch": str(epoch), "limit": 1000}
    while True:
        page = http.get("/v1/tables/orders/rows", params=params).json()
        out |= {int(r["id"]): r for r in page["rows"]}
        if page["next"] is None:
            return out
        params["after"] = page["next"]


def _counted(db: Database, epoch: int) -> int:
    with db.engine.begin() as c:
        q = "SELECT coalesce(sum(delta), 0) FROM row_count_deltas WHERE epoch <= :e"
        return int(c.execute(text(q), {"e": epoch}).scalar_one())


def _expected(lo: int, n: int) -> dict[int, dict[str, Any]]:
    return {i: {"id": i, "amount": i % 97, "note": f"file row {i}"} for i in range(lo, lo + n)}


def _write_files(tmp: Path) -> dict[str, tuple[Path, dict[int, dict[str, Any]]]]:
    """A Parquet file of two row groups, a directory of two CSV files, a JSON file."""
    pq_rows = _expected(BASE, 3_000)
    (tmp / "pq").mkdir()
    pq.write_table(
        pa.table(
            {
                "id": pa.array(list(pq_rows), pa.int64()),
                "amount": pa.array([r["amount"] for r in pq_rows.values()], pa.int32()),
                "note": [r["note"] for r in pq_rows.values()],
            }
        ),
        tmp / "pq" / "part-0.parquet",
        row_group_size=1_500,
    )
    csv_rows = _expected(2 * BASE, 2_000)
    (tmp / "csv").mkdir()
    for k in range(2):
        part = list(csv_rows.values())[k * 1_000 : (k + 1) * 1_000]
        lines = ["id,amount,note"] + [f'{r["id"]},{r["amount"]},"{r["note"]}"' for r in part]
        (tmp / "csv" / f"part-{k}.csv").write_text("\n".join(lines) + "\n")
    json_rows = _expected(3 * BASE, 1_500)
    (tmp / "orders.json").write_text("".join(json.dumps(r) + "\n" for r in json_rows.values()))
    return {
        "parquet": (tmp / "pq", pq_rows),
        "csv": (tmp / "csv", csv_rows),
        "json": (tmp / "orders.json", json_rows),
    }


def test_imports_land_at_one_epoch_beside_dml_and_bad_rows_write_nothing(
    db: Database, fresh_db_url: str, tmp_path: Path
) -> None:
    files = _write_files(tmp_path)
    with running_cluster(db, fresh_db_url, WorkerSettings(), "import") as (http, worker):
        load(http, 1_000)
        wait_for(lambda: worker.spark is not None, 60, "the worker's Spark path")
        assert worker.spark is not None
        worker.spark.session()

        imported: dict[int, dict[str, Any]] = {}
        with Writer(http, "orders", 1_000, seed=36) as writer:
            for fmt, (path, expected) in files.items():
                wait_for(lambda: writer.batches >= 2, 60, "writes before the import")
                x = _import(http, fmt, path)
                assert x["state"] == "succeeded", x
                assert x["rows"] == len(expected) and x["error"] is None
                epoch = int(x["epoch"])
                before, at = _rows_at(http, epoch - 1), _rows_at(http, epoch)
                # none of its rows before its epoch, all of them at it
                assert not set(expected) & set(before)
                assert {i: at[i] for i in expected} == expected
                imported |= expected
                assert {i: r for i, r in at.items() if i >= BASE} == imported
                assert _counted(db, epoch) == len(at)
                assert _counted(db, epoch - 1) == len(before)
        # quiet: the writer's keys are its live set, the imported ones all there
        r = http.post(
            "/v1/tables/orders/dml",
            params={"wait": "true"},
            json={"ops": [{"op": "insert", "row": {"id": BASE - 1, "amount": 1, "note": "last"}}]},
        )
        assert r.status_code == 200, r.text
        last = int(r.json()["epoch"])
        final = _rows_at(http, last)
        assert {i for i in final if i < BASE - 1} == writer.live
        assert {i: r for i, r in final.items() if i >= BASE} == imported
        assert _counted(db, last) == len(final)

        # bad rows: the import fails naming the file and the row, and writes nothing
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "orders.csv").write_text("id,amount,note\n5000000,1,a\n5000001,xx,b\n")
        (bad / "orders.json").write_text('{"id": 5000002, "amount": 1}\n{"id": "x"}\n')
        pq.write_table(
            pa.table({"id": pa.array([5000003, 5000004], pa.int64()), "amount": ["7", "x"]}),
            bad / "orders.parquet",
        )
        failures = {
            "csv": (bad / "orders.csv", {"line": 3}),
            "json": (bad / "orders.json", {"line": 2}),
            "parquet": (bad / "orders.parquet", {"row": 2}),
        }
        for fmt, (path, where) in failures.items():
            x = _import(http, fmt, path)
            assert x["state"] == "failed" and x["error_code"] == "bad_row", x
            details = x["error_details"]
            assert details["file"].endswith(path.name) and where.items() <= details.items(), x
            assert path.name in x["error"] and str(next(iter(where.values()))) in x["error"]
        existing = min(final)
        (bad / "dup.json").write_text(f'{{"id": 5000005}}\n{{"id": {existing}}}\n')
        x = _import(http, "json", bad / "dup.json")
        assert (x["state"], x["error_code"]) == ("failed", "key_exists"), x
        assert x["error_details"] == {"key": [existing]}
        x = _import(http, "parquet", bad / "no-such-dir")
        assert (x["state"], x["error_code"]) == ("failed", "unreadable_path"), x
        r = http.post(
            "/v1/tables/orders/dml",
            params={"wait": "true"},
            json={"ops": [{"op": "delete", "row": {"id": BASE - 1}}]},
        )
        now = _rows_at(http, int(r.json()["epoch"]))
        assert not any(i >= 5_000_000 for i in now)
        with db.engine.begin() as c:
            staged = c.execute(
                text("SELECT count(*) FROM pg_tables WHERE tablename LIKE '\\_import\\_%'")
            ).scalar_one()
            assert staged == 0


def _staging_exists(db: Database, import_id: int) -> bool:
    with db.engine.begin() as c:
        q = "SELECT to_regclass(:t) IS NOT NULL"
        return bool(c.execute(text(q), {"t": f'store."_import_{import_id}"'}).scalar_one())


def test_a_running_import_cancelled_stops_and_writes_nothing(
    db: Database, fresh_db_url: str, tmp_path: Path
) -> None:
    """Its tasks held at their COPY by a lock on the staging table (taken once the claim
    created it, before any task wrote: a lock that cannot be had at once means a task
    wrote already, and the attempt is made again with other files)."""
    with running_cluster(db, fresh_db_url, WorkerSettings(), "import-cancel") as (http, worker):
        load(http, 10)
        wait_for(lambda: worker.spark is not None, 60, "the worker's Spark path")
        assert worker.spark is not None
        worker.spark.session()
        for attempt in range(5):
            lo = (attempt + 1) * BASE
            path = tmp_path / f"held-{attempt}.json"
            path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(lo, lo + 50_000)))
            r = http.post(
                "/v1/tables/orders/imports", json={"format": "json", "path": f"file:{path}"}
            )
            xid = int(r.json()["id"])
            wait_for(lambda xid=xid: _staging_exists(db, xid), 60, "the claim")
            blocker = psycopg2.connect(db.libpq_url)
            try:
                with blocker.cursor() as cur:
                    cur.execute("SET lock_timeout = '100ms'")
                    try:
                        cur.execute(f'LOCK TABLE store."_import_{xid}" IN ACCESS EXCLUSIVE MODE')
                    except psycopg2.errors.LockNotAvailable:
                        blocker.rollback()
                        wait_for(
                            lambda xid=xid: http.get(f"/v1/imports/{xid}").json()["state"] in ENDED,
                            180,
                            "the import that was not held",
                        )
                        continue
                assert http.get(f"/v1/imports/{xid}").json()["state"] == "running"
                assert http.delete(f"/v1/imports/{xid}").json()["state"] == "cancelled"
            finally:
                blocker.rollback()
                blocker.close()
            wait_for(lambda xid=xid: not _staging_exists(db, xid), 120, "its staging table dropped")
            got = http.get(f"/v1/imports/{xid}").json()
            assert (got["state"], got["rows"], got["epoch"]) == ("cancelled", None, None)
            r = http.post(
                "/v1/tables/orders/dml",
                params={"wait": "true"},
                json={"ops": [{"op": "insert", "row": {"id": 11, "amount": 1, "note": "x"}}]},
            )
            assert not any(i >= lo for i in _rows_at(http, int(r.json()["epoch"])))
            # the worker is free for the next import
            ok = tmp_path / "ok.json"
            ok.write_text(json.dumps({"id": 12}) + "\n")
            assert _import(http, "json", ok)["state"] == "succeeded"
            return
        pytest.fail("every attempt's tasks wrote before the lock")
