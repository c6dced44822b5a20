"""Claims of the README and docs/ that no other test pinned down (issue 39): a worker
that deregisters has its graphs recovered onto the others, ``verify`` at a collected
epoch is a 410, and the tokens a start issues for itself (the embedded worker's, the
demo's) are revoked when it stops, or at the next start if it died first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.api.app import create_app
from service.catalog import tokens
from service.catalog.tokens import EMBEDDED_WORKER, SESSION, TokenAuthority
from service.db import Database
from service.embedded_pg import EmbeddedPostgres
from service.meta import gc
from service.meta.loop import MetaLoop
from service.settings import Settings
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_meta_creating import TABLE
from tests.integration.test_tables_api import create, dml, ins
from tests.kit.e2e import wait_for
from tests.kit.meta import WORKER, FakeWorker, actors_of, committed_epoch, make_job

ROOT = Path(__file__).resolve().parents[2]


def graph_row(db: Database, graph_id: int) -> dict[str, Any]:
    with db.engine.connect() as conn:
        q = text("SELECT state, recovery_reason, recovery_seq FROM graphs WHERE id = :g")
        return dict(conn.execute(q, {"g": graph_id}).mappings().one())


def job_graph(db: Database, job_id: int) -> int:
    with db.engine.connect() as conn:
        q = text("SELECT graph_id FROM jobs WHERE id = :j")
        return int(conn.execute(q, {"j": job_id}).scalar_one())


# --- docs/operations.md, "Scaling workers": a worker deregisters (SIGTERM) and its graphs
# recover onto the others; the reason of such a recovery is `worker stopped`


def test_a_deregistered_workers_graphs_recover_onto_the_other_workers(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """An arrangement job (main graph) and a snapshot job (a creating graph of its own),
    each with an actor on either worker. The worker that deregisters is neither dead
    nor late (a 60 s lease): only its deregistration can move its actors."""
    client, loop = manual
    leaving = FakeWorker(client, name="leaving").register()
    staying = FakeWorker(client, name="staying").register()
    assert client.post("/v1/tables", json=TABLE).status_code == 201
    for _ in range(3):
        loop.tick()  # committed upstream epochs: a snapshot job may start
    arrangement = make_job(db, "arr", parallelism=2)
    body = {"name": "snap", "upstream": {"table": "orders"}, "backfill": "snapshot"}
    r = client.post("/v1/jobs", json=body | {"parallelism": 2})
    assert r.status_code == 202, r.text
    snapshot = r.json()["id"]
    jobs = (arrangement, snapshot)
    graphs = {job_graph(db, job) for job in jobs}
    assert len(graphs) == 2 and 1 in graphs
    for job in jobs:  # the placement spread each job over both workers
        placed = {a.worker_id for a in actors_of(db, job)}
        assert placed == {leaving.worker_id, staying.worker_id}, placed
    loop.tick()
    loop.tick()
    leaving.collect_all()
    staying.collect_all()
    committed = {g: committed_epoch(db, g) for g in graphs}
    seq = {g: graph_row(db, g)["recovery_seq"] for g in graphs}
    assert all(committed.values())

    r = client.delete(f"/v1/workers/{leaving.worker_id}", headers=WORKER)  # as on SIGTERM
    assert r.status_code == 204, r.text
    # at once, before any round: each of its graphs waits for a recovery, for that reason
    for g in graphs:
        row = graph_row(db, g)
        assert (row["state"], row["recovery_reason"]) == ("recovering", "worker stopped"), g
    assert leaving.heartbeat() == 410

    loop.tick()  # the recoveries
    for job in jobs:
        assert {a.worker_id for a in actors_of(db, job)} == {staying.worker_id}
    for g in graphs:
        row = graph_row(db, g)
        assert row["state"] == "running" and row["recovery_seq"] == seq[g] + 1
    assignments = staying.poll()
    assert {a["actor_id"] for a in assignments} == {
        a.id for job in jobs for a in actors_of(db, job)
    }
    for a in assignments:
        first = a["barriers"][0]
        assert first["kind"] == "initial" and first["prev"] == committed[a["graph_id"]]
        assert a["restore"] is not None  # from the committed progress
    # the graphs go on, on the remaining worker alone
    staying.collect_all()
    loop.tick()
    staying.collect_all()
    for g in graphs:
        assert committed_epoch(db, g) > committed[g], g
    for job in jobs:
        stream = client.get(f"/v1/jobs/{job}/events", params={"follow": "false"}).text
        assert "event: recovered" in stream and '"reason": "worker stopped"' in stream


# --- docs/api.md, "Epochs" and "Errors": an epoch already garbage-collected is a 410
# `gone` with `details.oldest_readable_epoch`; that for `verify` too


def test_verify_at_a_garbage_collected_epoch_is_410_gone(client: TestClient, db: Database) -> None:
    create(client)
    first = int(dml(client, [ins(i) for i in range(10)]).json()["epoch"])
    for round_ in range(3):  # versions that shadow the first ones
        ops = [{"op": "update", "row": {"id": i, "amount": str(round_)}} for i in range(10)]
        dml(client, ops)
    # a view no row passes: its MV is exact though no worker runs the job
    body = {
        "name": "none_over_1k",
        "upstream": {"table": "orders"},
        "backfill": "arrangement",
        "filter": {"col": "amount", "op": ">", "value": 1000},
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    ok = client.get(f"/v1/jobs/{job}/verify", params={"epoch": first})
    assert ok.status_code == 200 and ok.json()["equal"], ok.text  # readable before the GC

    [collected] = [r for r in gc.run_gc(db, retention_ms=0) if r.removed_versions]
    assert collected.safe_epoch > first
    error = assert_error(client.get(f"/v1/jobs/{job}/verify", params={"epoch": first}), 410, "gone")
    oldest = int(error["details"]["oldest_readable_epoch"])
    assert oldest == collected.safe_epoch
    # the oldest readable epoch itself reads, and so does the latest
    at_oldest = client.get(f"/v1/jobs/{job}/verify", params={"epoch": oldest})
    assert at_oldest.status_code == 200, at_oldest.text
    assert int(at_oldest.json()["epoch"]) == oldest and at_oldest.json()["equal"]
    latest = client.get(f"/v1/jobs/{job}/verify")
    assert latest.status_code == 200 and int(latest.json()["epoch"]) >= oldest


# --- README "Security" and docs/operations.md "Tokens and roles": a token per start for
# the embedded worker and for `backfill demo`, revoked when the start ends; those of an
# earlier start (one that died) are dropped at the next start


def stored_tokens(db: Database) -> list[tuple[str, str, str]]:
    with db.engine.connect() as conn:
        q = text("SELECT token_hash, role, source FROM api_tokens ORDER BY token_hash")
        return [tuple(r) for r in conn.execute(q).all()]  # type: ignore[misc]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def issued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every token issued in this test, as (role, source, token): the plain token exists
    only in the process that issued it."""
    seen: list[tuple[str, str, str]] = []
    issue = TokenAuthority.issue

    def recording(self: TokenAuthority, role: Any, source: str) -> str:
        token = issue(self, role, source)
        seen.append((role, source, token))
        return token

    monkeypatch.setattr(TokenAuthority, "issue", recording)
    return seen


