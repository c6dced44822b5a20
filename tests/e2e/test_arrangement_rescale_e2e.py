"""End to end (issue 30, item 1): a rescale after some arrangement actors finished keeps
the view exact.

A skewed table (the last actor's vnodes hold almost every row) and a rate limit make
three of four actors finish long before the fourth. ``parallelism: 1`` then deals their
completed vnodes to one actor next to the unfinished ones, while a writer deletes rows
of the completed vnodes and moves rows of them out of the view's filter. Such an actor
must never read a completed vnode again: a read of one made it unfinished at the last
key read, and a delete above that key was dropped for ever (the view kept the row).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backfill_core.schema import ColumnType
from backfill_core.vnode import even_split, vnode_hasher
from service.db import Database
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.e2e import assert_exact, running_cluster, wait_created, wait_for

VNODES = 256
FIRST_PARALLELISM = 4
# the last actor's share (placement deals even_split ranges): the rows it alone holds
HEAVY_VNODES = frozenset(even_split(VNODES, FIRST_PARALLELISM)[-1])
LIGHT_VNODES = frozenset(range(VNODES)) - HEAVY_VNODES
HEAVY_ROWS = 30_000
LIGHT_ROWS_PER_VNODE = 4
# rows written into the finished actors' vnodes before the rescale: a few dozen per
# vnode, more than one rate-limited read of the rescaled actor takes from one vnode
LIGHT_INSERTS = 6_000
RATE_LIMIT = 1_000  # rows/s per actor: the heavy actor needs ~30 s, the light ones < 1 s
THRESHOLD = 50  # the view's filter: amount >= THRESHOLD
WRITES_AFTER_RESCALE = 40  # writer batches once the rescaled actor runs

vnode_of = vnode_hasher([ColumnType.BIGINT], VNODES)


def keys_in(vnodes: frozenset[int], count: int, start: int) -> list[int]:
    """The first ``count`` keys from ``start`` on whose vnode is in ``vnodes``."""
    out: list[int] = []
    k = start
    while len(out) < count:
        if vnode_of((k,)) in vnodes:
            out.append(k)
        k += 1
    return out


def skewed_keys() -> tuple[list[int], list[int]]:
    """``HEAVY_ROWS`` keys in the heavy vnodes, ``LIGHT_ROWS_PER_VNODE`` in every light one."""
    heavy: list[int] = []
    light: list[int] = []
    per_vnode = dict.fromkeys(LIGHT_VNODES, 0)
    k = 0
    while len(heavy) < HEAVY_ROWS or len(light) < LIGHT_ROWS_PER_VNODE * len(LIGHT_VNODES):
        v = vnode_of((k,))
        if v in HEAVY_VNODES:
            if len(heavy) < HEAVY_ROWS:
                heavy.append(k)
        elif per_vnode[v] < LIGHT_ROWS_PER_VNODE:
            per_vnode[v] += 1
            light.append(k)
        k += 1
    return heavy, light


def insert(http: httpx.Client, rows: list[dict[str, Any]]) -> None:
    for lo in range(0, len(rows), 5_000):
        ops = [{"op": "insert", "row": r} for r in rows[lo : lo + 5_000]]
        r = http.post("/v1/tables/orders/dml", params={"wait": "true"}, json={"ops": ops})
        assert r.status_code == 200, r.text


class LightWriter:
    """Deletes rows of the light (finished) vnodes, moves some out of the filter and
    some back in, and inserts new ones there, batch after batch until stopped."""

    def __init__(self, http: httpx.Client, live: list[int], next_key: int, seed: int) -> None:
        self.http, self.rng = http, random.Random(seed)
        self.live = list(live)
        self.next_key = next_key
        self.batches = self.deletes = self.moved_out = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> LightWriter:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def run(self) -> None:
        while not self.stop.is_set():
            self._write_batch()

    def _write_batch(self) -> None:
        touched = self.rng.sample(self.live, 20)
        gone = set(touched[:8])
        ops: list[dict[str, Any]] = [{"op": "delete", "row": {"id": k}} for k in touched[:8]]
        ops += [
            {"op": "update", "row": {"id": k, "amount": self.rng.randrange(THRESHOLD)}}
            for k in touched[8:16]
        ]
        ops += [
            {"op": "update", "row": {"id": k, "amount": self.rng.randrange(THRESHOLD, 100)}}
            for k in touched[16:]
        ]
        fresh = keys_in(LIGHT_VNODES, 4, self.next_key)
        self.next_key = fresh[-1] + 1
        ops += [{"op": "insert", "row": {"id": k, "amount": 75, "note": "new"}} for k in fresh]
        r = self.http.post("/v1/tables/orders/dml", json={"ops": ops})
        assert r.status_code == 200, r.text
        self.live = [k for k in self.live if k not in gone] + fresh
        self.batches += 1
        self.deletes += 8
        self.moved_out += 8


def all_rows(http: httpx.Client, table: str, epoch: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"epoch": epoch, "limit": 1000}
        if after is not None:
            params["after"] = after
        page = http.get(f"/v1/tables/{table}/rows", params=params).json()
        rows += page["rows"]
        after = page["next"]
        if after is None:
            return rows


@pytest.fixture
def driver_cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    # no Spark: every read runs on the driver under the rate limit, and no JVM starts
    with running_cluster(db, fresh_db_url, WorkerSettings(spark_mode="never")) as c:
        yield c


def test_rescale_after_some_actors_finished_keeps_deletes_and_filter_moves(
    driver_cluster: tuple[httpx.Client, Worker],
) -> None:
    http, _ = driver_cluster
    r = http.post(
        "/v1/tables",
        json={
            "name": "orders",
            "columns": [
                {"name": "id", "type": "bigint"},
                {"name": "amount", "type": "int"},
                {"name": "note", "type": "text"},
            ],
            "primary_key": ["id"],
            "vnode_count": VNODES,
        },
    )
    assert r.status_code == 201, r.text
    heavy, light = skewed_keys()
    insert(http, [{"id": k, "amount": k % 100, "note": "heavy"} for k in heavy])
    insert(http, [{"id": k, "amount": THRESHOLD + k % 50, "note": "light"} for k in light])

    r = http.post(
        "/v1/jobs",
        json={
            "name": "big_orders",
            "upstream": {"table": "orders"},
            "columns": ["id", "amount"],
            "filter": {"col": "amount", "op": ">=", "value": THRESHOLD},
            "backfill": "arrangement",
            "parallelism": FIRST_PARALLELISM,
            "rate_limit": RATE_LIMIT,
        },
    )
    assert r.status_code == 202, r.text
    job = int(r.json()["id"])

    def completed() -> set[int]:
        vnodes = http.get(f"/v1/jobs/{job}/progress").json()["vnodes"]
        return {v["vnode"] for v in vnodes if v["state"] == "completed"}

    # an actor completes its vnodes together: the three light actors finished, the
    # heavy one (~30 s of reads) has not
    wait_for(lambda: completed() == LIGHT_VNODES, timeout=60, what="the light actors finished")

    # rows the finished actors forward into the view, which the rescaled actor must
    # neither read again nor lose the deletes of
    fresh = keys_in(LIGHT_VNODES, LIGHT_INSERTS, 1_000_000)
    insert(http, [{"id": k, "amount": THRESHOLD + k % 50, "note": "late"} for k in fresh])

    with LightWriter(http, light + fresh, fresh[-1] + 1, seed=30) as writer:
        wait_for(lambda: writer.batches >= 5, what="writes before the rescale")
        before = http.get(f"/v1/jobs/{job}").json()
        assert before["state"] == "creating"
        r = http.patch(f"/v1/jobs/{job}", json={"parallelism": 1})
        assert r.status_code == 200 and r.json()["parallelism"] == 1, r.text
        # the rescale's recovery ran, and its initial barrier committed: one actor reads
        recovered = wait_for(
            lambda: (
                (j := http.get(f"/v1/jobs/{job}").json())["recoveries"] > before["recoveries"]
                and not j["recovering"]
                and j
            ),
            what="the rescale's recovery",
        )
        wait_for(
            lambda: (
                int(http.get(f"/v1/jobs/{job}").json()["committed_epoch"])
                > int(recovered["committed_epoch"])
            ),
            what="the rescaled actor's first barrier committed",
        )
        after_rescale = writer.batches
        wait_for(
            lambda: writer.batches >= after_rescale + WRITES_AFTER_RESCALE,
            what="deletes and moves out of the filter after the rescale",
        )
        progress = http.get(f"/v1/jobs/{job}/progress").json()
        assert progress["state"] == "creating", "the rescale came after the backfill's end"
        assert {v["vnode"] for v in progress["vnodes"] if v["state"] != "completed"}, progress
        r = http.patch(f"/v1/jobs/{job}", json={"rate_limit": None})
        assert r.status_code == 200, r.text
        wait_created(http, job)
        assert_exact(http, job)
    assert writer.deletes > 0 and writer.moved_out > 0

    # the view against the upstream read directly, at one epoch
    v = http.get(f"/v1/jobs/{job}/verify").json()
    assert v["equal"], v
    mv = http.get(f"/v1/jobs/{job}").json()["mv_table"]
    upstream = all_rows(http, "orders", int(v["epoch"]))
    expected = {(int(r["id"]), int(r["amount"])) for r in upstream if r["amount"] >= THRESHOLD}
    actual = {(int(r["id"]), int(r["amount"])) for r in all_rows(http, mv, int(v["epoch"]))}
    stale = sorted(actual - expected)
    assert not stale and actual == expected, f"rows the upstream no longer has: {stale[:10]}"
    assert len(expected) > HEAVY_ROWS // 2
