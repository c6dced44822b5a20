"""The progress model (maintained at commits) and conditional reads for pollers."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import text

from service.catalog.models import MAIN_GRAPH_ID, Relation
from service.catalog.queries import add_row_count_delta, fold_row_counts, table_row_count
from service.db import Database
from tests.kit.meta import FakeWorker, make_job


def _collect(w: FakeWorker, rows_of: Any) -> None:
    for a in w.poll():
        vnodes = [v for lo, hi in a["vnodes"] for v in range(lo, hi)]
        for b in a["barriers"]:
            progress = {
                "vnodes": [
                    {
                        "vnode": v,
                        "state": "in_progress",
                        "current_pos": [v],
                        "row_count": rows_of(b),
                    }
                    for v in vnodes
                ]
            }
            r = w.collect(a["actor_id"], b, progress=progress)
            assert r.status_code == 200, r.text


def test_rows_never_go_back_and_a_rate_and_eta_appear(client: TestClient, db: Database) -> None:
    job = make_job(db, "p", 2)
    w = FakeWorker(client).register()
    step = [0]

    def growing(_: dict[str, Any]) -> int:
        step[0] += 1
        return step[0]

    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while True:  # the rate needs a window of 5 s of epoch time
        _collect(w, growing)
        p = client.get(f"/v1/jobs/{job}/progress").json()
        seen.append(p)
        if p["rows_per_s"] > 0:
            break
        assert time.monotonic() < deadline, "no rate after 60 s"
    assert p["percent"] <= 99.99 and p["phase"] == "backfilling"
    rows = [s["rows"] for s in seen]
    assert rows == sorted(rows)
    top = rows[-1]
    # a restarted backfill (a chain after recovery) reports less: shown rows stay put
    for _ in range(2):  # each round collects every pending barrier
        _collect(w, lambda b: 0)
    again = client.get(f"/v1/jobs/{job}/progress").json()
    assert again["rows"] >= top


def test_job_and_progress_reads_answer_304_while_unchanged(
    client: TestClient, db: Database
) -> None:
    job = make_job(db, "q", 1)
    # no worker runs the job: the meta puts its graph into recovery at some point, a real
    # change of the view; a 200 must carry such a change, a 304 comes once it settles
    etag = _settled_etag(client, f"/v1/jobs/{job}")
    assert client.post(f"/v1/jobs/{job}/pause").status_code == 200
    changed = client.get(f"/v1/jobs/{job}", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.json()["paused"] is True
    assert changed.headers["etag"] != etag
    p = client.get(f"/v1/jobs/{job}/progress")
    assert p.status_code == 200 and p.json()["rows"] == 0
    unchanged = client.get(f"/v1/jobs/{job}/progress", headers={"If-None-Match": p.headers["etag"]})
    assert unchanged.status_code == 304  # no worker: only the committed epoch moves
    assert client.get(f"/v1/jobs/{job}", headers={"If-None-Match": "*"}).status_code == 304


def test_metrics_carry_each_job(client: TestClient, db: Database) -> None:
    job = make_job(db, "m", 1)
    assert client.post(f"/v1/jobs/{job}/pause").status_code == 200
    text = client.get("/metrics").text
    labels = f'job_id="{job}",kind="arrangement",name="m"'
    assert f"backfill_job_paused{{{labels}}} 1.0" in text
    assert f'backfill_job_state{{{labels},state="creating"}} 1.0' in text
    assert f"backfill_job_rows_total{{{labels}}} 0.0" in text
    assert "backfill_barrier_latency_seconds" in text  # the meta's own metrics stay


def _sample(text: str, prefix: str) -> float:
    line = next((x for x in text.splitlines() if x.startswith(prefix)), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


def test_http_requests_are_counted_per_route_template(client: TestClient, db: Database) -> None:
    job = make_job(db, "h", 1)
    ok = 'backfill_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="200"}'
    missing = 'backfill_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="404"}'
    before = client.get("/metrics").text  # counters are per process: compare deltas
    for _ in range(3):
        assert client.get(f"/v1/jobs/{job}").status_code == 200
    assert client.get("/v1/jobs/999999").status_code == 404
    after = client.get("/metrics").text
    assert _sample(after, ok) - _sample(before, ok) == 3
    assert _sample(after, missing) - _sample(before, missing) == 1
    assert f"/v1/jobs/{job}" not in after  # ids never become labels
    assert "backfill_http_request_seconds_bucket" in after


def test_job_list_pages_newest_first_with_a_stable_cursor(client: TestClient, db: Database) -> None:
    ids = [make_job(db, f"l{i}", 1) for i in range(5)]
    seen: list[int] = []
    after = None
    while True:
        params: dict[str, Any] = {"order": "desc", "limit": 2}
        if after is not None:
            params["after"] = after
        page = client.get("/v1/jobs", params=params)
        assert page.status_code == 200
        seen += [j["id"] for j in page.json()["jobs"]]
        after = page.json()["next"]
        if after is None:
            break
    assert seen == sorted(ids, reverse=True)
    first = client.get("/v1/jobs")
    assert [j["id"] for j in first.json()["jobs"]] == ids
    again = client.get("/v1/jobs", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304  # the committed epoch moved, nothing else did
    assert client.get("/v1/jobs", params={"order": "sideways"}).status_code == 422


def _settled_etag(client: TestClient, url: str) -> str:
    """Read until a conditional read answers 304; every 200 before must show a change."""
    deadline = time.monotonic() + 30
    first = client.get(url)
    while True:
        etag = first.headers["etag"]
        again = client.get(url, headers={"If-None-Match": etag})
        if again.status_code == 304:
            assert again.headers["etag"] == etag and again.content == b""
            return etag
        assert again.status_code == 200 and again.headers["etag"] != etag
        a, b = first.json(), again.json()
        a.pop("committed_epoch"), b.pop("committed_epoch")
        assert a != b, "a 200 for an unchanged view"
        assert time.monotonic() < deadline, "the view never settled"
        first = again


def test_the_total_is_fixed_when_the_job_starts(client: TestClient, db: Database) -> None:
    """The upstream growing afterwards does not move the total (the percent never dips)."""
    table = {
        "name": "grows",
        "columns": [{"name": "id", "type": "bigint"}],
        "primary_key": ["id"],
    }
    assert client.post("/v1/tables", json=table).status_code == 201

    def insert(lo: int, hi: int) -> None:
        ops = [{"op": "insert", "row": {"id": i}} for i in range(lo, hi)]
        assert client.post("/v1/tables/grows/dml", json={"ops": ops}).status_code == 200
        with db.engine.begin() as conn:
            conn.execute(text("ANALYZE"))

    insert(0, 1_000)
    body = {"name": "g", "upstream": {"table": "grows"}, "backfill": "arrangement"}
    job = client.post("/v1/jobs", json=body | {"rate_limit": 0}).json()["id"]
    total = client.get(f"/v1/jobs/{job}/progress").json()["total_estimate"]
    assert total == 1_000
    insert(1_000, 5_000)
    assert client.get(f"/v1/jobs/{job}/progress").json()["total_estimate"] == total


def test_the_total_is_the_upstreams_exact_row_count(client: TestClient, db: Database) -> None:
    """Right after a load, without ANALYZE (the planner's estimate is then far off), the
    total is the table's committed row count: inserts, deletes, updates and a key
    inserted and deleted in one batch counted exactly."""
    table = {
        "name": "fresh",
        "columns": [{"name": "id", "type": "bigint"}, {"name": "v", "type": "bigint"}],
        "primary_key": ["id"],
    }
    assert client.post("/v1/tables", json=table).status_code == 201

    def dml(ops: list[dict[str, Any]]) -> None:
        r = client.post("/v1/tables/fresh/dml", json={"ops": ops}, params={"wait": "true"})
        assert r.status_code == 200, r.text

    dml([{"op": "insert", "row": {"id": i, "v": 0}} for i in range(3_000)])
    dml([{"op": "delete", "row": {"id": i}} for i in range(0, 3_000, 10)])
    dml([{"op": "update", "row": {"id": i, "v": 1}} for i in range(1, 3_000, 10)])
    dml(
        [
            {"op": "insert", "row": {"id": 5_000, "v": 0}},
            {"op": "delete", "row": {"id": 5_000}},
            {"op": "insert", "row": {"id": 5_001, "v": 0}},
            {"op": "delete", "row": {"id": 1}},
        ]
    )
    exact = 3_000 - 300 + 1 - 1
    for kind in ("arrangement", "snapshot"):
        body = {"name": f"f_{kind}", "upstream": {"table": "fresh"}, "backfill": kind}
        r = client.post("/v1/jobs", json=body | {"rate_limit": 0})
        assert r.status_code == 202, r.text
        p = client.get(f"/v1/jobs/{r.json()['id']}/progress").json()
        assert p["total_estimate"] == exact, p


def test_gc_folds_row_count_deltas_keeping_every_sum(db: Database) -> None:
    with db.transaction() as s:
        rel = Relation(name="counted", kind="table", schema={}, storage_table="counted")
        rel.graph_id = MAIN_GRAPH_ID
        s.add(rel)
        s.flush()
        for epoch, delta in [(10, 5), (20, -2), (20, 4), (30, 1), (40, -3)]:
            add_row_count_delta(s, rel.id, epoch, delta)
        add_row_count_delta(s, rel.id, 50, 0)  # nothing written for a batch that nets 0
        sums = {e: table_row_count(s, rel.id, e) for e in (5, 10, 20, 30, 40, 50)}
        assert sums == {5: 0, 10: 5, 20: 7, 30: 8, 40: 5, 50: 5}
        fold_row_counts(s, rel.id, 30)
        assert {e: table_row_count(s, rel.id, e) for e in (30, 40, 50)} == {30: 8, 40: 5, 50: 5}
        n = s.execute(
            text("SELECT count(*) FROM row_count_deltas WHERE relation_id = :r"), {"r": rel.id}
        ).scalar_one()
        assert n == 2  # one for everything at or below 30, and 40's


def test_a_lone_read_runs_outside_a_transaction_and_leaves_pooled_connections_as_they_were(
    db: Database,
) -> None:
    """Progress reads run alone (no BEGIN, no ROLLBACK): the statement's own transaction
    starts with it. Connections the pool hands out afterwards are transactional again."""
    alone = db.first_alone(text("SELECT now() = statement_timestamp() AS own, :x AS x"), {"x": 7})
    assert alone is not None and alone.own and alone.x == 7
    with db.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        assert not conn.execute(text("SELECT now() = statement_timestamp()")).scalar()
