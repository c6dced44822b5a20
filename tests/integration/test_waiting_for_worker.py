"""A job no live worker runs says so: in its progress, its create response and /metrics,
and a foreground create does not wait its full timeout for a worker that is not there."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from service.api import jobs as job_routes
from service.usecases import jobs
from tests.kit.meta import FakeWorker

TABLE = {
    "name": "t",
    "columns": [{"name": "id", "type": "bigint"}],
    "primary_key": ["id"],
}


def _load(client: TestClient) -> None:
    assert client.post("/v1/tables", json=TABLE).status_code == 201
    ops = [{"op": "insert", "row": {"id": i}} for i in range(100)]
    assert client.post("/v1/tables/t/dml", json={"ops": ops}).status_code == 200


def _metric(client: TestClient, job: int) -> str:
    lines = client.get("/metrics").text.splitlines()
    (line,) = (
        ln
        for ln in lines
        if ln.startswith("backfill_job_waiting_for_worker{") and f'job_id="{job}"' in ln
    )
    return line.rsplit(" ", 1)[1]


def test_a_job_without_a_worker_says_so_until_one_registers(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _load(client)
    body = {"name": "v", "upstream": {"table": "t"}, "backfill": "arrangement"}
    r = client.post("/v1/jobs", json=body | {"background": True})
    assert r.status_code == 202 and r.json()["waiting_for_worker"] is True, r.text
    job = r.json()["id"]
    assert client.get(f"/v1/jobs/{job}/progress").json()["phase"] == "waiting_for_worker"
    assert _metric(client, job) == "1.0"
    # in the foreground, the create answers once no worker showed up for a while,
    # not after its full timeout
    monkeypatch.setattr(jobs, "NO_WORKER_GRACE_S", 0.2)
    monkeypatch.setattr(job_routes, "FOREGROUND_TIMEOUT_S", 120.0)
    r = client.post("/v1/jobs", json={**body, "name": "v2", "background": False})
    assert r.status_code == 202 and r.json()["waiting_for_worker"] is True, r.text
    # a worker registers: the jobs' actors are placed on it and the flag goes
    w = FakeWorker(client).register()
    deadline = time.monotonic() + 60
    while client.get(f"/v1/jobs/{job}").json()["waiting_for_worker"]:
        assert time.monotonic() < deadline, "still waiting for a worker after 60 s"
        w.poll(timeout_ms=200)
    assert client.get(f"/v1/jobs/{job}/progress").json()["phase"] != "waiting_for_worker"
    assert _metric(client, job) == "0.0"
