"""A live control plane with one in-process worker, and a job timed until it is created
(the backfill benches share them)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from service.db import Database
from service.settings import Settings
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.auth import http_client
from tests.kit.live import BACKFILL, live_server, stop_process

READY_LINE = b"Spark is ready"


@contextmanager
def live_worker(
    db: Database, url: str, interval_ms: int, name: str
) -> Iterator[tuple[httpx.Client, Worker]]:
    """The control plane at ``interval_ms`` barriers and a registered worker whose
    SparkSession is already warm (a worker is long-lived)."""
    settings = Settings(
        database_url=url, barrier_interval_ms=interval_ms, spawn_embedded_worker=False
    )
    with live_server(settings, db) as base:
        worker = Worker(base, name, settings=WorkerSettings())
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            with http_client(base, timeout=120) as http:
                deadline = time.monotonic() + 120
                while worker.spark is None:
                    assert time.monotonic() < deadline, "the worker did not register"
                    time.sleep(0.05)
                worker.spark.warm_up()
                yield http, worker
        finally:
            worker.stop_event.set()
            thread.join(timeout=60)


def drop_jobs(http: httpx.Client) -> None:
    """Drop every job (and its MV): gone before the next run, and before the next control
    plane, which would otherwise start by recovering their actors onto its own worker."""
    for job in http.get("/v1/jobs").json()["jobs"]:
        assert http.delete(f"/v1/jobs/{job['id']}").status_code in (200, 202, 204)


def checkpoint(db: Database) -> None:
    """Flush what earlier runs wrote, so that the next timed run does not pay for it (a
    checkpoint inside it also makes its WAL carry whole pages again)."""
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("CHECKPOINT")


def time_until_created(http: httpx.Client, job: dict[str, Any], rows: int) -> float:
    """Seconds from creating ``job`` until it is ``created``, having read ``rows`` rows."""
    return time_until_indexed(http, None, job, rows)[0]


def time_until_indexed(
    http: httpx.Client, db: Database | None, job: dict[str, Any], rows: int
) -> tuple[float, float | None]:
    """Seconds from creating ``job`` until it is ``created``, having read ``rows`` rows,
    and (given ``db``) until its MV's epoch index is built (service/meta/indexer.py)."""
    t0 = time.perf_counter()
    # in the foreground: answered when the commit that creates the job lands, where a
    # client polling the job's state every 50 ms took an eighth of a core or more (6-9 ms
    # of CPU a request, client and control plane) from the very run it timed
    r = http.post("/v1/jobs", json=job | {"background": False}, timeout=1800)
    elapsed = time.perf_counter() - t0
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    indexed = None
    if db is not None:
        deadline = time.monotonic() + 1800
        query = text(
            "SELECT r.epoch_indexed FROM relations r JOIN jobs j ON j.mv_relation_id = r.id "
            "WHERE j.id = :j"
        )
        while True:
            with db.transaction() as s:
                if s.execute(query, {"j": job_id}).scalar_one():
                    break
            assert time.monotonic() < deadline, "the MV's epoch index was not built"
            time.sleep(0.05)
        indexed = time.perf_counter() - t0
    read = http.get(f"/v1/jobs/{job_id}/progress").json()["rows"]
    assert read == rows, f"the backfill read {read} rows, not {rows}"
    return elapsed, indexed


@contextmanager
def spark_ready_worker(
    base: str, name: str, extra_env: dict[str, str] | None = None, capacity: int = 64
) -> Iterator[None]:
    """``backfill worker`` in a process of its own, once it logged that Spark is ready: a
    view created then pays no start-up (the first-view figure measures that on its own)."""
    env = os.environ | {"BACKFILL_LOG_LEVEL": "info"} | (extra_env or {})
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "worker.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [BACKFILL, "worker", "--control-plane", base, "--name", name]
                + ["--capacity", str(capacity)],
                env=env,
                stdout=out,
                stderr=out,
            )
        try:
            deadline = time.monotonic() + 300
            while READY_LINE not in log.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the worker did not start Spark:\n{log.read_text()[-3000:]}"
                    )
                time.sleep(0.1)
            yield
        finally:
            stop_process(proc)