def test_the_embedded_workers_token_works_while_serving_and_is_revoked_at_shutdown(
    db: Database, fresh_db_url: str, tmp_path: Path, issued: list[tuple[str, str, str]]
) -> None:
    # embedded mode (no database URL) with the test's database handed in; no barrier
    # loop, so no worker is actually spawned
    settings = Settings(database_url=None, data_dir=tmp_path, run_barrier_loop=False)
    assert settings.embedded and settings.spawn_embedded_worker
    with TestClient(create_app(settings, db)) as c:
        [(role, source, token)] = issued
        assert (role, source) == ("worker", EMBEDDED_WORKER)
        assert (tokens.hash_token(token), "worker", EMBEDDED_WORKER) in stored_tokens(db)
        r = c.post("/v1/workers", json={"name": "embedded", "capacity": 1}, headers=bearer(token))
        assert r.status_code == 201, r.text
        assert c.get("/v1/jobs", headers=bearer(token)).status_code == 403  # a worker's
    # revoked as the start ended, before anything else started
    assert [row for row in stored_tokens(db) if row[2] == EMBEDDED_WORKER] == []
    later = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    with TestClient(create_app(later, db)) as c:
        assert c.post("/v1/workers", json={"name": "w"}, headers=bearer(token)).status_code == 401


