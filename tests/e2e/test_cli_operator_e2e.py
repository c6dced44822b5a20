"""The operator's commands (``backfill jobs|tables|sources``) against a live control plane
and a real worker: create a paused job, see it listed, throttle it, watch its progress
bars until it is created, pause, resume, rescale, verify, drop; errors exit non-zero with
the API's code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.cli import main
from service.db import Database
from spark_workers.settings import WorkerSettings
from tests.kit.auth import TOKENS
from tests.kit.e2e import load, running_cluster

pytestmark = pytest.mark.slow
ROWS = 3_000


@pytest.fixture
def base(db: Database, fresh_db_url: str) -> Iterator[str]:
    with running_cluster(db, fresh_db_url, WorkerSettings(spark_mode="never"), name="ops") as c:
        http, _ = c
        load(http, ROWS)
        yield str(http.base_url).rstrip("/")


def _run(
    capsys: pytest.CaptureFixture[str], base: str, *args: str, token: str | None = None
) -> tuple[int, str, str]:
    code = main([*args, "--url", base, "--token", token or TOKENS["admin"]])
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys: pytest.CaptureFixture[str], base: str, *args: str) -> Any:
    code, out, err = _run(capsys, base, *args, "-o", "json")
    assert code == 0, err
    return json.loads(out)


def test_an_operator_steers_a_job_from_the_command_line(
    base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _json(
        capsys, base, "jobs", "create", "big", "--table", "orders", "--columns", "id,amount",
        "--filter", '{"col": "amount", "op": ">=", "value": 50}', "--kind", "arrangement",
        "--parallelism", "2", "--rate-limit", "0",
    )  # fmt: skip
    job_id = str(job["id"])
    assert job["state"] == "creating" and job["rate_limit"] == 0

    code, out, _ = _run(capsys, base, "jobs", "list")
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["ID", "NAME", "KIND", "STATE"]
    assert [r.split()[:4] for r in rows] == [[job_id, "big", "arrangement", "creating"]]
    assert [j["id"] for j in _json(capsys, base, "jobs", "list", "--state", "creating")["jobs"]]

    assert _json(capsys, base, "jobs", "pause", job_id)["paused"] is True
    assert _json(capsys, base, "jobs", "throttle", job_id, "none")["rate_limit"] is None
    assert _json(capsys, base, "jobs", "resume", job_id)["paused"] is False
    code, out, err = _run(capsys, base, "jobs", "watch", job_id, "--interval", "0.05")
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    assert "[########################] 100.00%" in last and last.endswith("created"), out
    assert f"{ROWS:,}/{ROWS:,} rows" in last  # rows read from the upstream

    assert _json(capsys, base, "jobs", "rescale", job_id, "3")["parallelism"] == 3
    verified = _json(capsys, base, "jobs", "verify", job_id)
    assert verified["equal"] is True and verified["mv_rows"] == ROWS // 2
    shown = _json(capsys, base, "jobs", "show", job_id)
    assert shown["progress"]["percent"] == 100.0

    assert "orders" in _run(capsys, base, "tables", "list")[1]
    code, out, _ = _run(capsys, base, "tables", "show", "orders")
    assert code == 0 and "id bigint, amount int, note text" in out
    [worker] = _json(capsys, base, "workers", "list")["workers"]
    assert worker["name"] == "ops" and worker["state"] == "alive"
    assert sorted(a["job_id"] for a in worker["actors"]) == [int(job_id)] * 3
    code, out, _ = _run(capsys, base, "workers", "list")
    assert code == 0 and out.splitlines()[1].split()[1:4] == ["ops", "alive", "64"]
    assert _run(capsys, base, "jobs", "drop", job_id)[:2] == (0, f"dropped {job_id}\n")
    assert _json(capsys, base, "workers", "list")["workers"][0]["actors"] == []


def test_errors_exit_non_zero_with_the_api_code(
    base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, base, "jobs", "show", "9999")
    assert code == 1 and "404 not_found" in err
    code, _, err = _run(capsys, base, "jobs", "list", token="not-a-token-at-all-0000")
    assert code == 1 and "401 unauthorized" in err
    code, _, err = _run(capsys, base, "jobs", "create", "x", "--table", "orders", "--source", "s")
    assert code == 2 and "exactly one upstream" in err
    code, _, err = _run(capsys, base, "jobs", "throttle", "1", "fast")
    assert code == 2 and "rows/s or `none`" in err
    code, _, err = _run(capsys, "http://127.0.0.1:1", "jobs", "list")
    assert code == 2 and "cannot reach the control plane" in err
    code, out, _ = _run(capsys, base, "jobs", "watch")
    assert code == 0 and out == "no job is creating\n"
    with httpx.Client(base_url=base) as anon:  # the commands are the API's: nothing else
        assert anon.get("/v1/jobs").status_code == 401
