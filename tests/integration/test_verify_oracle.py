"""The exactness oracle itself: ``GET /v1/jobs/{id}/verify`` answers ``equal: false``
for every way a view can be wrong (a row missing, one too many, a stale value, a row
the filter excludes), names the rows, and ``equal: true`` only for the exact view.
Every end-to-end and chaos exactness check trusts it (issue 39)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fastapi.testclient import TestClient

from backfill_core.changes import Version
from service.catalog.models import Job, Relation
from service.catalog.queries import storage_of
from service.db import Database, raw_cursor
from tests.integration.test_tables_api import create, dml, ins

# the view: id and amount of the orders with amount >= 2
VIEW = {
    "name": "big",
    "upstream": {"table": "orders"},
    "backfill": "arrangement",
    "columns": ["id", "amount"],
    "filter": {"col": "amount", "op": ">=", "value": 2},
}


def _write_mv(db: Database, job_id: int, epoch: int, versions: list[Version]) -> None:
    """Write versions straight into the MV's storage, as a faulty executor would."""
    with db.transaction() as s:
        job = s.get(Job, job_id)
        assert job is not None
        mv = s.get(Relation, job.mv_relation_id)
        assert mv is not None
        storage_of(mv).write(raw_cursor(s), epoch, versions)


def _verify(client: TestClient, job: int, epoch: int) -> dict[str, Any]:
    r = client.get(f"/v1/jobs/{job}/verify", params={"epoch": epoch})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_verify_tells_a_wrong_view_from_the_right_one(client: TestClient, db: Database) -> None:
    create(client)
    amounts = {i: Decimal(i % 4) for i in range(8)}  # 2, 3, 6 and 7 pass the filter
    e1 = int(dml(client, [ins(i, amount=str(a)) for i, a in amounts.items()]).json()["epoch"])
    e2 = int(dml(client, [{"op": "delete", "row": {"id": 3}}]).json()["epoch"])
    job = client.post("/v1/jobs", json=VIEW).json()["id"]  # no worker: the MV stays empty
    exact = [(i, a) for i, a in amounts.items() if a >= 2]

    empty = _verify(client, job, e1)
    assert not empty["equal"] and empty["mv_rows"] == 0 and empty["expected_rows"] == 4
    assert sorted(r["id"] for r in empty["missing"]) == [2, 3, 6, 7]

    _write_mv(db, job, e1, [Version(r) for r in exact])
    right = _verify(client, job, e1)
    assert right["equal"] and right["mv_rows"] == 4 and not right["missing"]
    assert not right["unexpected"]

    # one row too many: a row the filter excludes (amount 1 < 2)
    _write_mv(db, job, e1, [Version((1, Decimal(1)))])
    extra = _verify(client, job, e1)
    assert not extra["equal"] and [r["id"] for r in extra["unexpected"]] == [1]
    assert not extra["missing"]

    # a row missing: deleted from the view but not from the upstream
    _write_mv(db, job, e1, [Version((1, Decimal(1)), deleted=True), Version((6, 2), deleted=True)])
    missing = _verify(client, job, e1)
    assert not missing["equal"] and [r["id"] for r in missing["missing"]] == [6]
    assert not missing["unexpected"] and missing["mv_rows"] == 3

    # a stale value: the row is there with another amount
    _write_mv(db, job, e1, [Version((6, Decimal(99)))])
    stale = _verify(client, job, e1)
    assert not stale["equal"]
    assert [r["id"] for r in stale["missing"]] == [6] == [r["id"] for r in stale["unexpected"]]

    # a row the upstream deleted after the view was built, still in the view
    _write_mv(db, job, e2, [Version((6, Decimal(2)))])
    deleted = _verify(client, job, e2)
    assert not deleted["equal"] and [r["id"] for r in deleted["unexpected"]] == [3]
    _write_mv(db, job, e2, [Version((3, Decimal(3)), deleted=True)])
    assert _verify(client, job, e2)["equal"]
    assert not _verify(client, job, e1)["equal"]  # e1 still has the stale amount of id 6