def test_a_token_issued_while_serving_is_revoked_at_shutdown_though_its_holder_never_retired_it(
    db: Database, fresh_db_url: str
) -> None:
    """As ``backfill demo --keep-running`` does: it issues a session token and serves
    until it is stopped, and a stop does not unwind it before the server's shutdown
    (SIGTERM ends the process; on Ctrl-C it unwinds after the shutdown stopped an
    embedded Postgres). The start that issued it revokes it."""
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    app = create_app(settings, db)
    with TestClient(app) as c:
        authority = app.state.ctx.auth
        token = authority.issue("admin", SESSION)
        assert c.get("/v1/jobs", headers=bearer(token)).status_code == 200
        assert (tokens.hash_token(token), "admin", SESSION) in stored_tokens(db)
    assert [row for row in stored_tokens(db) if row[2] == SESSION] == []
    assert tokens.hash_token(token) not in tokens.load(db)


def test_tokens_an_earlier_start_issued_for_itself_are_dropped_at_the_next_start(
    db: Database, fresh_db_url: str
) -> None:
    """A start that died (kill -9) revoked nothing: the next one drops its embedded
    worker's and its demo's tokens, and keeps the configured ones."""
    left = {source: tokens.new_token() for source in (EMBEDDED_WORKER, SESSION)}
    role = {EMBEDDED_WORKER: "worker", SESSION: "admin"}
    for source, token in left.items():
        tokens.store(db, tokens.hash_token(token), role[source], source)  # type: ignore[arg-type]
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    with TestClient(create_app(settings, db)) as c:
        assert {source for _, _, source in stored_tokens(db)} == {"settings"}
        assert c.get("/v1/jobs", headers=bearer(left[SESSION])).status_code == 401
        r = c.post("/v1/workers", json={"name": "w"}, headers=bearer(left[EMBEDDED_WORKER]))
        assert r.status_code == 401


# `backfill demo --keep-running` itself, its demo replaced by one that only holds its
# token and serves on until it is stopped (the real one needs a worker and Spark)
DEMO_HELD_OPEN = """
import asyncio
import os
import sys
from pathlib import Path

import service.demo


async def held_open(base_url, *, token=None, keep_running=False):
    assert keep_running and token
    Path(os.environ["DEMO_HOLDING"]).touch()  # the token is issued and stored
    await asyncio.Event().wait()  # as the demo does once it has shown its token


service.demo.run_demo = held_open
from service.cli import main

sys.exit(main(sys.argv[1:]))
"""


def stored_in_embedded(data_dir: Path) -> list[tuple[str, str, str]]:
    """The tokens stored in the embedded Postgres of ``data_dir`` (started to read them)."""
    server = EmbeddedPostgres(data_dir)
    database = Database(server.start())
    try:
        return stored_tokens(database)
    finally:
        database.close()
        server.stop()


@pytest.mark.parametrize(
    ("stop", "postgres"),
    [(signal.SIGTERM, "external"), (signal.SIGINT, "embedded")],
    ids=["sigterm_external_postgres", "ctrl_c_embedded_postgres"],
)
def test_backfill_demo_keep_running_revokes_its_tokens_when_stopped(
    db: Database, fresh_db_url: str, tmp_path: Path, stop: signal.Signals, postgres: str
) -> None:
    """Stopped as a container is (SIGTERM), or as ``make demo`` is (Ctrl-C, on the
    embedded Postgres, which the shutdown stops), no token the start issued for itself
    stays valid: neither the demo's nor the embedded worker's."""
    script, holding = tmp_path / "demo_held_open.py", tmp_path / "holding"
    script.write_text(DEMO_HELD_OPEN)
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "BACKFILL_DATABASE_URL")
    }
    env |= {
        "DEMO_HOLDING": str(holding),
        "BACKFILL_LOG_LEVEL": "warning",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    args = [sys.executable, str(script), "demo", "--port", "0", "--keep-running"]
    if postgres == "external":
        env["DATABASE_URL"] = fresh_db_url
    else:
        args += ["--data-dir", str(tmp_path / "data")]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def holding_its_token() -> bool:
            assert proc.poll() is None, "the demo ended by itself"
            return holding.exists()

        wait_for(holding_its_token, timeout=120, what="the demo holding its token")
        if postgres == "external":
            assert any(source == SESSION for _, _, source in stored_tokens(db))
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stored = stored_tokens(db) if postgres == "external" else stored_in_embedded(tmp_path / "data")
    assert {source for _, _, source in stored} <= {"settings"}, err.decode()[-3000:]
