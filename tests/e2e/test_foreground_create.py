"""A job created in the foreground (``"background": false``) is answered 201 once it is
created, woken by the commit that creates it rather than by a periodic re-read; one that
is not created within the foreground timeout is answered 202, still creating."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from service.api import jobs as jobs_api
from service.db import Database
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.e2e import assert_exact, load, running_cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    with running_cluster(db, fresh_db_url, WorkerSettings(spark_mode="never"), name="fg") as c:
        load(c[0], 3_000)
        yield c


def _job(name: str, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "upstream": {"table": "orders"},
        "columns": ["id", "amount"],
        "backfill": "arrangement",
        "parallelism": 2,
        "background": False,
    } | extra


def test_a_foreground_create_answers_once_the_commit_creates_the_job(
    cluster: tuple[httpx.Client, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, _ = cluster
    # no periodic re-read within the client's timeout: only the commit can wake the wait
    monkeypatch.setattr(jobs_api, "FOREGROUND_RECHECK_S", 3600.0)
    r = http.post("/v1/jobs", json=_job("fg_mv"), timeout=60)
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "created"
    progress = http.get(f"/v1/jobs/{r.json()['id']}/progress").json()
    assert progress["rows"] == 3_000
    assert_exact(http, r.json()["id"])


def test_a_foreground_create_that_outlasts_its_timeout_is_answered_creating(
    cluster: tuple[httpx.Client, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, _ = cluster
    monkeypatch.setattr(jobs_api, "FOREGROUND_TIMEOUT_S", 0.5)
    r = http.post("/v1/jobs", json=_job("fg_held", rate_limit=0), timeout=60)  # reads nothing
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "creating"
    assert http.get(f"/v1/jobs/{r.json()['id']}").json()["state"] == "creating"
